"""MemWalTable: a Lance base table plus its MemWAL regions, and how to create or open one.

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> schema = pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())])
    >>> tbl = mw.create_table(tempfile.mkdtemp(), schema, primary_key="id",
    ...                       region_spec=mw.RegionSpec.bucket("id", 4))
    >>> tbl.upsert({"id": [1, 2, 3], "v": ["a", "b", "c"]})
    >>> tbl.delete([2])
    >>> tbl.close()
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, overload
from urllib.parse import urlparse

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails
from memwal_sql._proto.memwal_pb2 import RegionSpec as RegionSpecProto
from memwal_sql.compat.lance import is_not_found
from memwal_sql.errors import (
    AuthenticationError,
    DuplicateKeyError,
    InvalidInputError,
    InvalidRegionSpecError,
    InvalidSnapshotError,
    MemWalError,
    PrimaryKeyError,
    SchemaMismatchError,
    TableExistsError,
    TableNotFoundError,
    WriterFencedError,
)
from memwal_sql.formats.bloom import is_supported_pk_type
from memwal_sql.formats.debezium import Changes, decode_debezium
from memwal_sql.formats.memwal_index import (
    create_mem_wal_index,
    has_mem_wal_index,
)
from memwal_sql.formats.merged_tombstones import read_merged_tombstones
from memwal_sql.formats.snapshot_tags import (
    check_tag_name,
    delete_tag,
    put_tag,
    read_tag,
    read_tags,
)
from memwal_sql.formats.snapshot_token import decode_token
from memwal_sql.formats.source_rows import FOUND
from memwal_sql.maintenance import (
    CatchupResult,
    CompactionResult,
    GcResult,
    MaintenanceConfig,
    MaintenanceResult,
    MergeResult,
    SnapshotResult,
    TableMaintenance,
    VerifyReport,
    add_columns,
    alter_columns,
)
from memwal_sql.metrics import TableMetrics, forget, observe, table_metrics
from memwal_sql.partitioning.region_spec import RegionSpec
from memwal_sql.read_snapshot import (
    Consistency,
    PinnedSnapshot,
    ReadAt,
    pin_snapshot,
    take_read_snapshot,
)
from memwal_sql.storage import ObjectStore, layout, storage_error, storage_failures
from memwal_sql.storage.store import is_access_denied, with_default_timeouts
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import KeySet
from memwal_sql.table_state import SEQUENCE_METADATA, TableState, table_schema
from memwal_sql.writer.config import WriterConfig
from memwal_sql.writer.gate import WriteGate
from memwal_sql.writer.memtable import (
    duplicate_keys,
    latest_per_key,
    newest_per_key,
    newest_positions,
)
from memwal_sql.writer.region_writer import RegionWriter

if TYPE_CHECKING:  # imported on first use: the read side pulls in DataFusion
    import pandas
    import polars

    from memwal_sql.changes import ChangeMode
    from memwal_sql.reads import TableReads
    from memwal_sql.search import IndexInfo, SearchQuery, TableSearch
from memwal_sql.formats.wal import TOMBSTONE
from memwal_sql.writer.rows import Keys, RowCoercer, WriteData, WriteKind, to_arrow_table

PK_METADATA = b"lance-schema:unenforced-primary-key"
_LANCE_TAG = "memwal-snapshot-"  # the Lance tag that keeps a tagged snapshot's base version


class MemWalTable(TableState):
    """A table open for MemWAL writes, reads, searches and maintenance.

    ``tbl.maintenance`` (a :class:`~memwal_sql.maintenance.TableMaintenance`) holds the
    maintenance jobs and the table's default :class:`~memwal_sql.MaintenanceConfig`;
    ``tbl.merge()``, ``tbl.gc()``, ``tbl.maintain()`` and the like are short ways to them.
    """

    def __init__(
        self, *args: Any, maintenance: MaintenanceConfig | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.maintenance = TableMaintenance(self, maintenance)
        self._reads_impl: TableReads | None = None
        self._search_impl: TableSearch | None = None
        self._gate = WriteGate()
        # A sequence table's merged deletes (version, their keys, their newest rows).
        self._merged_tombstones: tuple[int | None, KeySet | None, pa.Table | None] = (
            None,
            None,
            None,
        )
        observe(self)

    # ---- reads (implemented in memwal_sql.reads) ---------------------------------------------

    @property
    def _reads(self) -> TableReads:
        # Imported on first use: the read side pulls in DataFusion, the planner and exec nodes.
        if self._reads_impl is None:
            from memwal_sql.reads import TableReads

            self._reads_impl = TableReads(self)
        return self._reads_impl

    def to_arrow(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        *,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
        with_system_columns: bool = False,
    ) -> pa.Table:
        """The latest row of every key (deletes removed), optionally projected and filtered.

        ``filter`` is a SQL predicate, evaluated on each key's newest version.
        ``with_system_columns`` adds ``_gen`` (-1 = base table) and ``_rowaddr``.

        Example:
            ``tbl.to_arrow(["id", "score"], filter="score > 0.5")``
        """
        return self._reads.to_arrow(
            columns, filter, self._read_at(consistency, as_of), with_system_columns
        )

    def scan(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        *,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
        with_system_columns: bool = False,
    ) -> pa.RecordBatchReader:
        """Like :meth:`to_arrow`, streamed as a RecordBatchReader.

        Example:
            ``for batch in tbl.scan(["id"], filter="id > 10"): ...``
        """
        return self._reads.scan(
            columns, filter, self._read_at(consistency, as_of), with_system_columns
        )

    def to_pandas(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        *,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
    ) -> pandas.DataFrame:
        """Like :meth:`to_arrow`, as a pandas DataFrame (needs pandas).

        Example:
            ``tbl.to_pandas(["id", "score"], filter="score > 0.5")``
        """
        return self.to_arrow(columns, filter, consistency=consistency, as_of=as_of).to_pandas()

    def to_polars(
        self,
        columns: Sequence[str] | None = None,
        filter: str | None = None,
        *,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
    ) -> polars.DataFrame:
        """Like :meth:`to_arrow`, as a polars DataFrame (needs polars: ``pip install polars``).

        Example:
            ``tbl.to_polars(filter="score > 0.5")``
        """
        try:
            import polars
        except ImportError as e:
            raise ImportError("to_polars() needs polars: pip install polars") from e
        frame = polars.from_arrow(
            self.to_arrow(columns, filter, consistency=consistency, as_of=as_of)
        )
        assert isinstance(frame, polars.DataFrame)  # from a table, never a Series
        return frame

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """The latest rows as an Arrow C stream (the Arrow PyCapsule interface), so that any
        library that takes one reads the table directly: ``pa.table(tbl)``,
        ``polars.DataFrame(tbl)``, DuckDB's ``SELECT * FROM tbl``. Each call reads a fresh
        snapshot, with ``consistency="strong"``."""
        return self.scan().__arrow_c_stream__(requested_schema)

    def count_rows(
        self,
        filter: str | None = None,
        *,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
    ) -> int:
        """Number of live keys (matching ``filter``).

        Example:
            ``tbl.count_rows("score > 0.5")``
        """
        return self._reads.count_rows(filter, self._read_at(consistency, as_of))

    def lookup(
        self,
        keys: Keys,
        columns: Sequence[str] | None = None,
        *,
        align: bool = False,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
        with_system_columns: bool = False,
    ) -> pa.Table:
        """The latest live row of each key: an array or list of keys, or a table of the key
        columns (composite keys). The key columns are always returned, ahead of ``columns``.

        By default each distinct key found gives one row, in the order the keys first occur;
        absent and deleted keys are left out. With ``align=True`` the result has one row per
        input key, in input order (repeats repeated), and a last column ``_found``: false for
        a key that is absent or deleted, whose row holds the key and nulls elsewhere.

        ``keys`` may also be one key value (``tbl.lookup(42)``) and, for a composite key, a
        tuple of its values or a list of tuples (``tbl.lookup([("acme", 7), ("zeta", 1)])``).

        Each source is probed once per call, newest first, generations behind their bloom
        filters, the base table through its primary-key btree.

        Example:
            ``tbl.lookup([3, 1, 42], columns=["name"], align=True)  # id, name, _found; 3 rows``
        """
        return self._reads.lookup(
            keys, columns, self._read_at(consistency, as_of), with_system_columns, align
        )

    def explain(
        self,
        filter: str | None = None,
        columns: Sequence[str] | None = None,
        *,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
    ) -> str:
        """The exec-node tree a read would run: pruned regions, sources, pushed filter (or the
        point-lookup plan for ``pk = v`` / ``pk IN (...)``).

        Example:
            ``print(tbl.explain("score > 0.5"))``
        """
        return self._reads.explain(filter, columns, self._read_at(consistency, as_of))

    def explain_lookup(self, keys: Keys, *, consistency: Consistency = "strong") -> str:
        """The point-lookup plan of ``keys`` (see :meth:`lookup`).

        Example:
            ``print(tbl.explain_lookup([1, 2]))``
        """
        return self._reads.explain_lookup(keys, consistency)

    def _read_at(self, consistency: Consistency, as_of: PinnedSnapshot | None) -> ReadAt:
        if as_of is None:
            return consistency
        if not isinstance(as_of, PinnedSnapshot):
            raise InvalidSnapshotError(
                f"as_of takes a snapshot (tbl.snapshot() or tbl.snapshot(token)), not {as_of!r}"
            )
        if as_of.table.uri != self.uri:
            raise InvalidSnapshotError(f"that snapshot is of {as_of.table.uri}, not {self.uri}")
        return as_of

    # ---- pinned snapshots and the change feed ------------------------------------------------

    def snapshot(self, token: str | None = None, *, tag: str | None = None) -> PinnedSnapshot:
        """Pin the table's state now (every write acknowledged before the call, and none
        after), or restore a pinned snapshot from its ``token`` or its ``tag``. Pass it as
        ``as_of=`` to a read, register it in a SQL session, or give two to :meth:`changes`.

        A snapshot reads the same rows later, after flushes, merges and compaction, while
        garbage collection keeps its base version (``base_versions_older_than``, an hour by
        default) or a tag keeps it; after that a read is a
        :class:`~memwal_sql.errors.SnapshotExpiredError`.

        Example:
            ``snap = tbl.snapshot(); token = snap.token; mw.open_table(uri).snapshot(token)``
        """
        self._check_open()
        if token is not None and tag is not None:
            raise InvalidInputError("give a token or a tag, not both")
        if tag is not None:
            token = read_tag(self.store, tag)
        if token is None:
            return pin_snapshot(self)
        return PinnedSnapshot(self, decode_token(token))

    def tag(self, name: str, snapshot: PinnedSnapshot | None = None) -> PinnedSnapshot:
        """Keep ``snapshot`` (one taken now if None) readable until :meth:`untag`: garbage
        collection keeps what it reads, and its base version stays (a Lance tag
        ``memwal-snapshot-{name}`` on it). Returns the snapshot.

        Example:
            ``tbl.tag("before-backfill"); ...; tbl.snapshot(tag="before-backfill")``
        """
        self._check_open()
        check_tag_name(name)
        snap = self.snapshot() if snapshot is None else self._read_at("strong", snapshot)
        assert isinstance(snap, PinnedSnapshot)
        # Readable now (its version and generations there), and kept from here on.
        take_read_snapshot(self, snap)
        put_tag(self.store, name, snap.token)
        try:
            self.dataset().tags.create(_LANCE_TAG + name, snap.base_version)
        except Exception:
            delete_tag(self.store, name)
            raise
        return snap

    def untag(self, name: str) -> None:
        """Remove tag ``name``: what only it kept goes at the next GC past the retention.

        Example:
            ``tbl.untag("before-backfill")``
        """
        self._check_open()
        delete_tag(self.store, name)
        ds = self.dataset()
        if _LANCE_TAG + name in ds.tags.list():
            ds.tags.delete(_LANCE_TAG + name)

    def tags(self) -> dict[str, PinnedSnapshot]:
        """Every tag's name and snapshot.

        Example:
            ``{name: s.base_version for name, s in tbl.tags().items()}``
        """
        return {n: PinnedSnapshot(self, decode_token(t)) for n, t in read_tags(self.store).items()}

    def changes(
        self,
        start: PinnedSnapshot | str,
        end: PinnedSnapshot | str | None = None,
        *,
        mode: ChangeMode = "net",
    ) -> pa.Table:
        """What changed from snapshot ``start`` to ``end`` (now, if None): the table's columns
        plus ``_change_type`` (``insert``, ``update_preimage``, ``update_postimage``,
        ``delete``) and ``_commit_position`` (orderable among a key's changes). Snapshots may
        be given as tokens.

        ``mode="net"``: per key written in between, its row at ``start`` and its row at
        ``end``; ``mode="all"``: every write, in order. Merges and compaction are no changes.
        The cost is the writes in between, not the table.

        Example:
            ``a = tbl.snapshot(); ...; tbl.changes(a).to_pandas()``
        """
        from memwal_sql.changes import change_feed

        begin = start if isinstance(start, PinnedSnapshot) else self.snapshot(start)
        finish = (
            self.snapshot()
            if end is None
            else end
            if isinstance(end, PinnedSnapshot)
            else self.snapshot(end)
        )
        for snap in (begin, finish):
            self._read_at("strong", snap)
        return change_feed(self._reads, begin, finish, mode)

    # ---- search (implemented in memwal_sql.search) ----------------------------------------------

    @property
    def _search(self) -> TableSearch:
        if self._search_impl is None:
            from memwal_sql.search import TableSearch

            self._search_impl = TableSearch(self, self._reads)
        return self._search_impl

    def create_index(
        self,
        column: str,
        index_type: str,
        *,
        name: str | None = None,
        replace: bool = True,
        **params: Any,
    ) -> IndexInfo:
        """Create an index on the base table and maintain it: ``IVF_PQ``, ``IVF_FLAT``,
        ``IVF_HNSW_SQ`` (vectors; ``params`` as Lance's ``create_index`` takes them) or
        ``INVERTED``, ``BTREE`` (scalar; as ``create_scalar_index``). The index is recorded in
        the MemWAL index's ``maintained_indexes``. Returns its
        :class:`~memwal_sql.search.IndexInfo`.

        Example:
            ``tbl.create_index("vec", "IVF_PQ", num_partitions=16, num_sub_vectors=8)``
        """
        from memwal_sql.search import create_index

        return self.store.run_io(
            f"creating an index on {self.uri}",
            lambda: create_index(self, column, index_type, name=name, replace=replace, **params),
        )

    def list_indexes(self) -> list[IndexInfo]:
        """The base table's indexes: type, columns, whether writers maintain them, and how
        far each has caught up with the merged generations
        (:class:`~memwal_sql.search.IndexInfo`).

        Example:
            ``[(i.name, i.caught_up) for i in tbl.list_indexes()]``
        """
        from memwal_sql.search import list_indexes

        return list_indexes(self)

    def vector_search(
        self,
        query: Any,
        column: str | None = None,
        k: int = 10,
        filter: str | None = None,
        *,
        nprobes: int | None = None,
        refine_factor: int | None = None,
        metric: str | None = None,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
    ) -> pa.Table:
        """The ``k`` rows nearest to ``query`` among the latest rows (fresh writes included,
        stale versions and deleted keys never), as the table's columns plus ``_distance``,
        nearest first.

        ``filter`` (SQL) applies to each row's latest version. ``metric`` is the index's
        (else ``l2``); ``nprobes`` and ``refine_factor`` tune the base table's ANN index
        (a quantized index is refined over ``10 * k`` candidates by default, ``2 * k`` for
        a PQ index of at most 2 dimensions per sub-vector).

        Example:
            ``tbl.vector_search([0.1, 0.2, 0.3], k=5, filter="category = 'a'")``
        """
        from memwal_sql.search import SearchQuery

        return self.search(
            SearchQuery(
                query=query,
                column=column,
                k=k,
                filter=filter,
                nprobes=nprobes,
                refine_factor=refine_factor,
                metric=metric,
                consistency=self._read_at(consistency, as_of),
                kind="vector",
            )
        )

    def fts(
        self,
        query: str,
        column: str | None = None,
        k: int = 10,
        filter: str | None = None,
        *,
        consistency: Consistency = "strong",
        as_of: PinnedSnapshot | None = None,
    ) -> pa.Table:
        """The ``k`` latest rows that best match ``query`` by BM25, as the table's columns plus
        ``_score``, best first. Scores are computed over the latest corpus (superseded and
        deleted rows left out), so they equal what Lance's full-text search gives on the fully
        merged table; the text is tokenized as the base table's inverted index on ``column``
        says. ``filter`` (SQL) applies to each row's latest version.

        Example:
            ``tbl.fts("quick brown fox", k=5, filter="lang = 'en'")``
        """
        from memwal_sql.search import SearchQuery

        return self.search(
            SearchQuery(
                query=query,
                column=column,
                k=k,
                filter=filter,
                consistency=self._read_at(consistency, as_of),
                kind="fts",
            )
        )

    def search(self, query: SearchQuery) -> pa.Table:
        """Run one search (:class:`~memwal_sql.SearchQuery`): a full-text search for a text
        query (as :meth:`fts`), else a vector search (as :meth:`vector_search`).

        Example:
            ``tbl.search(mw.SearchQuery(query=[0.1, 0.2, 0.3], k=5, nprobes=8))``
        """
        return self._search.search(query)

    def explain_search(
        self,
        query: Any,
        column: str | None = None,
        k: int = 10,
        filter: str | None = None,
        **options: Any,
    ) -> str:
        """Run a search and show its plan: the sources searched, the regions pruned, and what
        was left out as stale or deleted (a text ``query`` runs :meth:`fts`, a vector
        :meth:`vector_search`).

        Example:
            ``print(tbl.explain_search([0.1, 0.2, 0.3], k=5))``
        """
        from memwal_sql.search import SearchQuery

        self.search(SearchQuery(query=query, column=column, k=k, filter=filter, **options))
        plan = self._search.last_plan
        assert plan is not None  # the search above set it
        return plan.explain()

    # ---- maintenance (implemented in memwal_sql.maintenance; thin entries to tbl.maintenance) --

    def merge(
        self,
        *,
        max_generations_per_region: int | None = None,
        regions: Sequence[str] | None = None,
    ) -> MergeResult:
        """:meth:`TableMaintenance.merge <memwal_sql.maintenance.TableMaintenance.merge>` with
        the table's maintenance config, ``max_generations_per_region`` changed if given.

        Example:
            ``tbl.flush(); tbl.merge().merged``
        """
        config = self.maintenance.config.updated(
            max_generations_per_region=max_generations_per_region
        )
        return self.maintenance.merge(config, regions=regions)

    def gc(
        self,
        *,
        keep_manifest_versions: int | None = None,
        base_versions_older_than: timedelta | None = None,
    ) -> GcResult:
        """:meth:`TableMaintenance.gc <memwal_sql.maintenance.TableMaintenance.gc>` with the
        table's maintenance config, the settings given (not ``None``) changed.

        Example:
            ``tbl.merge(); tbl.gc(base_versions_older_than=timedelta(hours=1)).objects``
        """
        config = self.maintenance.config.updated(
            keep_manifest_versions=keep_manifest_versions,
            base_versions_older_than=base_versions_older_than,
        )
        return self.maintenance.gc(config)

    def catch_up_indexes(self) -> CatchupResult:
        """:meth:`TableMaintenance.catch_up_indexes
        <memwal_sql.maintenance.TableMaintenance.catch_up_indexes>`.

        Example:
            ``tbl.merge(); tbl.catch_up_indexes().caught_up``
        """
        return self.maintenance.catch_up_indexes()

    def compact(
        self,
        *,
        target_rows_per_fragment: int | None = None,
        deletion_threshold: float | None = None,
    ) -> CompactionResult:
        """:meth:`TableMaintenance.compact <memwal_sql.maintenance.TableMaintenance.compact>`
        with the table's maintenance config, the settings given (not ``None``) changed.

        Example:
            ``tbl.merge(); tbl.compact().fragments_removed``
        """
        config = self.maintenance.config.updated(
            target_rows_per_fragment=target_rows_per_fragment,
            deletion_threshold=deletion_threshold,
        )
        return self.maintenance.compact(config)

    def build_region_snapshots(self) -> SnapshotResult:
        """:meth:`TableMaintenance.build_region_snapshots
        <memwal_sql.maintenance.TableMaintenance.build_region_snapshots>`.

        Example:
            ``tbl.build_region_snapshots().regions``
        """
        return self.maintenance.build_region_snapshots()

    def maintain(
        self,
        *,
        base_versions_older_than: timedelta | None = None,
        keep_manifest_versions: int | None = None,
        target_rows_per_fragment: int | None = None,
        deletion_threshold: float | None = None,
        recover_regions_idle_for: timedelta | None = None,
    ) -> MaintenanceResult:
        """One maintenance pass (:meth:`TableMaintenance.run
        <memwal_sql.maintenance.TableMaintenance.run>`) with the table's maintenance config,
        the settings given (not ``None``) changed.

        Example:
            ``r = tbl.maintain(); assert r.ok, r.failures``
        """
        config = self.maintenance.config.updated(
            base_versions_older_than=base_versions_older_than,
            keep_manifest_versions=keep_manifest_versions,
            target_rows_per_fragment=target_rows_per_fragment,
            deletion_threshold=deletion_threshold,
            recover_regions_idle_for=recover_regions_idle_for,
        )
        return self.maintenance.run(config)

    def verify(self, progress: Callable[[int], object] | None = None) -> VerifyReport:
        """:meth:`TableMaintenance.verify <memwal_sql.maintenance.TableMaintenance.verify>`:
        damage is reported, not raised.

        Example:
            ``report = tbl.verify(); assert report.ok, report.summary()``
        """
        return self.maintenance.verify(progress)

    def metrics(self) -> TableMetrics:
        """A snapshot of the table's metrics (:class:`~memwal_sql.TableMetrics`): per region,
        the WAL entries and rows this object's writers put, the WAL rows no generation holds
        yet, generations, unmerged rows and merge lag; and the cache's hits, misses and
        evictions. Computed now, from what ``memwal inspect`` reads; the same numbers are
        OpenTelemetry instruments (:mod:`memwal_sql.metrics`).

        Example:
            ``m = tbl.metrics(); m.region(rid).unflushed_rows, m.cache.hits``
        """
        return table_metrics(self, self._layout.written)

    def apply_changes(self, events: Iterable[Any], format: str = "debezium") -> Changes:
        """Apply change events: Debezium's JSON envelopes (dicts, JSON text or bytes, None for
        a Kafka tombstone) in the order given, as :meth:`upsert` and :meth:`delete` of each
        key's last event; returns what they did.

        Example:
            ``tbl.apply_changes(kafka_values, format="debezium").upserts``
        """
        self._check_open()
        if format != "debezium":
            raise InvalidInputError(f"format must be 'debezium', not {format!r}")
        changes = decode_debezium(events, self.primary_key, self.sequence_column)
        # Debezium's JSON gives dates as days and timestamps in epoch units: Arrow takes both.
        if changes.upserts:
            self.upsert(pa.Table.from_pylist(changes.upserts, schema=self.schema))
        if changes.deletes:
            columns = self.delete_columns
            lacking = {c for r in changes.deletes for c in columns if c not in r}
            if lacking:
                raise InvalidInputError(
                    f"Debezium deletes lack the region column(s) {sorted(lacking)} this table's "
                    "regions are split by: send whole 'before' rows (PostgreSQL: REPLICA "
                    "IDENTITY FULL), or delete with tbl.delete(rows holding those columns)"
                )
            keys = pa.schema([self.schema.field(c) for c in columns])
            self.delete(pa.Table.from_pylist(changes.deletes, schema=keys))
        return changes

    # ---- schema evolution --------------------------------------------------------------------

    def add_columns(self, columns: Mapping[str, pa.DataType] | Sequence[pa.Field]) -> None:
        """Add nullable columns, NULL in every row written before (one base-table commit).

        Routed writes (:meth:`upsert`) take the new columns at once; a writer opened before
        (here or in another process) keeps writing its schema, and its rows read with NULL in
        the new columns. Other processes' reads see the columns from their next query.

        Example:
            ``tbl.add_columns({"score": pa.float64()}); tbl.upsert({"id": [1], "score": [0.5]})``
        """
        self._check_open()
        add_columns(self, columns)

    def alter_columns(self, *changes: Mapping[str, Any]) -> None:
        """Make non-key columns nullable (``{"path": name, "nullable": True}``) or widen their
        types (``{"path": name, "data_type": pa.int64()}``: int32 to int64, float32 to float64,
        and the like), while writers write. Writers opened before keep writing the old type,
        which reads and merges widen. Any other type change is a
        :class:`~memwal_sql.errors.SchemaMismatchError`.

        Example:
            ``tbl.alter_columns({"path": "n", "data_type": pa.int64()})``
        """
        self._check_open()
        alter_columns(self, *changes)

    # ---- routed writes -----------------------------------------------------------------------

    def upsert(self, data: WriteData) -> None:
        """Insert or replace rows, routed to their regions' writers in this process.

        Rows are validated and cast to the table's types first, then routed: a key's region
        never depends on the type it was handed in (an int32 key hashes as the table's int64).

        Example:
            ``tbl.upsert(pa.table({"id": [1], "v": ["x"]}))``
        """
        self._check_open()
        try:
            rows = self._rows.upserts(data)
        except SchemaMismatchError:
            if not self.follow_schema(self.dataset()):  # a column another process added?
                raise
            rows = self._rows.upserts(data)
        if self.sequence_column is not None:
            rows, routing = self._newest(rows, rows)
            self._write_current(
                pa.table(rows.select(list(self.primary_key))),
                lambda current: self._drop_older(rows, routing, current),
            )
            return
        self._refuse_region_changes(rows, rows)
        with self._gate.shared():
            self._append_all(self._route(rows, rows), "upserts")

    def update(self, data: WriteData) -> None:
        """Partial update: ``data`` holds the key columns and any of the others; only those
        change (an explicit NULL sets NULL), a key not present is inserted with the others
        NULL, and the last row of a key repeated in ``data`` wins.

        Each key's latest row is read and the updated whole row written (copy on write), so
        every reader, Lance's included, sees whole rows. The read and the write are atomic:
        the regions' writers are claimed first (a write from another process fences them and
        this call fails with ``WriterFencedError``), and no routed write of this table object
        lands between them.

        Example:
            ``tbl.update({"id": [1, 2], "score": [0.9, None]})  # other columns kept``
        """
        self._check_open()
        seq = self.sequence_column
        partial = self._rows.partial(data)
        if seq is not None and seq in partial.column_names:
            self._check_sequences(partial.column(seq))
            partial = newest_per_key(partial, self.primary_key, seq)
        else:
            partial = latest_per_key(partial, self.primary_key)

        def rows_for(current: pa.Table) -> tuple[pa.RecordBatch, pa.RecordBatch]:
            if seq is not None and seq not in partial.column_names:
                deleted = pc.fill_null(current.column(TOMBSTONE), False)
                absent = pc.or_(pc.invert(current.column(FOUND)), deleted)
                if pc.any(absent).as_py():
                    raise InvalidInputError(
                        f"{pc.sum(absent).as_py()} of the keys updated are not in the table: "
                        f"a new row needs its sequence, give the {seq!r} column"
                    )
            # A deleted key's tombstone holds only its key and sequence: the columns not
            # given are NULL, as for a key never written.
            rows = self._rows.upserts(_overlay(current, partial, self.schema))
            return self._drop_older(rows, rows, current) if seq is not None else (rows, rows)

        self._write_current(partial.select(list(self.primary_key)), rows_for)

    def _write_current(
        self,
        keys: pa.Table,
        rows_for: Callable[[pa.Table], tuple[pa.RecordBatch, pa.RecordBatch]],
        kind: WriteKind = "upserts",
    ) -> None:
        """Write ``rows_for(current)``, where ``current`` is the newest version of each of
        ``keys`` (:meth:`_current`), atomically: the regions' writers are claimed before the
        read (a write from another process fences them, and this call fails with
        ``WriterFencedError``), and no routed write of this table object lands between the
        read and the write. ``rows_for`` gives the rows and the batch to route them by."""
        with self._gate.exclusive():
            while True:
                claimed = {id(w) for w in list(self._writers.values())}
                rows, routing = rows_for(self._current(keys))
                prepared = self._route(rows, routing) if rows.num_rows else []
                if {id(w) for w, _ in prepared} <= claimed:
                    break  # the read was made while this table held every region it writes
            self._refuse_region_changes(rows, routing)
            self._append_all(prepared, kind)

    def _current(self, keys: pa.Table) -> pa.Table:
        """The newest row of each of ``keys``, aligned with them (``lookup(align=True)``).
        With a sequence column, a deleted key's row is its tombstone (``_tombstone``), and
        a key no source holds takes the sequence of its merged delete, if any."""
        seq = self.sequence_column
        current = self._reads.lookup(
            keys, None, "strong", False, align=True, tombstones=seq is not None
        )
        if seq is None or pc.all(current.column(FOUND)).as_py():
            return current
        # Read after the lookup's snapshot: a merge that removed a delete from the sources it
        # read recorded the delete here first.
        version, rows = read_merged_tombstones(
            self.store.uri_for(layout.MERGED_TOMBSTONES),
            self.storage_options,
            self._merged_tombstones[0],
        )
        if rows is not None:
            rows = newest_per_key(rows, self.primary_key, seq)
            self._merged_tombstones = (version, KeySet(rows.select(list(self.primary_key))), rows)
        _, merged_keys, merged = self._merged_tombstones
        if merged is None or merged_keys is None:
            return current
        at = merged_keys.positions(keys)
        merged_seq = merged.column(seq).take(pa.array(at, mask=at < 0))
        found = current.column(FOUND)
        return current.set_column(
            current.schema.get_field_index(seq),
            current.schema.field(seq),
            pc.if_else(found, current.column(seq), merged_seq.cast(current.schema.field(seq).type)),
        )

    def _newest(
        self, rows: pa.RecordBatch, routing: pa.RecordBatch
    ) -> tuple[pa.RecordBatch, pa.RecordBatch]:
        """Of a sequence table's write, each key's row with the highest sequence (the later
        one on a tie), and its routing rows."""
        seq = self.sequence_column
        assert seq is not None
        self._check_sequences(rows.column(seq))
        at = newest_positions(rows, self.primary_key, seq)
        if at is None:
            return rows, routing
        return rows.take(at), routing.take(at)

    def _drop_older(
        self, rows: pa.RecordBatch, routing: pa.RecordBatch, current: pa.Table
    ) -> tuple[pa.RecordBatch, pa.RecordBatch]:
        """The rows whose sequence is at least their key's current one (``current``, aligned
        with ``rows``; a key without one takes any row)."""
        seq = self.sequence_column
        assert seq is not None
        self._check_sequences(rows.column(seq))
        have = current.column(seq).combine_chunks()
        keep = pc.fill_null(pc.greater_equal(rows.column(seq), have), True)
        if pc.all(keep).as_py():
            return rows, routing
        return rows.filter(keep), routing.filter(keep)

    def _check_sequences(self, values: pa.Array | pa.ChunkedArray) -> None:
        if values.null_count:
            raise InvalidInputError(
                f"sequence column {self.sequence_column!r} holds {values.null_count} null(s): "
                "every write to this table carries its sequence"
            )

    @property
    def delete_columns(self) -> list[str]:
        """What a delete reaches its rows' regions by: the key columns, then any other column
        the region spec reads; then the sequence column of a table that has one, which a
        delete carries.

        Example:
            ``keys = tbl.to_arrow(tbl.delete_columns, filter="x > 5"); tbl.delete(keys)``
        """
        spec = self.region_spec
        routing = spec.source_columns if spec is not None else ()
        seq = [self.sequence_column] if self.sequence_column is not None else []
        return list(dict.fromkeys([*self.primary_key, *routing, *seq]))

    @overload
    def delete(self, keys: Keys) -> None: ...

    @overload
    def delete(self, *, filter: str) -> int: ...

    def delete(self, keys: Keys | None = None, *, filter: str | None = None) -> int | None:
        """Delete rows by primary key, routed like :meth:`upsert`; or, with ``filter`` (a SQL
        predicate), delete every key whose latest row matches it and return how many.

        ``keys`` is an array of keys (single-column key) or a table of key columns; when the
        region spec reads a non-key column, the table must hold that column too, and so the
        sequence column of a table with one: a delete older than its key's current row
        changes nothing, and an upsert older than the delete stays deleted. A ``filter`` is
        judged on each key's latest row when the delete reads them (as :meth:`to_arrow`
        would); a write to a matched key that lands after that read is deleted too, as in
        Paimon's deletes by predicate, unless it carries a newer sequence (the delete carries
        the matched row's).

        Example:
            ``tbl.delete([1, 2])``; ``n = tbl.delete(filter="x > 5 AND s LIKE 'a%'")``
        """
        self._check_open()
        if (keys is None) == (filter is None):
            raise InvalidInputError("delete takes keys or filter=, not both and not neither")
        if filter is not None:
            matched = self.to_arrow(self.delete_columns, filter)
            if matched.num_rows:
                self.delete(matched)
            return matched.num_rows
        seq = self.sequence_column
        rows, routing = self._rows.deletes_for_regions(
            keys, self.region_spec, carry=[seq] if seq is not None else ()
        )
        if seq is not None:
            rows, routing = self._newest(rows, routing)
            self._write_current(
                pa.table(rows.select(list(self.primary_key))),
                lambda current: self._drop_older(rows, routing, current),
                "deletes",
            )
            return None
        self._refuse_region_changes(rows, routing)
        with self._gate.shared():
            self._append_all(self._route(rows, routing), "deletes")
        return None

    def _refuse_region_changes(self, rows: pa.RecordBatch, routing: pa.RecordBatch) -> None:
        spec = self.region_spec
        if spec is not None and not spec.routes_by_key(self.primary_key) and rows.num_rows:
            from memwal_sql.key_regions import refuse_region_changes

            refuse_region_changes(self, rows, routing)

    def _append_all(
        self, prepared: list[tuple[RegionWriter, pa.RecordBatch]], kind: WriteKind
    ) -> None:
        pending, errors = [], []
        for w, rows in prepared:
            try:
                pending.append((w, w.append_rows(rows, kind)))
            except MemWalError as e:
                errors.append(e)
        # Every region that took its rows is waited for, so when one fails the others' rows
        # are stored too; durable waits of different regions are independent puts, so they go
        # side by side.
        if len(pending) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="memwal-route")
            waits = [(w, self._pool.submit(w.wait_durable, seq).result) for w, seq in pending]
        else:
            waits = [(w, partial(w.wait_durable, seq)) for w, seq in pending]
        done = []
        for w, wait in waits:
            try:
                wait()
                done.append(w.region_id)
            except MemWalError as e:
                errors.append(e)
        if errors:
            # A fenced or failed writer is released (its acknowledged writes are in the WAL) and
            # dropped, so the next write claims its region anew.
            with self._writers_lock:
                dead = [w for w in self._writers.values() if not w.is_open]
                for k in [k for k, w in self._writers.items() if not w.is_open]:
                    del self._writers[k]
            for w in dead:
                w.release()
            if len(prepared) == 1:
                raise errors[0]
            # A new error, so the writer's own (raised again by its later calls) stays as it is.
            first = errors[0]
            raise type(first)(
                f"{first} (regions {done} stored their rows of this call; the others did not)"
            ) from first

    def flush(self) -> None:
        """Flush the MemTable of every writer this table opened (routed or not) to a
        generation, and wait; raises the error of a writer that failed or was fenced."""
        errors = []
        for w in list(self._live.values()):
            if w.closed:
                continue
            try:
                w.flush()
            except MemWalError as e:
                errors.append(e)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Flush and close every writer this table opened; later routed writes
        (:meth:`upsert`, :meth:`delete`) raise :class:`~memwal_sql.errors.TableClosedError`
        instead of claiming regions again, while reads, maintenance and explicit
        :meth:`writer` claims go on working. A writer fenced by another one is left as it is:
        its acknowledged writes are safe in the WAL for the new writer."""
        self._closed = True
        forget(self)
        with self._writers_lock:
            self._writers.clear()
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
        errors = []
        for w in list(self._live.values()):
            try:
                w.close()
            except WriterFencedError:
                pass
            except Exception as e:
                errors.append(e)
        self.store.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> MemWalTable:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _route(
        self, rows: pa.RecordBatch, routing: pa.RecordBatch
    ) -> list[tuple[RegionWriter, pa.RecordBatch]]:
        """Split validated WAL-schema ``rows`` by the region values of ``routing`` (the same
        rows, with any region-spec column they lack filled in)."""
        spec = self.region_spec
        if spec is None:
            return [(self._cached_writer(None), rows)]
        groups = spec.group_rows(routing)
        return [
            (
                self._cached_writer(tuple(values)),
                rows if len(groups) == 1 else rows.take(pa.array(np.asarray(idx))),
            )
            for values, idx in groups.items()
        ]

    def _cached_writer(self, values: tuple[Any, ...] | None) -> RegionWriter:
        key = repr(values)
        with self._writers_lock:
            w = self._writers.get(key)
            if w is not None and not w.wal_schema.equals(self.wal_schema):
                # Opened before a schema change: its MemTable is flushed in the old schema,
                # and a new writer takes the rows in the new one.
                w.close()
                w = None
            if w is None:
                w = self.writer() if values is None else self.writer(region_values=values)
                self._writers[key] = w
            return w


def _overlay(current: pa.Table, partial: pa.Table, schema: pa.Schema) -> pa.Table:
    """Whole rows: ``partial``'s columns over ``current`` (the latest rows of its keys, one
    per key in its order; NULL where a key has none)."""
    return pa.table(
        [
            partial.column(f.name) if f.name in partial.column_names else current.column(f.name)
            for f in schema
        ],
        schema=schema,
    )


def _with_primary_key(schema: pa.Schema, primary_key: Sequence[str]) -> pa.Schema:
    _check_key_types(schema, primary_key)
    if TOMBSTONE in schema.names:
        raise SchemaMismatchError(
            f"{TOMBSTONE!r} is the WAL's deletion marker column; rename the table's column"
        )
    fields = []
    for f in schema:
        if f.name in primary_key:
            meta = dict(f.metadata or {})
            meta[PK_METADATA] = b"true"
            f = f.with_nullable(False).with_metadata(meta)
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def _mark_field(
    ds: lance.LanceDataset, name: str, key: bytes, opts: Mapping[str, str] | None
) -> lance.LanceDataset:
    """``ds`` after setting ``key`` to ``"true"`` in field ``name``'s metadata."""
    meta = {
        (a if isinstance(a, str) else a.decode()): (b if isinstance(b, str) else b.decode())
        for a, b in (ds.schema.field(name).metadata or {}).items()
    }
    meta[key.decode()] = "true"
    ds.replace_field_metadata(name, meta)
    return lance.dataset(ds.uri, storage_options=dict(opts) if opts else None)


def _check_sequence_column(schema: pa.Schema, primary_key: Sequence[str], name: str) -> None:
    if name not in schema.names:
        raise SchemaMismatchError(f"sequence column {name!r} is not in the schema {schema.names}")
    if name in primary_key:
        raise InvalidInputError(f"sequence column {name!r} is a key column; pick another")
    t = schema.field(name).type
    if not (
        pa.types.is_integer(t)
        or pa.types.is_decimal(t)
        or pa.types.is_temporal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
    ):
        raise SchemaMismatchError(
            f"sequence column {name!r} has type {t}; a sequence is an integer, decimal, date, "
            "timestamp or string column (a float's NaN has no order)"
        )


def _check_key_types(schema: pa.Schema, primary_key: Sequence[str]) -> None:
    """Refuse a key Lance 14 cannot index before anything is written: a MemTable flush of such
    a key would fail, leaving acknowledged rows stuck in the WAL."""
    missing = [k for k in primary_key if k not in schema.names]
    if missing:
        raise PrimaryKeyError(
            f"primary-key column(s) {missing} are not in the schema {schema.names}"
        )
    for k in primary_key:
        t = schema.field(k).type
        if not is_supported_pk_type(t):
            raise PrimaryKeyError(
                f"primary-key column {k!r} has type {t}; a MemWAL primary key must be an integer, "
                "bool, string or binary column (Lance 14 indexes no other key type)"
            )


def _refuse_duplicate_keys(stored: pa.Table, keys: Sequence[str], uri: str) -> None:
    """:class:`DuplicateKeyError` naming the keys ``stored`` holds more than once."""
    repeated = duplicate_keys(stored, keys)
    if repeated.num_rows:
        shown = repeated.slice(0, 5).to_pylist()
        raise DuplicateKeyError(
            f"{uri} holds {repeated.num_rows} primary key(s) more than once, e.g. {shown}; a "
            "MemWAL table holds each key once. Remove the duplicates first (keep one row per key, "
            "say with lance's merge_insert or delete), then enable MemWAL"
        )


def _normalise_pk(primary_key: str | Sequence[str]) -> list[str]:
    keys = [primary_key] if isinstance(primary_key, str) else list(primary_key)
    if not keys or len(set(keys)) != len(keys):
        raise PrimaryKeyError(f"invalid primary key {primary_key!r}")
    return keys


def _index_details(
    ds: lance.LanceDataset, spec: RegionSpec | None, writer_config: WriterConfig
) -> MemWalIndexDetails:
    details = MemWalIndexDetails(maintain_all_indexes=False)
    details.writer_config_defaults.update(writer_config.to_lance_defaults())
    if spec is not None:
        field_ids = {f.name(): f.id() for f in ds.lance_schema.fields()}
        details.region_specs.append(spec.to_proto(field_ids))
        details.num_regions = spec.num_regions
    return details


# The Lance file formats a new base table can be written in (Lance 14's default is 2.2).
DATA_STORAGE_VERSIONS = ("2.0", "2.1", "2.2")


def create_table(
    uri: str | os.PathLike[str],
    data_or_schema: WriteData | pa.Schema | None = None,
    *,
    primary_key: str | Sequence[str],
    region_spec: RegionSpec | None = None,
    storage_options: Mapping[str, str] | None = None,
    writer_config: WriterConfig | None = None,
    data_storage_version: str | None = None,
    allow_non_key_region_spec: bool = False,
    maintenance: MaintenanceConfig | None = None,
    cache: int | Caches | None = None,
    exist_ok: bool = False,
    sequence_column: str | None = None,
) -> MemWalTable:
    """Create a MemWAL table: the base Lance table with the primary key and the MemWAL index.

    ``data_or_schema`` is initial data (any Arrow-convertible table) or a ``pa.Schema``; as in
    one upsert, the last row of a key given twice wins. Pass ``None`` to enable MemWAL on an
    existing Lance table at ``uri``; one that holds a key twice is refused
    (:class:`~memwal_sql.errors.DuplicateKeyError`), never deduplicated.

    ``region_spec`` defaults to :meth:`RegionSpec.unsharded` (one region). It may read only
    primary-key columns, so a key stays in one region for good (Paimon's rule for
    primary-key tables); ``allow_non_key_region_spec=True`` admits other columns for a table
    whose rows never change them (say, an event's day): a routed write that moves a key while
    its old region holds an unmerged version is then refused, and reads check that no key has
    versions in two regions. ``writer_config`` is recorded in the MemWAL
    index as the table's writer defaults (``writer_config_defaults``), which every later
    :func:`open_table` starts from. ``data_storage_version`` is the Lance file format of the
    new base table, and so of every generation and merge (default: Lance's, ``"2.2"``);
    ``"2.0"`` scans faster and takes more bytes (the README's "Lance file format").
    ``maintenance`` is the returned table object's default maintenance config (see
    :class:`~memwal_sql.maintenance.TableMaintenance`; not stored with the table). ``cache``
    is the table's read caches, as for :func:`open_table`. With ``exist_ok=True`` a MemWAL
    table already at ``uri`` with the same primary key is opened instead (``data_or_schema``
    is then not written), so a script that creates its table can run again.

    ``sequence_column`` (an integer, decimal, date, timestamp or string column, never NULL in
    a write) orders each key's writes: the row with the highest sequence wins whatever order
    writes arrive in, the later one on a tie, and deletes carry it too (the README's "Sequence
    column"). It is recorded in the column's field metadata, which Lance keeps and ignores.

    Example:
        >>> import memwal_sql as mw, pyarrow as pa, tempfile
        >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.schema([("id", pa.int64())]),
        ...                       primary_key="id")
        >>> tbl.primary_key
        ('id',)
    """
    uri = os.fspath(uri)
    caches = Caches.of(cache)
    keys = _normalise_pk(primary_key)
    spec = region_spec if region_spec is not None else RegionSpec.unsharded()
    if not allow_non_key_region_spec and not spec.routes_by_key(keys):
        others = [c for c in spec.source_columns if c not in keys]
        raise InvalidRegionSpecError(
            f"region spec {spec.describe()} reads column(s) {others} outside the primary key "
            f"{keys}: a key whose {', '.join(others)} changed would have versions in two "
            "regions, and the region merged last would win (the MemWAL spec's data-corruption "
            "case). Add the column(s) to the primary key, or region by key columns (say "
            f"RegionSpec.bucket({keys[0]!r}, 8)); if no key's {', '.join(others)} ever "
            "changes, pass allow_non_key_region_spec=True (writes that move a key are then "
            "refused, and every read checks that no key is in two regions)"
        )
    if data_storage_version not in (None, *DATA_STORAGE_VERSIONS):
        raise InvalidInputError(
            f"data_storage_version {data_storage_version!r} is not a Lance file format this "
            f"table can use; pick one of {', '.join(DATA_STORAGE_VERSIONS)}"
        )
    opts = with_default_timeouts(uri, storage_options) or None
    existing = _try_dataset(uri, opts)
    if exist_ok and existing is not None and has_mem_wal_index(existing):
        table = open_table(
            uri, storage_options, writer_config=writer_config, maintenance=maintenance, cache=cache
        )
        if list(table.primary_key) != keys or table.sequence_column != sequence_column:
            table.close()
            raise TableExistsError(
                f"a table with primary key {list(table.primary_key)} and sequence column "
                f"{table.sequence_column!r}, not {keys} and {sequence_column!r}, already "
                f"exists at {uri}; open it with mw.open_table or pick another uri"
            )
        return table
    if data_or_schema is None:
        if existing is None:
            raise TableNotFoundError(
                f"no Lance table at {uri}; pass data or a schema to create one"
            )
        if has_mem_wal_index(existing):
            raise TableExistsError(f"{uri} already has MemWAL enabled; use mw.open_table")
        if data_storage_version not in (None, existing.data_storage_version):
            raise InvalidInputError(
                f"{uri} is stored in Lance format {existing.data_storage_version}; an existing "
                "table keeps its format: leave data_storage_version out"
            )
        ds = existing
        current_pk = [f.name() for f in ds.lance_schema.unenforced_primary_key()]
        if current_pk and current_pk != keys:
            raise PrimaryKeyError(f"{uri} already has primary key {current_pk}, not {keys}")
        if not current_pk:
            _check_key_types(table_schema(ds.schema), keys)
        stored = ds.to_table(columns=keys)
        for k in keys:
            if stored.column(k).null_count:
                raise PrimaryKeyError(f"column {k!r} of {uri} holds nulls; it cannot be a key")
        _refuse_duplicate_keys(stored, keys, uri)
        if sequence_column is not None:  # checked before the key's metadata is written
            _check_sequence_column(table_schema(ds.schema), keys, sequence_column)
            if ds.to_table(columns=[sequence_column]).column(0).null_count:
                raise InvalidInputError(
                    f"column {sequence_column!r} of {uri} holds nulls; it cannot order writes"
                )
        if not current_pk:
            for k in keys:
                if ds.schema.field(k).nullable:  # Lance requires a key column not nullable
                    ds.alter_columns({"path": k, "nullable": False})  # type: ignore[dict-item]  # stub
                ds = _mark_field(ds, k, PK_METADATA, opts)
    else:
        if existing is not None:
            raise TableExistsError(f"a table already exists at {uri}; use mw.open_table")
        if isinstance(data_or_schema, pa.Schema):
            schema = _with_primary_key(data_or_schema, keys)
            data = schema.empty_table()
        else:
            data = to_arrow_table(data_or_schema)
            schema = _with_primary_key(data.schema, keys)
            RowCoercer(schema, keys).upserts(data)  # same validation as every later write
            data = data.cast(schema)
        # As in one upsert, a key's newest row wins (its last, or its highest sequence): the
        # base holds each key once.
        if sequence_column is not None:
            _check_sequence_column(schema, keys, sequence_column)
            if data.column(sequence_column).null_count:
                raise InvalidInputError(
                    f"sequence column {sequence_column!r} holds nulls: every row needs one"
                )
            data = newest_per_key(data, keys, sequence_column)
        else:
            data = latest_per_key(data, keys)
        spec = spec.bind(schema)
        with storage_failures(f"creating a table at {uri}"):
            ds = lance.write_dataset(
                data,
                uri,
                schema=schema,
                mode="create",
                storage_options=opts,
                data_storage_version=data_storage_version,  # type: ignore[arg-type]  # the stub's Literal
            )
    if sequence_column is not None:
        ds = _mark_field(ds, sequence_column, SEQUENCE_METADATA, opts)
    spec = spec.bind(table_schema(ds.schema))
    writer_config = writer_config or WriterConfig()
    with storage_failures(f"enabling MemWAL at {uri}"):
        ds = create_mem_wal_index(ds, _index_details(ds, spec, writer_config), opts)
        ds = _ensure_key_index(ds, keys, uri, opts)
    table = MemWalTable(
        uri,
        ds,
        primary_key=keys,
        region_spec=spec,
        storage_options=opts,
        writer_config=writer_config,
        maintenance=maintenance,
        caches=caches,
    )
    # Lance writes without fsync: an acknowledged table (all of it, when MemWAL was enabled on
    # an existing one) must survive a power loss, its own name too.
    table.store.sync_written_since(0.0)
    table.store.sync_root_name()
    return table


class TableLocations(Protocol):
    """Where tables are by id: a namespace (:class:`~memwal_sql.Namespace`)."""

    storage_options: dict[str, str]

    def location(self, name: Any) -> str:
        """The uri of table ``name``."""
        ...


def open_table(
    uri: str | os.PathLike[str] | Sequence[str],
    storage_options: Mapping[str, str] | None = None,
    *,
    writer_config: WriterConfig | None = None,
    maintenance: MaintenanceConfig | None = None,
    cache: int | Caches | None = None,
    namespace: TableLocations | None = None,
) -> MemWalTable:
    """Open an existing MemWAL table (one written by memwal-sql or by Lance 14).

    Writers start from the table's recorded defaults (``writer_config_defaults`` in the MemWAL
    index, as :func:`create_table` or Lance's ``initialize_mem_wal`` wrote them) unless
    ``writer_config`` is given. ``maintenance`` is this table object's default maintenance
    config (``tbl.maintenance.config``; see :class:`~memwal_sql.maintenance.TableMaintenance`).

    ``cache`` is what the table's reads cache in (key indexes, bloom filters, rows, vector
    matrices, deletion masks: see :class:`~memwal_sql.structures.cache.Caches`): a byte budget
    gives the table caches of its own, a ``Caches`` object is shared with every table given
    it, and ``None`` shares the process default (:func:`~memwal_sql.structures.cache.default_caches`,
    sized by ``MEMWAL_LOOKUP_CACHE_BYTES``, default 512 MiB).

    With ``namespace`` (:func:`~memwal_sql.namespace`), ``uri`` is a table id in it
    (``"sales.orders"`` or ``["sales", "orders"]``).

    Example:
        ``tbl = mw.open_table("s3://bucket/events", storage_options={...}, cache=1 << 30)``
        ``orders = mw.open_table("sales.orders", namespace=mw.namespace("./warehouse"))``
    """
    if namespace is not None:
        uri = namespace.location(uri)
        storage_options = storage_options or namespace.storage_options or None
    elif not isinstance(uri, (str, os.PathLike)):
        raise InvalidInputError(f"a table id {uri!r} needs namespace=: or give the table's uri")
    uri = os.fspath(uri)
    caches = Caches.of(cache)
    opts = with_default_timeouts(uri, storage_options) or None
    ds = _try_dataset(uri, opts)
    if ds is None:
        raise TableNotFoundError(f"no Lance table at {uri}")
    details = ds.mem_wal_index_details()
    if details is None:
        raise TableNotFoundError(
            f"{uri} is a Lance table without MemWAL; enable it with mw.create_table({uri!r}, None, "
            "primary_key=...)"
        )
    keys = [f.name() for f in ds.lance_schema.unenforced_primary_key()]
    if not keys:
        raise PrimaryKeyError(f"{uri} has a MemWAL index but no primary key")
    names = {f.id(): f.name() for f in ds.lance_schema.fields()}
    specs = details.get("sharding_specs") or []
    spec = None
    if specs:
        newest = max(specs, key=lambda s: s["spec_id"])
        msg = RegionSpecProto(spec_id=newest["spec_id"])
        for f in newest["fields"]:
            rf = msg.fields.add(
                field_id=f["field_id"], source_ids=f["source_ids"], result_type=f["result_type"]
            )
            if f.get("transform") is not None:
                rf.transform = f["transform"]
            if f.get("expression") is not None:
                rf.expression = f["expression"]
            rf.parameters.update(f.get("parameters") or {})
        spec = RegionSpec.from_proto(msg, names).bind(table_schema(ds.schema))
    if writer_config is None:
        writer_config = WriterConfig.from_lance_defaults(
            details.get("writer_config_defaults") or {}
        )
    return MemWalTable(
        uri,
        ds,
        primary_key=keys,
        region_spec=spec,
        storage_options=opts,
        writer_config=writer_config,
        maintenance=maintenance,
        caches=caches,
    )


def _ensure_key_index(
    ds: lance.LanceDataset, keys: Sequence[str], uri: str, opts: dict[str, str] | None
) -> lance.LanceDataset:
    """A btree index on the (first) primary-key column, which point lookups probe."""
    if any(i["fields"] == [keys[0]] for i in ds.list_indices()):
        return ds
    ds.create_scalar_index(keys[0], "BTREE", name=f"{keys[0]}_pk_btree")
    return lance.dataset(uri, storage_options=opts)


def _try_dataset(uri: str, storage_options: dict[str, str] | None) -> lance.LanceDataset | None:
    scheme = urlparse(uri).scheme
    if scheme not in ("", "file", "s3"):
        # Lance keeps no memory:// dataset from one open to the next, so no table can live there.
        raise InvalidInputError(
            f"unsupported uri scheme {scheme!r} in {uri!r}; a table lives at a local path, "
            "file:// or s3://"
        )

    def open_dataset() -> lance.LanceDataset:
        return lance.dataset(uri, storage_options=storage_options)

    store = None  # on local disk none: a store would create the directory
    if scheme == "s3":
        # One request of our own first: a wrong key, a missing bucket or an endpoint that
        # never answers is a typed error now, not after Lance's many requests, or a "table
        # not found" (a listing, as a HEAD cannot tell a missing bucket from a missing key).
        store = ObjectStore(uri, storage_options, durable=False)
        with storage_failures(f"reaching {uri}"):
            store.list_dirs(layout.VERSIONS_DIR)
    try:
        if store is None:
            return open_dataset()
        return store.while_answering(open_dataset, f"opening {uri}")
    except (ValueError, OSError, FileNotFoundError) as e:
        if is_access_denied(e):
            raise AuthenticationError(
                f"the object store refused access to {uri} ({e}); check "
                "the credentials in storage_options"
            ) from e
        if is_not_found(e):
            return None
        raise storage_error(f"opening a table at {uri}", e) from e
