"""``tbl.maintenance``: every maintenance job of one table, under one :class:`MaintenanceConfig`.

As delta-rs groups a table's upkeep under ``dt.optimize``, a table's maintenance lives on one
object: :meth:`~TableMaintenance.merge`, :meth:`~TableMaintenance.catch_up_indexes`,
:meth:`~TableMaintenance.compact`, :meth:`~TableMaintenance.build_region_snapshots`,
:meth:`~TableMaintenance.gc`, a whole pass (:meth:`~TableMaintenance.run`), the scrub
(:meth:`~TableMaintenance.verify`) and :meth:`~TableMaintenance.status`.

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.schema([pa.field("id", pa.int64(), False)]),
    ...                       primary_key="id",
    ...                       maintenance=mw.MaintenanceConfig(keep_manifest_versions=3))
    >>> tbl.upsert({"id": [1, 2]}); tbl.flush()
    >>> tbl.maintenance.merge().rows_upserted
    2
    >>> tbl.maintenance.config.keep_manifest_versions
    3
    >>> tbl.close()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from memwal_sql.maintenance.compaction import CompactionResult, compact_base
from memwal_sql.maintenance.config import MaintenanceConfig
from memwal_sql.maintenance.gc import GcResult, gc_table
from memwal_sql.maintenance.index_builder import SnapshotResult, build_region_snapshots
from memwal_sql.maintenance.indexes import CatchupResult, catch_up_indexes
from memwal_sql.maintenance.merger import MergeResult, merge_table
from memwal_sql.maintenance.recovery import RecoveryResult, recover_regions
from memwal_sql.maintenance.run import MaintenanceResult, maintain_table
from memwal_sql.maintenance.status import RegionStatus, region_status
from memwal_sql.maintenance.verify import VerifyReport, verify_table

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState

T = TypeVar("T")


class TableMaintenance:
    """The maintenance jobs of one table (``tbl.maintenance``).

    Every job runs as :attr:`config` says, unless a call passes its own ``config``. The table's
    default config is the ``maintenance=`` of :func:`~memwal_sql.open_table` or
    :func:`~memwal_sql.create_table` (else :class:`MaintenanceConfig`'s defaults); assign
    :attr:`config` to change it for later calls on this table object. It is not stored with
    the table: every process opening the table chooses its own.

    Example:
        ``tbl.maintenance.config = MaintenanceConfig(keep_manifest_versions=3)``
        ``r = tbl.maintenance.run(); assert r.ok, r.failures``
    """

    def __init__(self, table: TableState, config: MaintenanceConfig | None = None) -> None:
        self._table = table
        self.config = config or MaintenanceConfig()

    def _run(self, what: str, job: Callable[[], T]) -> T:
        return self._table.store.run_io(f"{what} of {self._table.uri}", job)

    def flush_regions(self, regions: Sequence[str] | None = None) -> RecoveryResult:
        """Fold the WAL rows no generation holds into generations now, for every region (or
        ``regions``): claim each region that has some, replay, flush and release it. A live
        writer of such a region is fenced (its next write fails; nothing acknowledged is lost).
        :meth:`run` does this only for regions idle for ``recover_regions_idle_for``.

        Example:
            ``tbl.maintenance.flush_regions().recovered  # {region id: rows flushed}``
        """
        return self._run("flush", lambda: recover_regions(self._table, regions=regions, force=True))

    def merge(
        self, config: MaintenanceConfig | None = None, *, regions: Sequence[str] | None = None
    ) -> MergeResult:
        """Merge flushed generations into the base table (oldest first, progress recorded
        atomically with the data), at most ``max_generations_per_region`` of each region.

        ``regions`` merges only those regions, in that order: where two of them hold
        versions of one key (a :class:`~memwal_sql.errors.KeyInTwoRegionsError`), the last
        one's win. Otherwise such regions are left unmerged and the error raised.

        Example:
            ``tbl.flush(); tbl.maintenance.merge().merged``
        """
        cfg = config or self.config
        return self._run("merge", lambda: merge_table(self._table, cfg, regions=regions))

    def catch_up_indexes(self) -> CatchupResult:
        """Optimize the base table's indexes that lag behind merged rows.

        Example:
            ``tbl.maintenance.merge(); tbl.maintenance.catch_up_indexes().caught_up``
        """
        return self._run("catch up indexes", lambda: catch_up_indexes(self._table))

    def compact(self, config: MaintenanceConfig | None = None) -> CompactionResult:
        """Rewrite the base table's small fragments into fragments of up to
        ``target_rows_per_fragment`` rows, and those with ``deletion_threshold`` or more of
        their rows deleted without them (merges leave both, and Lance reads a fragment with a
        deletion vector slower: docs/reads.md). Lagging indexes are caught up first.

        Example:
            ``tbl.maintenance.compact(MaintenanceConfig(deletion_threshold=0.0))``
        """
        cfg = config or self.config
        return self._run("compaction", lambda: compact_base(self._table, cfg))

    def build_region_snapshots(self) -> SnapshotResult:
        """Refresh the regions' WAL hints and snapshot every region into the MemWAL index, for
        eventual-consistency reads.

        Example:
            ``tbl.maintenance.build_region_snapshots().regions``
        """
        return self._run("build region snapshots", lambda: build_region_snapshots(self._table))

    def gc(self, config: MaintenanceConfig | None = None) -> GcResult:
        """Delete merged generations, WAL entries already in generations (never fence
        sentinels), orphaned generation directories and manifest versions beyond the newest
        ``keep_manifest_versions``.

        A generation is deleted once the oldest retained base version has merged it and every
        base-table index covers it there; ``base_versions_older_than`` first drops older base
        versions.

        Example:
            ``tbl.maintenance.gc().summary()``
        """
        cfg = config or self.config
        return self._run("gc", lambda: gc_table(self._table, cfg))

    def run(self, config: MaintenanceConfig | None = None) -> MaintenanceResult:
        """One maintenance pass: the flush of regions whose writer is gone (unflushed WAL
        entries, and no write for ``recover_regions_idle_for``), :meth:`merge`,
        :meth:`catch_up_indexes`, :meth:`compact` (once ``small_fragment_trigger`` fragments are
        small), :meth:`build_region_snapshots`, then :meth:`gc`. A step that fails does not stop the others: its typed error, which
        names the row or file behind it, is in the result's ``failures`` (and logged), and the
        next pass runs it again.

        Example:
            ``r = tbl.maintenance.run(); assert r.ok, r.failures``
        """
        cfg = config or self.config
        return self._run("maintain", lambda: maintain_table(self._table, cfg))

    def verify(self, progress: Callable[[int], object] | None = None) -> VerifyReport:
        """Scrub every region manifest version, WAL entry and generation file for damage
        (reported, not raised). ``progress(n)`` is called as objects are checked.

        Example:
            ``report = tbl.maintenance.verify(); assert report.ok, report.summary()``
        """
        return self._run("verify", lambda: verify_table(self._table, progress))

    def status(self) -> list[RegionStatus]:
        """Every region's generations, merge lag, index catch-up and storage use, in region-id
        order (what ``memwal inspect`` shows).

        Example:
            ``[(r.region_id, r.unmerged_rows) for r in tbl.maintenance.status()]``
        """
        return self._run("status", lambda: region_status(self._table))
