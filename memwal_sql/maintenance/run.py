"""One maintenance pass: recovery of stranded WAL rows, merge, index catch-up, compaction,
region snapshots, garbage collection.

The order matters: regions whose writer is gone are flushed first (their rows become
generations), generations are merged next, the indexes then cover the merged rows, the
base table is compacted once they do (so every index is remapped onto the rewritten
fragments), the region snapshot then lists what the merge left, and the collector last, so it
can delete what the merge and the catch-up made obsolete in the same pass.

A step that fails does not stop the pass: its error (which names the row or file behind it) is
kept in :attr:`MaintenanceResult.failures` and logged, the next steps run, and the next pass
runs the step again. Each later step stays safe after any earlier failure, because none trusts
what an earlier step claims to have done: a merge that failed merged nothing the others see;
the collector keeps every generation an index does not cover, from what Lance records each
index covers, not from whether the catch-up ran; the region snapshot lists what the manifests
say. Only compaction is skipped after a failed catch-up: it would try the same catch-up again,
and compacting rows an index does not cover would leave its catch-up unknown, so that the
collector could free no generation until the index caught up.

Example:
    ``maintain_table(tbl, MaintenanceConfig()).merge.merged``
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from memwal_sql.compat.lance import is_commit_conflict
from memwal_sql.errors import CommitConflictError, MemWalError
from memwal_sql.maintenance.compaction import CompactionResult, compact_base
from memwal_sql.maintenance.config import MaintenanceConfig
from memwal_sql.maintenance.gc import GcResult, gc_table
from memwal_sql.maintenance.index_builder import SnapshotResult, build_region_snapshots
from memwal_sql.maintenance.indexes import CatchupResult, catch_up_indexes
from memwal_sql.maintenance.merger import MergeResult, merge_table
from memwal_sql.maintenance.recovery import RecoveryResult, recover_regions
from memwal_sql.storage import storage_failures

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState

T = TypeVar("T")
ATTEMPTS = 6
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepFailure:
    """A step of a maintenance pass that failed: ``step`` (``recovery``, ``merge``,
    ``indexes``, ``compaction``, ``snapshots`` or ``gc``) and the error, which says what
    stopped it."""

    step: str
    error: MemWalError

    def __str__(self) -> str:
        return f"{self.step} failed: {self.error}"


@dataclass
class MaintenanceResult:
    """What one maintenance pass did, job by job; ``failures`` lists the steps that failed
    (their results are empty; the next pass runs them again) and ``skipped`` the steps not run,
    with why."""

    merge: MergeResult
    indexes: CatchupResult
    compaction: CompactionResult
    snapshots: SnapshotResult
    gc: GcResult
    failures: list[StepFailure] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    recovery: RecoveryResult = field(default_factory=RecoveryResult)

    @property
    def ok(self) -> bool:
        """Every step ran and succeeded."""
        return not self.failures and not self.skipped


def maintain_table(table: TableState, config: MaintenanceConfig | None = None) -> MaintenanceResult:
    """Run every maintenance job once, in order (see the module docstring), each as
    ``config`` says.

    Example:
        ``maintain_table(tbl, MaintenanceConfig(keep_manifest_versions=3)).gc.objects``
    """
    config = config or MaintenanceConfig()
    failures: list[StepFailure] = []

    def step(name: str, job: Callable[[], T], empty: Callable[[], T]) -> T:
        try:
            # Lance's own errors (a file it cannot read, a row it cannot index) fail the step.
            with storage_failures(
                f"{name} of {table.uri}", kinds=(OSError, ValueError, RuntimeError)
            ):
                return _retrying(job)
        except MemWalError as e:
            failures.append(StepFailure(name, e))
            _log.warning("maintenance of %s: %s; the other steps go on", table.uri, failures[-1])
            return empty()

    recovery = step("recovery", lambda: recover_regions(table, config), RecoveryResult)
    merge = step("merge", lambda: merge_table(table, config), MergeResult)
    indexes = step("indexes", lambda: catch_up_indexes(table), CatchupResult)
    skipped = {}
    if any(f.step == "indexes" for f in failures):
        skipped["compaction"] = "an index could not be caught up (see the indexes failure)"
        compaction = CompactionResult()
    else:
        compaction = step(
            "compaction",
            lambda: compact_base(table, config, in_pass=True),
            CompactionResult,
        )
    snapshots = step("snapshots", lambda: build_region_snapshots(table), SnapshotResult)
    gc = step("gc", lambda: gc_table(table, config), GcResult)
    return MaintenanceResult(merge, indexes, compaction, snapshots, gc, failures, skipped, recovery)


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
