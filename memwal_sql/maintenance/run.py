"""One maintenance pass: merge, index catch-up, compaction, region snapshots, garbage collection.

The order matters: generations are merged first, the indexes then cover the merged rows, the
base table is compacted once they do (so every index is remapped onto the rewritten
fragments), the region snapshot then lists what the merge left, and the collector last, so it
can delete what the merge and the catch-up made obsolete in the same pass.

Example:
    ``maintain_table(tbl).merge.merged``
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

from memwal_sql.compat.lance import is_commit_conflict
from memwal_sql.errors import CommitConflictError, MemWalError
from memwal_sql.maintenance.compaction import (
    DELETION_THRESHOLD,
    SMALL_FRAGMENT_TRIGGER,
    TARGET_ROWS_PER_FRAGMENT,
    CompactionResult,
    compact_base,
)
from memwal_sql.maintenance.gc import GcResult, gc_table
from memwal_sql.maintenance.indexes import CatchupResult, catch_up_indexes
from memwal_sql.maintenance.merger import MergeResult, merge_table
from memwal_sql.maintenance.snapshots import SnapshotResult, build_region_snapshots

if TYPE_CHECKING:
    from memwal_sql.table import MemWalTable

T = TypeVar("T")
ATTEMPTS = 6


@dataclass
class MaintenanceResult:
    """What one maintenance pass did, job by job."""

    merge: MergeResult
    indexes: CatchupResult
    compaction: CompactionResult
    snapshots: SnapshotResult
    gc: GcResult


def maintain_table(
    table: MemWalTable,
    *,
    base_versions_older_than: timedelta | None = None,
    keep_manifest_versions: int = 10,
    target_rows_per_fragment: int = TARGET_ROWS_PER_FRAGMENT,
    deletion_threshold: float = DELETION_THRESHOLD,
) -> MaintenanceResult:
    """Run every maintenance job once, in order (see the module docstring).

    Example:
        ``maintain_table(tbl, base_versions_older_than=timedelta(hours=1)).gc.objects``
    """
    merge = _retrying(lambda: merge_table(table))
    indexes = _retrying(lambda: catch_up_indexes(table))
    compaction = _retrying(
        lambda: compact_base(
            table,
            target_rows_per_fragment=target_rows_per_fragment,
            deletion_threshold=deletion_threshold,
            small_fragment_trigger=SMALL_FRAGMENT_TRIGGER,
        )
    )
    snapshots = _retrying(lambda: build_region_snapshots(table))
    gc = _retrying(
        lambda: gc_table(
            table,
            keep_manifest_versions=keep_manifest_versions,
            base_versions_older_than=base_versions_older_than,
        )
    )
    return MaintenanceResult(merge, indexes, compaction, snapshots, gc)


def _retrying(job: Callable[[], T], attempts: int = ATTEMPTS) -> T:
    """``job()``, run again (after a growing, jittered pause) when its commit loses a race to
    another maintenance run: each job starts from the table's latest state, so a rerun is
    safe. :class:`CommitConflictError` once ``attempts`` runs have all lost."""
    for attempt in range(attempts):
        try:
            return job()
        except Exception as e:
            if not (
                isinstance(e, CommitConflictError)
                or (not isinstance(e, MemWalError) and is_commit_conflict(e))
            ):
                raise
            if attempt == attempts - 1:
                raise CommitConflictError(
                    f"maintenance lost {attempts} commit races in a row to other maintenance "
                    f"runs ({e}); run it again later, or run one maintainer at a time"
                ) from e
            time.sleep(0.05 * 2**attempt * (0.5 + random.random()))
    raise AssertionError("unreachable")
