"""The state of an open MemWAL table: its base dataset, store, regions and writers.

:class:`~memwal_sql.table.MemWalTable` adds the reads, searches, maintenance and routed writes
on top; the read snapshot, the planner and maintenance need only this state, so they sit below
the table API instead of importing it back.

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.schema([pa.field("id", pa.int64(), False)]),
    ...                       primary_key="id")
    >>> isinstance(tbl, TableState), tbl.regions()
    (True, [])
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lance
import pyarrow as pa

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails, RegionManifest
from memwal_sql.compat.lance import field_ids
from memwal_sql.errors import InvalidInputError, TableClosedError, UnknownRegionError
from memwal_sql.formats.lance_manifest import read_mem_wal_details
from memwal_sql.formats.maintained_indexes import MaintainedIndex, maintained_indexes
from memwal_sql.formats.memwal_index import region_generations
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.formats.region_snapshots import load_region_snapshots
from memwal_sql.formats.source_rows import WIDENS_METADATA
from memwal_sql.partitioning.region_spec import REGION_NAMESPACE, RegionSpec, region_id_for
from memwal_sql.storage import ObjectStore, layout
from memwal_sql.structures.cache import Caches, default_caches
from memwal_sql.writer.config import WriterConfig
from memwal_sql.writer.region_writer import RegionWriter, TableLayout
from memwal_sql.writer.rows import RowCoercer

# Our own configuration, on the sequence column's field (Lance keeps field metadata, ignores it).
SEQUENCE_METADATA = b"memwal-sql:sequence-column"
#: The region ``table.writer()`` and routed writes use on a table without a region spec.
DEFAULT_REGION_ID = str(uuid.uuid5(REGION_NAMESPACE, "default-region"))


class TableState:
    """An open table's state: base dataset, store, region spec, regions and writers."""

    def __init__(
        self,
        uri: str,
        dataset: lance.LanceDataset,
        *,
        primary_key: Sequence[str],
        region_spec: RegionSpec | None,
        storage_options: Mapping[str, str] | None = None,
        writer_config: WriterConfig | None = None,
        caches: Caches | None = None,
    ) -> None:
        self.uri = uri
        self.storage_options = dict(storage_options or {})
        self.primary_key = tuple(primary_key)
        self.region_spec = region_spec
        self.writer_config = writer_config or WriterConfig()
        #: What this table's reads and its writers' MemTable indexes cache, within one budget.
        self.caches = caches if caches is not None else default_caches()
        self._dataset = dataset
        self._session = dataset.session()
        self.schema = table_schema(dataset.schema)
        self._schema_version = dataset.version  # the base version self.schema was read from
        #: The column whose highest value wins per key (``create_table(sequence_column=...)``).
        self.sequence_column = sequence_column_of(self.schema)
        self.store = ObjectStore(uri, self.storage_options)
        self._rows = RowCoercer(self.schema, self.primary_key)
        self._layout = TableLayout(
            store=self.store,
            base_schema=self.schema,
            primary_key=self.primary_key,
            region_spec=region_spec,
            data_storage_version=dataset.data_storage_version,
            caches=self.caches,
            sequence_column=self.sequence_column,
            field_ids=_own_field_ids(dataset, self.schema),
            # Weakly, so the table and its writers' layout make no reference cycle.
            merged_generations=_weak_call(self.merged_generations, dict),
            maintained_indexes=_weak_call(self.maintained_indexes, tuple),
        )
        self._writers: dict[str, RegionWriter] = {}  # routed writes' own writers
        self._writers_lock = threading.Lock()
        # A table dropped without close() releases the writers it opened for routed writes
        # (their writes are in the WAL); a writer handed to the caller stays the caller's.
        weakref.finalize(self, _release_in_background, self._writers)
        # Every writer this object opened, by region, so this process's reads see its MemTables.
        self._live: weakref.WeakValueDictionary[str, RegionWriter] = weakref.WeakValueDictionary()
        self._maintained_cache: tuple[int, list[Any]] | None = None
        self._details_cache: tuple[int, MemWalIndexDetails] | None = None
        self._snapshots_cache: tuple[tuple[int, int], list[RegionManifest] | None] | None = None
        # The newest manifest seen per region: a snapshot re-reads one only if a newer exists.
        self.known_manifests: dict[str, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    # ---- base table ---------------------------------------------------------------------------

    def dataset(self, version: int | None = None) -> lance.LanceDataset:
        """The base Lance dataset (latest version unless ``version`` is given).

        Every open shares one Lance session, so index and metadata caches (the primary-key
        btree that point lookups probe) survive from one snapshot to the next.
        """
        what = f"opening {self.uri}" + (f" at version {version}" if version else "")
        return self.store.run_io(
            what,
            lambda: lance.dataset(
                self.uri,
                version=version,
                storage_options=self.storage_options or None,
                session=self._session,
            ),
        )

    def follow_schema(self, dataset: lance.LanceDataset) -> bool:
        """Take the schema of ``dataset`` (the latest base version) if a schema change since
        the last one this table saw gave it new or widened columns (``tbl.add_columns`` here
        or in another process): reads return it, and writers opened from now on write it.
        Writers opened before keep theirs; reads fill their rows' missing columns with NULL.
        Returns whether the schema changed.
        """
        if dataset.version == self._schema_version:
            return False
        self._schema_version = dataset.version
        schema = table_schema(dataset.schema)  # built anew on each access: once per version
        if schema.equals(self.schema):
            return False
        self.schema = schema
        self._rows = RowCoercer(schema, self.primary_key)
        self._layout = dataclasses.replace(
            self._layout, base_schema=schema, field_ids=_own_field_ids(dataset, schema)
        )
        return True

    # ---- regions ------------------------------------------------------------------------------

    def regions(self) -> list[str]:
        """Ids of every region that has a directory under ``_mem_wal/``."""
        out = []
        for name in self.store.list_dirs(layout.MEM_WAL_DIR):
            try:
                out.append(str(uuid.UUID(name)))
            except ValueError:
                continue
        return out

    def region_manifests(self) -> list[tuple[str, RegionManifest]]:
        """Each region's latest manifest, in region-id order (regions without one left out).

        Example:
            ``{rid: m.current_generation for rid, m in tbl.region_manifests()}``
        """
        out = []
        for rid in self.regions():
            manifest = RegionManifestStore(self.store, rid).latest()
            if manifest is not None:
                out.append((rid, manifest))
        return out

    def writer(
        self,
        region_id: str | None = None,
        *,
        region_values: Sequence[Any] | None = None,
        **config: Any,
    ) -> RegionWriter:
        """Claim a region and return its :class:`RegionWriter` (a context manager).

        ``region_values`` names the region by its region-spec values (e.g. ``(3,)`` for bucket 3);
        ``region_id`` names an existing region (on a table without a region spec, any new id
        makes a manual region, as Lance's shard ids do). With neither, an unsharded table's single
        region is claimed; a table without a region spec claims its fixed default region
        (:data:`DEFAULT_REGION_ID`). Keyword arguments override :class:`WriterConfig` options
        for this writer.

        Example:
            ``with tbl.writer(region_values=(0,), durable_write=False) as w: w.upsert(batch)``
        """
        cfg = self.writer_config.with_overrides(**config)
        # A writer opened after a schema change, in any process, writes the new schema: one
        # opened with an older one would drop a newer writer's columns when it replays the WAL.
        self.follow_schema(self.dataset())
        spec = self.region_spec
        if region_values is not None:
            if spec is None:
                raise InvalidInputError("region_values needs a table with a region spec")
            values = tuple(region_values)
            rid = region_id_for(spec, values)
            if region_id is not None and layout.region_id_of(region_id) != rid:
                raise InvalidInputError(f"region {region_id} does not hold values {values}")
            return self._track(RegionWriter(self._layout, rid, region_values=values, config=cfg))
        if region_id is not None:
            rid = layout.region_id_of(region_id)
            # Without a region spec, regions are manual (as Lance's shard ids): any id may be
            # claimed. With one, a region exists once a writer of its values claimed it.
            if (
                spec is not None
                and rid not in self.regions()
                and rid not in self.merged_generations()
            ):  # a lost region: the claim says so
                raise UnknownRegionError(
                    f"no region {rid} in {self.uri}; known regions: {self.regions()[:5]}"
                )
            return self._track(RegionWriter(self._layout, rid, config=cfg))
        if spec is None:
            # One fixed region, so every process's table.upsert of a key reaches the same one.
            return self._track(RegionWriter(self._layout, DEFAULT_REGION_ID, config=cfg))
        if all(f.transform == "unsharded" for f in spec.fields):
            values = (0,)
            return self._track(
                RegionWriter(
                    self._layout, region_id_for(spec, values), region_values=values, config=cfg
                )
            )
        raise InvalidInputError(
            f"this table is split into regions by {spec.describe()}; pass region_values=(...) "
            "or region_id=..., or write through table.upsert() which routes rows"
        )

    def _track(self, writer: RegionWriter) -> RegionWriter:
        self._live[writer.region_id] = writer
        return writer

    def live_writers(self) -> dict[str, RegionWriter]:
        """This object's open, healthy writers by region id (their MemTables are readable)."""
        return {rid: w for rid, w in list(self._live.items()) if w.is_open}

    @property
    def wal_schema(self) -> pa.Schema:
        """The schema of WAL entries and generations: base columns then ``_tombstone``."""
        return self._rows.schema

    def mem_wal_details(self, dataset: lance.LanceDataset | None = None) -> MemWalIndexDetails:
        """The MemWAL index details of a base version (default: the latest; empty for a version
        from before MemWAL was enabled).

        Example:
            ``tbl.mem_wal_details().num_regions``
        """
        ds = dataset if dataset is not None else self.dataset()
        cached = self._details_cache
        if cached is not None and cached[0] == ds.version:  # a version's manifest never changes
            return cached[1]
        details = read_mem_wal_details(self.store, ds.version) or MemWalIndexDetails()
        self._details_cache = (ds.version, details)
        return details

    def merged_generations(self, dataset: lance.LanceDataset | None = None) -> dict[str, int]:
        """The newest generation of each region already merged into the base table."""
        return region_generations(self.mem_wal_details(dataset).merged_generations)

    def maintained_indexes(
        self, dataset: lance.LanceDataset | None = None
    ) -> list[MaintainedIndex]:
        """The base-table indexes writers maintain (each flushed generation builds them),
        as :class:`~memwal_sql.formats.maintained_indexes.MaintainedIndex` es; read once per base
        version."""
        ds = dataset or self.dataset()
        cached = self._maintained_cache
        if cached is None or cached[0] != ds.version:
            cached = (
                ds.version,
                maintained_indexes(ds, self.mem_wal_details(ds), self.storage_options or None),
            )
            self._maintained_cache = cached
        return cached[1]

    def region_snapshots(
        self, dataset: lance.LanceDataset | None = None
    ) -> list[RegionManifest] | None:
        """The region manifests as of the MemWAL index's last region snapshot (None: none
        taken, or unreadable); eventual-consistency reads use it.

        Example:
            ``[m.current_generation for m in tbl.region_snapshots() or []]``
        """
        details = self.mem_wal_details(dataset)
        inline = details.inline_snapshots if details.HasField("inline_snapshots") else b""
        key = (details.snapshot_ts_millis, hash(inline))
        cached = self._snapshots_cache
        if cached is None or cached[0] != key:
            cached = (
                key,
                load_region_snapshots(
                    details, self.region_spec, self.store.uri_for, self.storage_options or None
                ),
            )
            self._snapshots_cache = cached
        return cached[1]

    def _check_open(self) -> None:
        if self._closed:
            raise TableClosedError(
                f"{self.uri} was closed; open it again with mw.open_table(uri) to write"
            )


def sequence_column_of(schema: pa.Schema) -> str | None:
    """The column ``schema`` marks as the table's sequence column, if any.

    Example:
        >>> f = pa.field("ts", pa.int64(), metadata={SEQUENCE_METADATA: "true"})
        >>> sequence_column_of(pa.schema([("id", pa.int64()), f]))
        'ts'
    """
    for f in schema:
        if f.metadata and f.metadata.get(SEQUENCE_METADATA) == b"true":
            return f.name
    return None


def table_schema(schema: pa.Schema) -> pa.Schema:
    """The table's schema, as reads return it and writers write it: the base dataset's, without
    schema metadata and without a column a type widening is still filling.

    Example:
        >>> hidden = pa.field("n_wide", pa.int64(), metadata={WIDENS_METADATA: "n"})
        >>> table_schema(pa.schema([("n", pa.int32()), hidden])).names
        ['n']
    """
    return pa.schema([f for f in schema if not (f.metadata and WIDENS_METADATA in f.metadata)])


def _own_field_ids(dataset: lance.LanceDataset, schema: pa.Schema) -> tuple[int, ...] | None:
    """The base's field ids of ``schema``'s columns, or None if they are their positions (as in
    every dataset ``lance.write_dataset`` makes: a type widening is what changes them)."""
    ids = field_ids(dataset.lance_schema, schema.names)
    return None if ids == tuple(range(len(ids))) else ids


def _weak_call(method: Callable[[], Any], default: Callable[[], Any]) -> Callable[[], Any]:
    """``method()`` while its object lives, else ``default()``."""
    ref = weakref.WeakMethod(method)

    def call() -> Any:
        bound = ref()
        return bound() if bound is not None else default()

    return call


def _release_in_background(writers: dict[str, RegionWriter]) -> None:
    """Release ``writers`` on another thread: a finalizer may run on a writer's own thread,
    which the release joins."""
    if writers:
        found = list(writers.values())

        def release() -> None:
            for w in found:
                w.release()

        threading.Thread(target=release, name="memwal-release", daemon=True).start()
