"""One maintenance pass: merge, index catch-up, region snapshots, garbage collection.

The order matters: generations are merged first, the indexes then cover the merged rows, the
region snapshot then lists what the merge left, and the collector last, so it can delete what
the merge and the catch-up made obsolete in the same pass.

Example:
    ``maintain_table(tbl).merge.merged``
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from memwal_sql.maintenance.gc import GcResult, gc_table
from memwal_sql.maintenance.indexes import CatchupResult, catch_up_indexes
from memwal_sql.maintenance.merger import MergeResult, merge_table
from memwal_sql.maintenance.snapshots import SnapshotResult, build_region_snapshots

if TYPE_CHECKING:
    from memwal_sql.table import MemWalTable


@dataclass
class MaintenanceResult:
    """What one maintenance pass did, job by job."""

    merge: MergeResult
    indexes: CatchupResult
    snapshots: SnapshotResult
    gc: GcResult


def maintain_table(table: MemWalTable, *, base_versions_older_than: timedelta | None = None,
                   keep_manifest_versions: int = 10) -> MaintenanceResult:
    """Run every maintenance job once, in order (see the module docstring).

    Example:
        ``maintain_table(tbl, base_versions_older_than=timedelta(hours=1)).gc.objects``
    """
    merge = merge_table(table)
    indexes = catch_up_indexes(table)
    snapshots = build_region_snapshots(table)
    gc = gc_table(table, keep_manifest_versions=keep_manifest_versions,
                  base_versions_older_than=base_versions_older_than)
    return MaintenanceResult(merge, indexes, snapshots, gc)
