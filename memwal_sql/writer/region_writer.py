"""RegionWriter: the single writer of one region.

Opening a writer claims the region (a new manifest version with the next writer epoch), puts a
fence sentinel at the WAL tail so the previous writer's next put fails, and replays the WAL after
the last flushed generation into the MemTable (docs/durability.md, "Claims"). Each
``upsert``/``delete`` is validated, appended to the MemTable (visible at once to readers in
this process) and to the WAL; in durable mode the call returns only once a WAL entry holding it
is stored. Full MemTables are frozen and flushed to
generations by a background thread, each flush ending in an epoch-checked manifest commit.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import (
    CommitConflictError,
    CorruptWalEntryError,
    InvalidInputError,
    MemWalError,
    ObjectExistsError,
    ObjectNotFoundError,
    SchemaMismatchError,
    StorageError,
    StorageUnavailableError,
    TornWalEntryWarning,
    WriterClosedError,
    WriterFencedError,
    WrongRegionError,
)
from memwal_sql.formats.maintained_indexes import MaintainedIndex
from memwal_sql.formats.region_manifest import RegionManifestStore, claim_region, commit_change
from memwal_sql.formats.wal import (
    RECOVERY_LOOKS,
    WalEntry,
    WalRun,
    conform_batch,
    decode_wal_entry,
    decode_wal_runs,
    encode_fence_sentinel,
    iter_wal,
    missing_wal_entry,
    only_sentinels_after,
    put_back_set_aside,
    read_wal_position,
    set_aside_torn_entry,
    wal_positions,
)
from memwal_sql.partitioning.region_spec import RegionSpec
from memwal_sql.storage import ObjectStore, layout
from memwal_sql.structures.cache import Caches
from memwal_sql.writer.config import WriterConfig
from memwal_sql.writer.flush import write_generation
from memwal_sql.writer.memtable import MemTable, flushed, latest_per_key_in_key_order
from memwal_sql.writer.rows import Keys, RowCoercer, WriteData, WriteKind
from memwal_sql.writer.wal_writer import WalWriter

_FLUSH_ATTEMPTS = 3
# Races a claim may lose for a WAL position before it gives up; each leaps twice as far ahead.
MAX_SENTINEL_RACES = 16
SENTINEL_PUT_ATTEMPTS = 5  # a sentinel's put, retried on store errors
_OPEN_WRITERS: weakref.WeakSet[RegionWriter] = weakref.WeakSet()
_log = logging.getLogger(__name__)

# How long a flush() or close() waits for a MemTable flush before it logs a warning (and
# again after each such wait).
_SLOW_FLUSH_SECONDS = 60.0


@atexit.register
def _release_open_writers() -> None:
    # A writer left open at interpreter exit: its flush thread may be inside Lance's native code
    # when Python finalizes, which crashes the process. Stop the threads first.
    for writer in list(_OPEN_WRITERS):
        writer.release()


@dataclass(frozen=True)
class TableLayout:
    """What a region writer needs to know about its table."""

    store: ObjectStore
    base_schema: pa.Schema
    primary_key: tuple[str, ...]
    region_spec: RegionSpec | None
    data_storage_version: str
    caches: Caches
    """The table's caches: the MemTables' in-memory indexes live in ``caches.memtable``."""
    written: dict[str, list[int]] = field(default_factory=dict)
    """WAL entries and rows put by the table's writers, per region: ``[entries, rows]``
    (plain counters, read by ``tbl.metrics()``; they outlive the writers)."""
    merged_generations: Callable[[], Mapping[str, int]] = dict
    """The newest generation of each region merged into the base table (the MemWAL index)."""
    maintained_indexes: Callable[[], Sequence[MaintainedIndex]] = tuple
    """The indexes each flushed generation builds (the MemWAL index's maintained indexes)."""
    sequence_column: str | None = None
    """The table's sequence column: only the table's routed writes, which drop writes older
    than a key's current sequence, may write such a table."""
    field_ids: tuple[int, ...] | None = None
    """The base's field ids of ``base_schema``'s columns, which generations must carry for
    Lance's reader (it matches their columns by id); None when they are the positions."""


@dataclass
class WriterStats:
    """Counters of one region writer (see :meth:`RegionWriter.stats`)."""

    upserts: int = 0
    deletes: int = 0
    rows_written: int = 0
    replayed_entries: int = 0
    replayed_rows: int = 0
    claim_seconds: dict[str, float] = field(default_factory=dict)
    """Where the claim's time went: manifest, fence, replay, sync, commit, total."""
    claim_synced_entries: int = 0
    torn_entries_set_aside: int = 0
    memtable_flushes: int = 0
    flushed_rows: int = 0
    flush_seconds: float = 0.0
    backpressure_waits: int = 0
    backpressure_seconds: float = 0.0
    generations: list[int] = field(default_factory=list)


class RegionWriter:
    """The writer of one region; use it as a context manager.

    Example:
        >>> import memwal_sql as mw, pyarrow as pa, tempfile
        >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.schema([pa.field("id", pa.int64(), False),
        ...                       ("v", pa.string())]), primary_key="id")
        >>> with tbl.writer() as w:
        ...     w.upsert({"id": [1, 2], "v": ["a", "b"]})
        ...     w.delete([2])
        >>> w.stats()["rows_written"]
        3
    """

    def __init__(
        self,
        table: TableLayout,
        region_id: str,
        *,
        region_values: tuple[Any, ...] | None = None,
        config: WriterConfig | None = None,
    ) -> None:
        self._table = table
        self.config = config or WriterConfig()
        self._store = table.store
        self._rows = RowCoercer(table.base_schema, table.primary_key)
        self._region_values = region_values
        self._manifests = RegionManifestStore(table.store, region_id)
        self.region_id = self._manifests.region_id
        # Entered as ``with self._mutex`` (a Condition's own ``with`` is a Python-level call on
        # every write); ``self._lock`` waits and notifies.
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._stats = WriterStats()
        self._written = table.written.setdefault(self.region_id, [0, 0])
        self._closed = False
        self._releasing = False
        self._error: BaseException | None = None
        self._frozen: deque[MemTable] = deque()
        self._frozen_bytes = 0

        field_entries = None
        if table.region_spec is not None and region_values is not None:
            field_entries = table.region_spec.field_entries(region_values)
        claim_started = time.perf_counter()
        with self._timed("manifest"):
            manifest = claim_region(
                self._manifests,
                region_spec_id=table.region_spec.spec_id if table.region_spec else 0,
                field_entries=field_entries,
                merged_generation=table.merged_generations().get(self.region_id, 0),
            )
        self.epoch = manifest.writer_epoch
        if region_values is None and table.region_spec is not None:
            # A region opened by id still only takes its own rows.
            self._region_values = table.region_spec.values_from_entries(
                [(e.field_id, e.value) for e in manifest.region_field_entries]
            )
        spec = table.region_spec
        # Whether rows can belong elsewhere (not when one unsharded region takes every row).
        self._region_is_a_subset = (
            spec is not None
            and self._region_values is not None
            and not all(f.transform == "unsharded" for f in spec.fields)
        )
        self._active = MemTable(self._rows.schema, manifest.current_generation)
        self._replay_floor = self._replay_and_fence(manifest)
        for prefix in (layout.wal_dir(self.region_id), layout.manifest_dir(self.region_id)):
            table.store.remove_temp_files(prefix)  # left by puts that a crash interrupted

        self._wal = WalWriter(
            table.store,
            self.region_id,
            self._rows.schema,
            writer_epoch=self.epoch,
            next_position=self._replay_floor + 1,
            on_entry_written=self._entry_written,
            max_buffer_bytes=self.config.max_wal_buffer_size,
            max_buffer_batches=self.config.max_wal_buffer_batches,
            max_flush_interval=self.config.max_wal_flush_interval,
            background=not self.config.durable_write,
        )
        self._memtables_by_gen = {self._active.generation: self._active}
        self._flush_thread = threading.Thread(
            target=self._flush_loop, name=f"memwal-flush-{self.region_id[:8]}", daemon=True
        )
        self._flush_thread.start()
        _OPEN_WRITERS.add(self)
        self._stats.claim_seconds["total"] = time.perf_counter() - claim_started
        _log.info(
            "claimed region %s of %s at epoch %d (generation %d, %d WAL entries replayed)",
            self.region_id,
            table.store.uri,
            self.epoch,
            self._active.generation,
            self._stats.replayed_entries,
        )

    # ---- public API -------------------------------------------------------------------------

    def upsert(self, data: WriteData) -> None:
        """Insert or replace rows (a pa.Table, RecordBatch, RecordBatchReader, pandas, dict).

        Raises:
            SchemaMismatchError, PrimaryKeyError: the rows do not fit the table; nothing written.
            WrongRegionError: a row belongs to another region.
            WriterFencedError: a newer writer claimed the region.
            WriterClosedError: the writer was closed.
        """
        self._refuse_sequenced()
        self.wait_durable(self.append_rows(self._prepare_upserts(data), "upserts"))

    def _refuse_sequenced(self) -> None:
        column = self._table.sequence_column
        if column is not None:
            raise InvalidInputError(
                f"this table orders each key's writes by its sequence column {column!r}, and a "
                "region writer writes in arrival order: write with tbl.upsert, tbl.update and "
                "tbl.delete, which drop writes older than a key's current sequence"
            )

    def _prepare_upserts(self, data: WriteData) -> pa.RecordBatch:
        """Validate upserts into WAL-schema rows; raises before anything is written."""
        rows = self._rows.upserts(data)
        self._check_region(rows)
        return rows

    def _prepare_deletes(self, keys: Keys) -> pa.RecordBatch:
        """Tombstones for ``keys``, checked to belong to this region: a tombstone in another
        region would hide the key from scans but not from lookups pruned to its region."""
        rows, routing = self._rows.deletes_for_regions(
            keys, self._table.region_spec if self._region_values is not None else None
        )
        self._check_region(routing)
        return rows

    def delete(self, keys: Keys) -> None:
        """Delete rows by primary key: a table of key columns, or an array of keys.

        Example:
            ``w.delete(pa.table({"id": [1, 2]}))`` or ``w.delete([1, 2])``
        """
        self._refuse_sequenced()
        self.wait_durable(self.append_rows(self._prepare_deletes(keys), "deletes"))

    def flush(self) -> None:
        """Freeze the MemTable, flush every frozen MemTable to a generation and wait."""
        with self._mutex:
            self._check_open()
            self._freeze_locked()
            target = self._frozen[-1].generation if self._frozen else None
        if target is not None:
            self._wait_flushed(target)

    def sync_wal(self) -> None:
        """Store every write appended so far in the WAL and wait: what a non-durable writer
        still buffers, so a pinned snapshot taken next holds every acknowledged write.

        Example:
            ``w.upsert(rows); w.sync_wal()``
        """
        with self._mutex:
            self._check_open()
        self._wal.flush()

    def close(self) -> None:
        """Flush the MemTable to a generation, wait, and release the writer. Idempotent."""
        with self._mutex:
            if self._closed:
                return
        try:
            if self._error is None:
                self.flush()
        finally:
            with self._mutex:
                self._closed = True
                self._lock.notify_all()
            self._flush_thread.join()
            self._wal.close()  # after a WAL failure, only stops its threads
            _OPEN_WRITERS.discard(self)
        if self._error is not None:
            raise self._error

    def release(self) -> None:
        """Store buffered WAL writes and stop the threads, without flushing MemTables: what is
        not in a generation is in the WAL, and the next writer of the region replays it. What a
        dying process does (at interpreter exit), and what a table does with a writer that was
        fenced or failed. Idempotent; :meth:`close` flushes instead.

        Example:
            ``w.upsert(rows); w.release()  # the rows stay in the WAL for the next writer``
        """
        with self._mutex:
            if self._closed:
                return
            self._closed = self._releasing = True
            self._lock.notify_all()
        self._flush_thread.join()  # returns once the flush in progress (if any) is committed
        try:
            self._wal.close()
        except MemWalError:
            pass  # a fenced or failed WAL: the writes it holds were never acknowledged

    def stats(self) -> dict[str, Any]:
        """Counters and current sizes, e.g. ``w.stats()["rows_written"]``."""
        with self._mutex:
            frozen = list(self._frozen)
            out = dict(self._stats.__dict__)
            out.update(
                region_id=self.region_id,
                writer_epoch=self.epoch,
                generation=self._active.generation,
                memtable_rows=self._active.num_rows,
                memtable_bytes=self._active.nbytes,
                frozen_memtables=len(frozen),
                frozen_bytes=sum(m.nbytes for m in frozen),
                wal_entries_written=self._wal.entries_written,
                wal_bytes_written=self._wal.bytes_written,
                wal_put_seconds=self._wal.put_seconds,
                next_wal_position=self._wal.next_position,
            )
            out["generations"] = list(self._stats.generations)
            out["claim_seconds"] = dict(self._stats.claim_seconds)
        return out

    @property
    def wal_schema(self) -> pa.Schema:
        """The schema of the rows this writer writes: its table's when it was opened."""
        return self._rows.schema

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the process released the writer at exit)."""
        return self._closed

    @property
    def is_open(self) -> bool:
        """True while the writer accepts writes (not closed, not fenced, no failed flush)."""
        return not self._closed and self._error is None and self._wal.error is None

    def memtables(self) -> list[MemTable]:
        """Live MemTables, newest first (the active one, then frozen ones not yet flushed)."""
        with self._mutex:
            return [self._active, *reversed(self._frozen)]

    def __enter__(self) -> RegionWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            try:
                self.close()
            except MemWalError:
                pass  # the exception in flight says more

    # ---- claim and replay -------------------------------------------------------------------

    @contextlib.contextmanager
    def _timed(self, phase: str) -> Iterator[None]:
        """Add the time the block takes to the claim's ``phase`` (see :meth:`stats`)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._stats.claim_seconds[phase] = time.perf_counter() - t0

    def _replay_and_fence(self, manifest: RegionManifest) -> int:
        """Fence the previous writer, then replay the WAL tail into the MemTable.

        The fence comes first, so a claim takes bounded time however fast the previous writer
        appends: its sentinel goes at the first free WAL position, and the replay then reads
        a WAL that can no longer grow before it. Returns the sentinel's position (the
        highest this writer has seen); its own entries start right after it.
        """
        tail = manifest.replay_after_wal_entry_position
        if manifest.version == 1:
            # Nobody wrote this region before: nobody to fence, and nothing but set-aside
            # leftovers of a failed claim to replay.
            return self._replay(tail, None)
        last_seen = manifest.wal_entry_position_last_seen
        with self._timed("fence"):
            sentinel = self._place_sentinel(tail, last_seen)
        with self._timed("replay"):
            runs = self._replay_below(tail, sentinel, last_seen)
        with self._timed("sync"):
            self._sync_replayed(runs, sentinel)
        if sentinel > last_seen:

            def see_sentinel(m: RegionManifest) -> bool:
                m.wal_entry_position_last_seen = max(m.wal_entry_position_last_seen, sentinel)
                return True

            # Only now: past last_seen, a hole or a torn entry before nothing but sentinels
            # is what an unfinished claim leaves (wal.only_sentinels_after), not a lost write.
            with self._timed("commit"):
                self._commit(see_sentinel)
        return sentinel

    def _place_sentinel(self, tail: int, last_seen: int) -> int:
        """Put this writer's fence sentinel at the first free WAL position after ``tail``;
        return that position.

        The sentinel is put without an fsync (:meth:`_sync_replayed` syncs it with what it
        fences): it fences a writer of this machine as soon as it has a name, and one that a
        power loss takes fenced nobody, as every writer of the machine died with it.
        """
        listed = [p for p in wal_positions(self._store, self.region_id) if p > tail]
        position = max(listed, default=tail) + 1
        if listed and self._entry_at(position - 1, last_seen) is None:
            position -= 1  # a torn last entry, set aside: its position is free again
            listed.pop()
        self._check_holes(sorted(set(range(tail + 1, position)) - set(listed)), last_seen)
        while put_back_set_aside(self._store, self.region_id, position) is not None:
            position += 1
        # The previous writer appends on while the WAL is listed: look for its frontier (a
        # few existence checks), put the sentinel there, and after each race lost look again
        # and leap further ahead: 1, 3, 7, ... positions past it. The replay fills the
        # positions leapt over that the previous writer did not reach.
        empty_looks, lead = 0, 0
        position = self._free_position(position)
        for _ in range(MAX_SENTINEL_RACES):
            if self._put_sentinel(position):
                return position
            path = layout.wal_entry_path(self.region_id, position)
            if self._store.exists(path):
                empty_looks, lead = 0, 2 * lead + 1
                position = self._free_position(position + 1) + lead
                continue
            empty_looks += 1
            if empty_looks > RECOVERY_LOOKS:  # taken, yet no object: not a race
                raise CorruptWalEntryError(
                    f"region {self.region_id}: WAL position {position} is taken but holds "
                    f"no entry that can be read ({self._store.uri_for(path)}); remove what "
                    "is there, then open the writer again"
                )
        raise CommitConflictError(
            f"region {self.region_id}: lost {MAX_SENTINEL_RACES} races for a free WAL "
            "position to the previous writer; open the writer again"
        )

    def _check_holes(self, holes: list[int], last_seen: int) -> None:
        """Raise :class:`MissingWalEntryError` before anything is written if a WAL position
        below listed ones lost its entry. A whole entry set aside by a claim that lost a race
        (a sentinel that fences an older writer still appending) goes back to its position;
        holes past ``last_seen`` before nothing but sentinels are an unfinished claim's (the
        replay fills them). The previous writer may write into them meanwhile: look again."""
        for _ in range(RECOVERY_LOOKS):
            holes = [
                h
                for h in holes
                if put_back_set_aside(self._store, self.region_id, h) is None and not self._taken(h)
            ]
            if not holes or (
                holes[0] > last_seen and only_sentinels_after(self._store, self.region_id, holes[0])
            ):
                return
        raise missing_wal_entry(
            self.region_id, holes[0], max(wal_positions(self._store, self.region_id))
        )

    def _taken(self, position: int) -> bool:
        return self._store.exists(layout.wal_entry_path(self.region_id, position))

    def _free_position(self, position: int) -> int:
        """The first position from ``position`` on with no WAL entry, after a taken one:
        where a writer appending there will put next. Gallops ahead, then bisects (a few
        existence checks however far it has got)."""
        taken = self._taken
        if not taken(position):
            return position
        step = 1
        while taken(position + step):
            position, step = position + step, step * 2
        free = position + step
        while free - position > 1:
            mid = (position + free) // 2
            position, free = (mid, free) if taken(mid) else (position, mid)
        return free

    def _put_sentinel(self, position: int) -> bool:
        """Put a fence sentinel at ``position`` (no fsync); False if the position is taken.

        A store error is retried: a claim that stops after leaping over positions leaves them
        empty below its sentinel. A put whose reply was lost is recognised by reading back
        this writer's sentinel."""
        path = layout.wal_entry_path(self.region_id, position)
        for attempt in range(SENTINEL_PUT_ATTEMPTS):
            try:
                self._store.put_if_not_exists(
                    path, encode_fence_sentinel(self.epoch, position), checksummed=True, sync=False
                )
                return True
            except ObjectExistsError:
                entry = self._entry_at(position) if attempt else None
                return entry is not None and entry.is_sentinel and entry.writer_epoch == self.epoch
            except StorageError:
                if attempt == SENTINEL_PUT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _replay_below(self, tail: int, sentinel: int, last_seen: int) -> list[WalRun]:
        """Replay the entries after ``tail`` and before ``sentinel`` into the MemTable; return
        them. A free position among them gets a sentinel of this writer (the previous writer
        can no longer pass ``sentinel``, but may stop short of it: no hole is left), unless
        the previous writer takes it first (then its entry is replayed)."""
        paths = [layout.wal_entry_path(self.region_id, p) for p in range(tail + 1, sentinel)]
        datas = self._store.get_many(paths)
        runs: list[WalRun] = []
        batches: list[pa.RecordBatch] = []
        position = tail + 1
        for run in decode_wal_runs(datas, position):
            if run is None:  # missing or damaged: looked at alone
                i = position - tail - 1
                run = WalRun.of(self._entry_for_replay(position, paths[i], datas[i], last_seen))
            runs.append(run)
            position += run.count
            if run.writer_epoch > self.epoch:
                raise WriterFencedError(
                    f"region {self.region_id}: WAL entry {run.first} has writer epoch "
                    f"{run.writer_epoch} > {self.epoch}; a newer writer owns the region"
                )
            if run.is_sentinel:
                continue
            batches.extend(self._replayable(b) for b in run.batches)
            self._active.wal_position = run.last
            self._stats.replayed_entries += run.count
        if batches:
            # One batch, not one per entry: a writer of single-row puts leaves thousands.
            rows = pa.Table.from_batches(batches, schema=self._rows.schema).combine_chunks()
            for batch in rows.to_batches():
                self._active.append(batch, 0)
            self._stats.replayed_rows += rows.num_rows
        return runs

    def _entry_for_replay(
        self, position: int, path: str, data: bytes | None, last_seen: int
    ) -> WalEntry:
        """The entry at ``position`` (``path``, read as ``data``) below this writer's sentinel;
        a free position gets a sentinel of this writer."""
        for _ in range(RECOVERY_LOOKS):
            if data is not None:
                try:
                    return decode_wal_entry(data, position)
                except CorruptWalEntryError:
                    # Raises unless torn by a crash of the machine; a torn one is set aside.
                    entry = self._entry_at(position, last_seen)
                    if entry is not None:
                        return entry
            else:
                entry = put_back_set_aside(self._store, self.region_id, position)
                if entry is not None:
                    return entry
            if self._put_sentinel(position):
                return WalEntry(position, self.epoch, None, True, (), checksummed=True)
            try:
                data = self._store.get(path)
            except ObjectNotFoundError:
                data = None
        raise CommitConflictError(
            f"region {self.region_id}: WAL position {position} changed {RECOVERY_LOOKS} times "
            "while the claim read it (other writers are recovering the region); open the "
            "writer again"
        )

    def _sync_replayed(self, runs: list[WalRun], sentinel: int) -> None:
        """Make durable what this writer replayed and may not be durable, with its sentinel,
        before it appends after them: so that a crash of the machine can only ever tear the
        last entry before a claim's sentinels (see docs/durability.md).

        memwal-sql's writers fsync every entry they put, so the one entry of a writer that
        may not be durable is its last (it may have died between its rename and its fsync).
        Sentinels are put without one, and Lance's writer never fsyncs."""
        last_of: dict[int, int] = {}
        positions = [sentinel]
        for run in runs:
            if run.is_sentinel or not run.checksummed:
                positions.extend(range(run.first, run.last + 1))
            else:
                last_of[run.writer_epoch] = run.last
        positions.extend(last_of.values())
        self._store.sync_objects(
            [layout.wal_entry_path(self.region_id, p) for p in sorted(positions)]
        )
        self._stats.claim_synced_entries = len(positions)

    def _replay(self, tail: int, sentinel: int | None) -> int:
        """Replay the WAL entries after ``tail`` (up to ``sentinel``, or all there are);
        return the last position replayed."""
        for entry in iter_wal(
            self._store, self.region_id, tail, list_for_gaps=True, warn_torn_tail=False
        ):
            if entry.position == sentinel:
                break
            self._replay_entry(entry)
            tail = entry.position
        return tail

    def _entry_at(self, position: int, last_seen: int | None = None) -> WalEntry | None:
        """The WAL entry at ``position`` for the claim, or None if there is none now: a torn
        tail (given the manifest's ``last_seen``) is set aside first (or was, by another
        claiming writer)."""
        entry, torn = read_wal_position(self._store, self.region_id, position, last_seen)
        if torn is None:
            return entry
        to, entry = set_aside_torn_entry(self._store, self.region_id, position)
        if to is not None:
            self._stats.torn_entries_set_aside += 1
            warnings.warn(
                TornWalEntryWarning(
                    f"region {self.region_id}: the last WAL entry (position {position}) was torn by "
                    f"a crash of the machine during its put ({torn}). It was never acknowledged; "
                    f"moved it to {to} and took its position"
                ),
                stacklevel=5,
            )
        return entry

    def _replayable(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A replayed WAL batch in this writer's schema; one with a column the schema lacks
        (added by another process after this writer's table last looked) is refused, since
        replaying it here would drop the column's values from the flush."""
        unknown = set(batch.schema.names) - set(self._rows.schema.names)
        if unknown:
            raise SchemaMismatchError(
                f"region {self.region_id}: its WAL holds column(s) {sorted(unknown)} this "
                "writer's schema lacks (added since the table was opened): open the table "
                "again and claim the region from it"
            )
        return conform_batch(batch, self._rows.schema)

    def _replay_entry(self, entry: Any) -> None:
        if entry.writer_epoch > self.epoch:
            raise WriterFencedError(
                f"region {self.region_id}: WAL entry {entry.position} has writer epoch "
                f"{entry.writer_epoch} > {self.epoch}; a newer writer owns the region"
            )
        if entry.is_sentinel:
            return
        for batch in entry.batches:
            batch = self._replayable(batch)
            self._active.append(batch, 0)
            self._stats.replayed_rows += batch.num_rows
        self._active.wal_position = entry.position
        self._stats.replayed_entries += 1

    # ---- write path -------------------------------------------------------------------------

    def _check_region(self, rows: pa.RecordBatch) -> None:
        if not self._region_is_a_subset or rows.num_rows == 0:
            return
        spec, region_values = self._table.region_spec, self._region_values
        assert spec is not None and region_values is not None  # a subset region has both
        values = spec.region_values(rows)
        if all(
            pc.all(pc.equal(col, pa.scalar(v, col.type))).as_py()
            for col, v in zip(values.columns, region_values)
        ):
            return
        wrong = [v for v in spec.group_rows(rows) if tuple(v) != tuple(region_values)]
        if wrong:
            raise WrongRegionError(
                f"region {self.region_id} holds rows with region values {self._region_values}, "
                f"but the batch has rows for {wrong[:3]}; write through table.upsert() to route "
                "rows, or open a writer per region"
            )

    def append_rows(self, batch: pa.RecordBatch, kind: WriteKind) -> int:
        """Append WAL-schema rows (``kind``: ``"upserts"`` or ``"deletes"``, i.e. tombstones)
        to the MemTable and the WAL queue, without waiting; returns the WAL sequence number to
        pass to :meth:`wait_durable` (0: nothing to wait for).

        The rows are taken as they are: the caller has validated them (the table's
        ``RowCoercer``) and routed them to this region, as routed writes do. :meth:`upsert`
        and :meth:`delete` are the checks, this, then the wait; a routed write appends to every
        region's writer first, then waits for them all, so their WAL puts overlap.

        Example:
            ``seq = w.append_rows(rows, "upserts"); w.wait_durable(seq)``
        """
        if batch.num_rows == 0:
            with self._mutex:
                self._check_open()
            return 0
        nbytes = batch.get_total_buffer_size()  # .nbytes walks every buffer: too slow per put
        if _may_be_a_slice(batch) and nbytes > 2 * batch.nbytes:
            # A small slice of a large batch would pin its parent's buffers in the MemTable
            # (and count them against the thresholds): keep a copy of just these rows.
            batch = pa.RecordBatch.from_arrays(
                [pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema
            )
            nbytes = batch.get_total_buffer_size()
        with self._mutex:
            self._check_open()
            if self._frozen_bytes > self.config.max_unflushed_memtable_bytes:
                self._backpressure_locked()
            memtable = self._active
            seq = self._wal.append(batch, self._active.generation, nbytes)
            self._active.append(batch, seq, nbytes)
            self._stats.rows_written += batch.num_rows
            self._written[1] += batch.num_rows
            if kind == "upserts":
                self._stats.upserts += 1
            else:
                self._stats.deletes += 1
            if (
                self._active.num_rows >= self.config.max_memtable_rows
                or self._active.nbytes >= self.config.max_memtable_size
                or self._active.num_batches >= self.config.max_memtable_batches
            ):
                self._freeze_locked()
        if self.config.indexed_writes:
            self._refresh_indexes(memtable)
        return seq

    def wait_durable(self, seq: int) -> None:
        """Wait until WAL sequence ``seq`` (from :meth:`append_rows`) is stored, if this
        writer is durable (``durable_write``); raises the WAL's error if its put failed.

        Example:
            ``w.wait_durable(w.append_rows(rows, "deletes"))``
        """
        if self.config.durable_write and seq:
            self._wal.wait(seq)

    def _refresh_indexes(self, memtable: MemTable) -> None:
        """Extend the MemTable's in-memory indexes with its new batches (indexed writes)."""
        from memwal_sql.formats.source_rows import source_schema
        from memwal_sql.writer.memtable_indexes import text_index, tokenizer_for, vector_index

        schema, batches = source_schema(memtable.schema), memtable.batches()
        for index in self._table.maintained_indexes():
            if index.vector:
                vector_index(
                    batches,
                    memtable.generation,
                    "memtable",
                    index.column,
                    schema,
                    caches=self._table.caches,
                ).update(batches)
            elif index.index_type == "INVERTED":
                text_index(
                    batches,
                    memtable.generation,
                    "memtable",
                    index.column,
                    schema,
                    tokenizer_for(index.params, self._table.caches),
                    caches=self._table.caches,
                ).update(batches, self._table.primary_key)

    def _backpressure_locked(self) -> None:
        t0 = None
        while (
            self._frozen_bytes > self.config.max_unflushed_memtable_bytes
            and self._error is None
            and not self._closed
        ):
            if t0 is None:
                t0 = time.perf_counter()
                self._stats.backpressure_waits += 1
                _log.warning(
                    "region %s: writes wait for flushes (%d unflushed bytes > %d)",
                    self.region_id,
                    self._frozen_bytes,
                    self.config.max_unflushed_memtable_bytes,
                )
            self._lock.wait(0.5)
        if t0 is not None:
            self._stats.backpressure_seconds += time.perf_counter() - t0
        self._check_open()

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._wal.error is not None:
            raise self._wal.error
        if self._closed:
            raise WriterClosedError(
                f"the writer of region {self.region_id} is closed; open a new one with "
                "table.writer(...)"
            )

    def _freeze_locked(self) -> None:
        if self._active.num_rows == 0:
            return
        self._active.frozen = True
        self._frozen.append(self._active)
        self._frozen_bytes += self._active.nbytes
        nxt = MemTable(self._rows.schema, self._active.generation + 1)
        self._active = nxt
        self._memtables_by_gen[nxt.generation] = nxt
        self._lock.notify_all()

    def _entry_written(self, generation: int, position: int) -> None:
        self._written[0] += 1
        mt = self._memtables_by_gen.get(generation)
        if mt is not None:
            mt.wal_position = max(mt.wal_position, position)

    # ---- MemTable flush -----------------------------------------------------------------------

    def _wait_flushed(self, generation: int) -> None:
        started = time.monotonic()
        with self._mutex:
            while (
                self._frozen
                and self._frozen[0].generation <= generation
                and self._error is None
                and not self._closed  # released by another thread: its flush thread stopped
            ):
                if not self._lock.wait(_SLOW_FLUSH_SECONDS) and self._frozen:
                    # A flush writes a few MB and commits a manifest: minutes mean a stalled
                    # object store or a stuck flush thread, which the operator should see. (A
                    # flush that finished as the wait timed out leaves nothing to report.)
                    _log.warning(
                        "region %s: still waiting for MemTable generation %d to flush after "
                        "%.0f s (flush thread %s); acknowledged writes are safe in the WAL",
                        self.region_id,
                        self._frozen[0].generation,
                        time.monotonic() - started,
                        "running" if self._flush_thread.is_alive() else "stopped",
                    )
            if self._frozen and self._frozen[0].generation <= generation:
                self._check_open()  # failed, fenced or released before the flush

    def _flush_loop(self) -> None:
        while True:
            with self._mutex:
                while not self._frozen and not self._closed:
                    self._lock.wait()
                if not self._frozen or self._releasing:
                    return
                memtable = self._frozen[0]
            try:
                self._flush_memtable(memtable)
                flushed(memtable)  # readers drop what they kept of it
                with self._mutex:
                    self._frozen.popleft()
                    self._frozen_bytes -= memtable.nbytes
                    self._memtables_by_gen.pop(memtable.generation, None)
                    self._lock.notify_all()
            except BaseException as e:
                # Whatever fails, the writer records it: a flush thread that died silently
                # would leave every flush() and close() waiting for it forever.
                if not isinstance(e, MemWalError):
                    failure = StorageError(
                        f"flushing generation {memtable.generation} of region {self.region_id} "
                        f"failed: {e}. Acknowledged writes are safe in the WAL; fix the cause, "
                        "then open a new writer of the region (it replays them)"
                    )
                    failure.__cause__ = e
                    e = failure
                with self._mutex:
                    self._error = e
                    self._lock.notify_all()
                return

    def _flush_memtable(self, memtable: MemTable) -> None:
        t0 = time.perf_counter()
        if memtable.last_seq:
            self._wal.wait(memtable.last_seq)  # the generation must be in the WAL first
        covered = max(memtable.wal_position, self._replay_floor)
        rows, sorted_keys = latest_per_key_in_key_order(
            memtable.to_table(), self._table.primary_key
        )
        last_error: BaseException | None = None
        for _ in range(_FLUSH_ATTEMPTS):
            try:
                entry = self._store.while_answering(
                    lambda: write_generation(
                        self._store,
                        self.region_id,
                        memtable.generation,
                        rows,
                        self._table.primary_key,
                        data_storage_version=self._table.data_storage_version,
                        field_ids=self._table.field_ids,
                        in_memory_bytes=memtable.nbytes,
                        indexes=self._table.maintained_indexes(),
                        wal_entry_position=covered,
                        sorted_keys=sorted_keys,
                    ),
                    f"flushing generation {memtable.generation} of region {self.region_id}",
                )
                break
            except StorageUnavailableError:
                raise  # the store already retried what it did not answer
            except (OSError, MemWalError) as e:  # a retry writes a fresh directory
                last_error = e
        else:
            assert last_error is not None
            raise last_error

        def apply(m: RegionManifest) -> bool:
            if any(g.path == entry.path for g in m.flushed_generations):
                return False  # an earlier attempt whose reply was lost did commit it
            m.replay_after_wal_entry_position = max(m.replay_after_wal_entry_position, covered)
            m.wal_entry_position_last_seen = max(m.wal_entry_position_last_seen, covered)
            m.current_generation = memtable.generation + 1
            m.flushed_generations.append(entry)
            return True

        self._commit(apply)
        with self._mutex:
            self._stats.memtable_flushes += 1
            self._stats.flushed_rows += rows.num_rows
            self._stats.flush_seconds += time.perf_counter() - t0
            self._stats.generations.append(memtable.generation)
        _log.info(
            "region %s: flushed generation %d (%d rows) in %.3f s",
            self.region_id,
            memtable.generation,
            rows.num_rows,
            time.perf_counter() - t0,
        )

    def _commit(self, change: Callable[[RegionManifest], bool]) -> None:
        """Commit ``change`` as the next manifest version, while still the region's owner."""
        commit_change(self._manifests, change, max_epoch=self.epoch)


def _may_be_a_slice(batch: pa.RecordBatch) -> bool:
    """Whether ``batch`` may share larger buffers with the batch it was sliced from. A cheap
    look at the first column (an offset, or a values/offsets buffer with room for far more
    rows); the exact check, ``.nbytes``, costs tens of microseconds per batch."""
    if not batch.num_rows:
        return False
    col = batch.column(0)
    if col.offset:
        return True
    buffers = col.buffers()
    room = buffers[1].size if len(buffers) > 1 and buffers[1] is not None else 0
    return room > 2 * (len(col) + 1) * 8 + 64  # 8 bytes per row bounds values and offsets
