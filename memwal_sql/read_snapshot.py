"""Read snapshots: which sources a query reads, per region, taken once per query.

A snapshot pins the base table version and, per region, the flushed generations newer than what
the base table has merged, plus the unflushed rows:

* ``consistency="strong"`` reads every region manifest directly, takes the live MemTables of this
  process's open writers (active and frozen, before the manifest, so a flush finishing in between
  shows up in one or the other), and for regions without a live writer here reads the WAL tail
  after the last flushed generation. Every acknowledged durable write is visible.
* ``consistency="eventual"`` reads flushed generations only, no MemTables, no WAL, and takes the
  regions from the MemWAL index's region snapshot when there is one (one object for all regions,
  as of the last :func:`~memwal_sql.maintenance.index_builder.build_region_snapshots`), else from
  the region manifests. It is cheaper and lags by the unflushed data and the snapshot's age.

Generations at or below the base table's merged generation are not read as newer sources: a
stale generation would outrank newer base rows. The ones the region manifest still lists are kept
aside (``merged_generations``) for the indexed read plan, which reads them in place of the base
rows an index does not cover yet.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import lance
import pyarrow as pa

from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.compat.lance import is_not_found, is_version_gone
from memwal_sql.errors import (
    CommitConflictError,
    CorruptManifestError,
    InvalidInputError,
    MissingWalEntryError,
    SnapshotExpiredError,
    WriterError,
)
from memwal_sql.formats.region_manifest import RegionManifestStore, check_not_behind_index
from memwal_sql.formats.snapshot_token import RegionCut, SnapshotCut
from memwal_sql.formats.source_rows import source_schema
from memwal_sql.formats.wal import WalEntry, conform_batch, read_wal_range, wal_positions
from memwal_sql.formats.wal_tail import WalTail
from memwal_sql.partitioning.region_spec import RegionSpec, region_id_for
from memwal_sql.storage import ObjectStore, layout
from memwal_sql.storage.checksums import recorded_wal_entry_position
from memwal_sql.structures.cache import Caches
from memwal_sql.writer.memtable_indexes import forget

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState

Consistency = Literal["strong", "eventual"]
_TAIL_ATTEMPTS = 10
_READ_AHEAD = 16  # WAL entries a partial cut's row count reads side by side
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="memwal-snapshot")
_TAIL_OWNERS: weakref.WeakSet[ObjectStore] = weakref.WeakSet()  # stores of tables with tails


@dataclass(frozen=True)
class GenerationRef:
    generation: int
    uri: str


@dataclass(frozen=True)
class MemRows:
    """Unflushed rows of one generation: a live MemTable or the WAL tail."""

    generation: int
    batches: tuple[pa.RecordBatch, ...]
    origin: str  # "memtable" or "wal"


@dataclass(frozen=True)
class RegionSources:
    """What one read sees of a region: its flushed generations not yet merged and its unflushed
    rows (not the spec's region snapshots, :mod:`memwal_sql.formats.region_snapshots`)."""

    region_id: str
    region_values: tuple[Any, ...] | None
    generations: tuple[GenerationRef, ...]
    unflushed: tuple[MemRows, ...] = ()
    merged_generations: tuple[GenerationRef, ...] = ()  # already in the base table, still listed

    @property
    def num_sources(self) -> int:
        return len(self.generations) + len(self.unflushed)

    def generations_newest_first(self, gap: Sequence[GenerationRef] = ()) -> list[GenerationRef]:
        """The region's generations (and ``gap`` ones, which an indexed read reads in place of
        base rows its index does not cover yet), newest first: the order every plan reads them.

        Example:
            ``[g.generation for g in snap.regions[0].generations_newest_first()]``
        """
        return sorted([*self.generations, *gap], key=lambda g: -g.generation)


@dataclass(frozen=True)
class ReadSnapshot:
    """The base table at one version and the regions' sources as of one moment."""

    dataset: lance.LanceDataset
    primary_key: tuple[str, ...]
    schema: pa.Schema
    """The table's schema as of this snapshot (a schema change since is seen by the next)."""
    wal_schema: pa.Schema
    regions: tuple[RegionSources, ...]
    consistency: Literal["strong", "eventual", "pinned"]
    storage_options: Mapping[str, str] | None = field(default=None)
    merged: Mapping[str, int] = field(default_factory=dict)  # the base version's merge progress
    store: ObjectStore | None = None
    caches: Caches = field(kw_only=True)
    """The table's caches, which the planner hands to the nodes that keep what they read."""

    @functools.cached_property
    def source_schema(self) -> pa.Schema:
        """The schema every newer-than-base source's rows are read in (``_gen``, ``_rowaddr``)."""
        return source_schema(self.wal_schema)

    @functools.cached_property
    def leaf_storage_options(self) -> dict[str, str] | None:
        """The storage options a leaf opens files with (None when there are none)."""
        return dict(self.storage_options or {}) or None

    @property
    def base_version(self) -> int:
        return self.dataset.version


@dataclass(frozen=True, eq=False)
class PinnedSnapshot:
    """A table's state at one moment, which reads can return to later (``tbl.snapshot()``):
    pass it as ``as_of=`` to a read, or register it in a SQL session. Its :attr:`token` is a
    string that restores it in any process (``mw.open_table(uri).snapshot(token)``).

    It reads exactly the rows acknowledged when it was taken, after any flush, merge or
    compaction since, while garbage collection keeps its base version (``tbl.tag`` keeps it for
    good); after that a read is a :class:`~memwal_sql.errors.SnapshotExpiredError`.

    Example:
        ``snap = tbl.snapshot(); tbl.upsert(rows); tbl.to_arrow(as_of=snap)  # without rows``
    """

    table: TableState
    cut: SnapshotCut

    @property
    def token(self) -> str:
        """The snapshot as a short string: ``tbl.snapshot(token)`` restores it."""
        return self.cut.token

    @property
    def base_version(self) -> int:
        """The base table's version the snapshot reads."""
        return self.cut.base_version

    @property
    def taken_at(self) -> datetime.datetime:
        """When the snapshot was taken (UTC)."""
        return datetime.datetime.fromtimestamp(
            self.cut.taken_at_millis / 1000, datetime.timezone.utc
        )

    def __repr__(self) -> str:
        return f"PinnedSnapshot(base_version={self.base_version}, token={self.token!r})"


#: What a read reads: the latest state (``"strong"``, or ``"eventual"`` for flushed rows only),
#: or a pinned snapshot.
ReadAt = Consistency | PinnedSnapshot


def pin_snapshot(table: TableState) -> PinnedSnapshot:
    """Take a :class:`PinnedSnapshot` of ``table`` now: this process's writers store their
    buffered writes in the WAL first, so it holds every write acknowledged before the call.

    Example:
        ``snap = pin_snapshot(tbl); snap.token``
    """
    for writer in table.live_writers().values():
        try:
            writer.sync_wal()
        except WriterError:
            pass  # closed or fenced since: what it acknowledged is stored
    taken_at = int(time.time() * 1000)
    dataset = table.dataset()
    merged = table.merged_generations(dataset)
    rids = sorted(set(table.regions()) | set(merged))
    store = table.store

    def cut(rid: str) -> RegionCut | None:
        manifest = RegionManifestStore(store, rid).latest()
        if manifest is None:
            return None
        flushed = manifest.replay_after_wal_entry_position
        # Listed after the manifest: a flush committed in between leaves its entries in place.
        end = max([flushed, *wal_positions(store, rid)])
        floor = merged.get(rid, 0)
        generations = tuple(
            sorted(g.generation for g in manifest.flushed_generations if g.generation > floor)
        )
        return RegionCut(rid, generations, flushed, end, manifest.current_generation)

    cuts = [cut(r) for r in rids] if store.is_local else list(_POOL.map(cut, rids))
    regions = tuple(c for c in cuts if c is not None)
    return PinnedSnapshot(table, SnapshotCut(dataset.version, regions, taken_at))


def partial_cut(
    table: TableState, start: SnapshotCut, end: SnapshotCut, max_rows: int
) -> SnapshotCut:
    """A cut between snapshot cuts ``start`` and ``end`` holding about ``max_rows`` written
    rows: regions take their next WAL entries in turn until the rows reach ``max_rows`` (at
    least one entry: an entry is never split). ``end`` when it holds no more.

    Example:
        ``partial_cut(tbl, a.cut, b.cut, 1000).token``
    """
    pending = {}
    for rc in end.regions:
        after = start.wal_position_of(rc.region_id)
        if rc.wal_position > after:
            pending[rc.region_id] = (after, rc.wal_position)

    def entries(rid: str, after: int, through: int) -> Iterator[WalEntry]:
        for first in range(after, through, _READ_AHEAD):
            last = min(first + _READ_AHEAD, through)
            yield from read_wal_range(table.store, rid, first, last)

    readers = {rid: entries(rid, *span) for rid, span in sorted(pending.items())}
    reached = {rid: after for rid, (after, _) in pending.items()}
    rows = 0
    while readers and rows < max_rows:
        for rid in list(readers):
            entry = next(readers[rid], None)
            if entry is None:
                del readers[rid]
                continue
            if rows and rows + entry.num_rows > max_rows:
                readers.clear()
                break
            reached[rid] = entry.position
            rows += entry.num_rows
    if all(reached[rid] == through for rid, (_, through) in pending.items()):
        return end
    regions = []
    for rc in end.regions:
        before = start.region(rc.region_id)
        position = reached.get(rc.region_id, before.wal_position if before else 0)
        if before is not None:
            regions.append(_advanced(table, before, position))
        elif position > 0:
            # A region written first after the start: the start's base has none of its rows.
            regions.append(RegionCut(rc.region_id, (), 0, position, 0))
    return dataclasses.replace(start, regions=tuple(regions), taken_at_millis=end.taken_at_millis)


def _advanced(table: TableState, before: RegionCut, position: int) -> RegionCut:
    """Region cut ``before`` moved on to WAL ``position``: with the generations flushed since
    that hold only rows up to it (each records its last WAL position at flush), so the next
    batch reads them, not their WAL entries, as its start's rows. They are newer than what the
    start's base version merged, and GC keeps them while it keeps that version."""
    moved = dataclasses.replace(before, wal_position=position)
    manifest = RegionManifestStore(table.store, before.region_id).latest()
    if manifest is None:
        return moved
    since = sorted(
        (g for g in manifest.flushed_generations if g.generation >= before.memtable_generation),
        key=lambda g: g.generation,
    )
    generations, flushed, current = list(before.generations), before.flushed_position, None
    for g in since:
        directory = f"{layout.region_dir(before.region_id)}/{g.path}"
        covered = recorded_wal_entry_position(table.store, directory)
        if covered is None or covered > position:
            break  # a generation Lance flushed records no position: its WAL entries are read
        generations.append(g.generation)
        flushed, current = covered, g.generation + 1
    if current is None:
        return moved
    return dataclasses.replace(
        moved,
        generations=tuple(generations),
        flushed_position=flushed,
        memtable_generation=current,
    )


def take_read_snapshot(table: TableState, consistency: ReadAt = "strong") -> ReadSnapshot:
    """Snapshot ``table`` for one query (``consistency`` may be a :class:`PinnedSnapshot`).

    Example:
        ``snap = take_read_snapshot(tbl); [r.region_id for r in snap.regions]``
    """
    if isinstance(consistency, PinnedSnapshot):
        return _pinned_read_snapshot(table, consistency.cut)
    if consistency not in ("strong", "eventual"):
        raise InvalidInputError(f"consistency must be 'strong' or 'eventual', not {consistency!r}")
    live = table.live_writers() if consistency == "strong" else {}
    # MemTables first, manifests second: a flush that completes in between is then seen as a
    # generation, a MemTable, or both (deduplication makes both harmless), never neither.
    memtables = {rid: w.memtables() for rid, w in live.items()}
    dataset = table.dataset()
    table.follow_schema(dataset)
    merged = table.merged_generations(dataset)
    spec = table.region_spec
    regions = []
    snapshotted = table.region_snapshots(dataset) if consistency == "eventual" else None
    if snapshotted is not None:
        rids = [str(uuid.UUID(bytes=m.region_id.uuid)) for m in snapshotted]
        manifests: list[RegionManifest | None] = list(snapshotted)
    else:
        # A region the MemWAL index has merged from is one whose manifests must exist.
        rids = sorted(set(table.regions()) | set(merged))
        known = table.known_manifests

        def refresh(rid: str) -> RegionManifest | None:
            return RegionManifestStore(table.store, rid).refresh(known.get(rid))

        # Each manifest read is a few small object reads: issue them side by side, except on
        # local disk, where a check takes microseconds and a thread hand-off more.
        local = table.store.is_local
        manifests = [refresh(r) for r in rids] if local else list(_POOL.map(refresh, rids))
        for rid, manifest in zip(rids, manifests):
            if manifest is not None:
                known[rid] = manifest
    for rid, manifest in zip(rids, manifests):
        if snapshotted is None:
            check_not_behind_index(rid, manifest, merged.get(rid, 0))
        if manifest is None:
            # A claim commits the manifest before any WAL put: a WAL without one is damage.
            if snapshotted is None and wal_positions(table.store, rid):
                raise CorruptManifestError(
                    f"region {rid} has WAL entries but no manifest: its manifests were lost. "
                    "Restore them from a backup; a writer opened on the region replays only what "
                    "is still in its WAL"
                )
            continue
        tail: tuple[pa.RecordBatch, ...] = ()
        if consistency == "strong" and rid not in memtables:
            manifest, tail = _consistent_wal_tail(table, rid, manifest)
            table.known_manifests[rid] = manifest
        floor = merged.get(rid, 0)
        refs = [
            GenerationRef(g.generation, table.store.uri_for(f"{layout.region_dir(rid)}/{g.path}"))
            for g in manifest.flushed_generations
        ]
        gens = tuple(g for g in refs if g.generation > floor)
        unflushed: list[MemRows] = []
        if rid in memtables:
            flushed = {g.generation for g in manifest.flushed_generations}
            for mt in memtables[rid]:
                batches = tuple(mt.batches())
                if batches and not batches[0].schema.equals(table.wal_schema):
                    # A writer opened before a schema change: its rows in the table's schema.
                    batches = tuple(conform_batch(b, table.wal_schema) for b in batches)
                # A MemTable whose flush committed after we listed it is read as the generation;
                # one source per (region, generation) keeps row addresses unambiguous.
                if batches and mt.generation not in flushed:
                    unflushed.append(MemRows(mt.generation, batches, "memtable"))
        elif tail:
            unflushed.append(MemRows(manifest.current_generation, tail, "wal"))
        values = None
        if spec is not None:
            values = region_values(spec, rid, manifest)
        # A region snapshot may list generations collected since: none for the indexed read.
        merged_refs = (
            () if snapshotted is not None else tuple(g for g in refs if g.generation <= floor)
        )
        regions.append(RegionSources(rid, values, gens, tuple(unflushed), merged_refs))
    return _read_snapshot(table, dataset, regions, consistency, merged)


def _read_snapshot(
    table: TableState,
    dataset: lance.LanceDataset,
    regions: Sequence[RegionSources],
    consistency: Literal["strong", "eventual", "pinned"],
    merged: Mapping[str, int],
) -> ReadSnapshot:
    return ReadSnapshot(
        dataset=dataset,
        primary_key=table.primary_key,
        schema=table.schema,
        wal_schema=table.wal_schema,
        regions=tuple(regions),
        consistency=consistency,
        storage_options=table.storage_options or None,
        merged=merged,
        store=table.store,
        caches=table.caches,
    )


def _pinned_read_snapshot(table: TableState, cut: SnapshotCut) -> ReadSnapshot:
    """What a pinned snapshot reads: the base at its version, each region's generations it
    names (still listed: GC keeps what a retained base version needs), and the WAL entries
    between its flushed and last positions, in the table's current schema."""
    try:
        dataset = table.dataset(cut.base_version)
    except (OSError, ValueError) as e:
        if not (is_version_gone(e) or is_not_found(e)):
            raise
        raise _expired(table, cut, f"base version {cut.base_version} was removed") from e
    merged = table.merged_generations(dataset)
    spec = table.region_spec
    regions = []
    for rc in cut.regions:
        manifest = RegionManifestStore(table.store, rc.region_id).refresh(
            table.known_manifests.get(rc.region_id)
        )
        listed = {g.generation: g for g in (manifest.flushed_generations if manifest else ())}
        gone = [g for g in rc.generations if g not in listed]
        if manifest is None or gone:
            raise _expired(table, cut, f"region {rc.region_id} collected generation(s) {gone}")
        region_dir = layout.region_dir(rc.region_id)
        refs = tuple(
            GenerationRef(g, table.store.uri_for(f"{region_dir}/{listed[g].path}"))
            for g in rc.generations
        )
        unflushed: tuple[MemRows, ...] = ()
        if rc.wal_position > rc.flushed_position:
            generation, batches = _pinned_wal_rows(table, cut, rc)
            if batches:
                unflushed = (MemRows(generation, batches, "wal"),)
        floor = merged.get(rc.region_id, 0)
        merged_refs = tuple(
            GenerationRef(g.generation, table.store.uri_for(f"{region_dir}/{g.path}"))
            for g in manifest.flushed_generations
            if g.generation <= floor
        )
        values = None if spec is None else region_values(spec, rc.region_id, manifest)
        regions.append(RegionSources(rc.region_id, values, refs, unflushed, merged_refs))
    return _read_snapshot(table, dataset, regions, "pinned", merged)


def _pinned_wal_rows(
    table: TableState, cut: SnapshotCut, rc: RegionCut
) -> tuple[int, tuple[pa.RecordBatch, ...]]:
    """The rows of a pinned region's WAL range, as one source: read once per table (an entry
    never changes), and newer than every flushed generation the snapshot reads."""

    def load() -> tuple[tuple[pa.Schema, tuple[int, tuple[pa.RecordBatch, ...]]], int]:
        try:
            entries = read_wal_range(
                table.store, rc.region_id, rc.flushed_position, rc.wal_position
            )
        except MissingWalEntryError as e:
            raise _expired(table, cut, f"region {rc.region_id} lost WAL entries ({e})") from e
        batches = tuple(
            conform_batch(b, table.wal_schema)
            for entry in entries
            if not entry.is_sentinel
            for b in entry.batches
        )
        generation = max([rc.memtable_generation, *(e.generation or 0 for e in entries)])
        nbytes = sum(b.get_total_buffer_size() for b in batches)
        return (table.wal_schema, (generation, batches)), nbytes

    key = f"{table.uri}#{rc.region_id}#{rc.flushed_position}-{rc.wal_position}"
    kept = table.caches.memtable.get(
        "pinned_wal", key, load, lambda k: k[0].equals(table.wal_schema)
    )
    return kept[1]


def _expired(table: TableState, cut: SnapshotCut, what: str) -> SnapshotExpiredError:
    return SnapshotExpiredError(
        f"the snapshot of {table.uri} at base version {cut.base_version} has expired: {what}. "
        "Garbage collection keeps a snapshot while its base version is younger than "
        "base_versions_older_than (MaintenanceConfig); tag a snapshot (tbl.tag) to keep it"
    )


def _consistent_wal_tail(
    table: TableState, region_id: str, manifest: RegionManifest
) -> tuple[RegionManifest, tuple[pa.RecordBatch, ...]]:
    """The WAL tail after ``manifest``, with the manifest it was read against.

    A flush may commit a newer manifest while the tail is read, and GC may then delete the WAL
    entries its generation holds: the tail read against the older manifest would miss those
    rows. So the manifest is checked again afterwards (one existence check), and the tail is
    read again against a newer one.
    """
    manifests = RegionManifestStore(table.store, region_id)
    for _ in range(_TAIL_ATTEMPTS):
        try:
            tail = _wal_tail(table, region_id, manifest)
        except MissingWalEntryError:
            newer = manifests.refresh(manifest)
            if newer is manifest or newer is None:
                raise  # no GC explains the hole: the WAL lost an entry
            manifest = newer
            continue
        newer = manifests.refresh(manifest)
        if newer is manifest or newer is None:
            return manifest, tail
        manifest = newer
    raise CommitConflictError(
        f"region {region_id} committed {_TAIL_ATTEMPTS} manifests while its WAL tail was read; "
        "retry the read"
    )


def _wal_tail(
    table: TableState, region_id: str, manifest: RegionManifest
) -> tuple[pa.RecordBatch, ...]:
    """The region's WAL tail after ``manifest``, reading only the entries put since ``table``
    last read it: what it replayed is kept in its ``caches.memtable``, counted at its size (if
    it is evicted, the next read replays the tail again).

    The tail is kept per open table, not per process: a table opened again replays the tail
    afresh, so it sees (and reports) what happened to entries read before, such as a lost one.
    """
    part = table.caches.memtable
    # The table's store stands for the table: one per open table, and a read may be handed a
    # proxy of the table (a DataFusion session holds one), never of its store.
    store = table.store
    prefix = f"{table.uri}#{id(store)}#"
    if store not in _TAIL_OWNERS:  # its tails go with it, rather than when the cache evicts
        _TAIL_OWNERS.add(store)
        weakref.finalize(store, part.discard_later, prefix)  # runs inside any allocation
    kept: tuple[weakref.ref[ObjectStore], WalTail] = part.get(
        "wal_tail",
        prefix + region_id,
        lambda: ((weakref.ref(store), WalTail(table.wal_schema)), 0),
        # A dead store's id may be another's: the entry names its store.
        lambda k: k[0]() is store and k[1].schema.equals(table.wal_schema),
    )
    tail = kept[1]
    accounted = tail.nbytes
    batches, retired = tail.read(store, region_id, manifest)
    if retired is not None:
        forget([retired])  # the indexes of the tail as it was, before a flush took its start
    if tail.nbytes != accounted:
        part.resize("wal_tail", prefix + region_id, tail.nbytes)
    return batches


def region_values(
    spec: RegionSpec, region_id: str, manifest: RegionManifest
) -> tuple[Any, ...] | None:
    """The region's values under ``spec`` (NULL where the manifest names no value), or None
    for a region the spec does not govern (a manual region may hold any rows)."""
    entries = tuple((e.field_id, bytes(e.value)) for e in manifest.region_field_entries)
    return _decoded_region_values(spec, region_id, entries)


@functools.lru_cache(maxsize=4096)
def _decoded_region_values(
    spec: RegionSpec, region_id: str, entries: tuple[tuple[str, bytes], ...]
) -> tuple[Any, ...] | None:
    # Every snapshot of every query asks this of every region, and the answer never changes.
    values = spec.values_from_entries(list(entries), missing_as_null=True)
    if values is None or region_id_for(spec, values) != region_id:
        return None
    return values
