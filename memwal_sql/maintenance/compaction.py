"""Base-table compaction: rewrite the fragments merges leave behind.

Every merge is a Lance ``merge_insert``: the superseded base rows are marked in a deletion
vector and the merged rows are appended as new, small fragments. Both cost readers. Lance 14's
scanner reads a fragment that has a deletion vector slower than the same fragment without one,
and the penalty is a step, not a slope (benchmarks/bench_tpch.py, the stages before and after
compaction); small fragments add a read each. Compaction
rewrites them through Lance's ``compact_files``: adjacent fragments smaller than
``target_rows_per_fragment`` become one, and a fragment whose deleted share reaches
``deletion_threshold`` is rewritten without its deleted rows.

The default threshold is Delta Lake's (``optimize.maxDeletedRowsRatio``, 5%), below Lance's
10%: rewriting a fragment costs a read and a write of it, paid once, where the penalty is paid
by every scan until then. A pass over fragments already compact commits nothing.

Lance bins every run of adjacent small fragments, so the newest one, still growing, is rewritten
by every compaction that finds a new fragment beside it. A maintenance pass therefore compacts
only once :data:`SMALL_FRAGMENT_TRIGGER` small fragments have gathered (or a fragment reached the
deletion threshold), as Paimon waits for several sorted runs: with one merge per pass, the
growing fragment is rewritten once per eight merges instead of after every merge. An explicit
:func:`compact_base` compacts whatever there is.

Indexes are brought over every fragment first (:func:`~memwal_sql.maintenance.catch_up_indexes`):
Lance remaps an index onto the rewritten fragments only where it covered all of their rows, and
an uncovered fragment a compaction wrote has no merge behind it, so the indexed read plan could
not say which generations hold its rows (it would fall back to reading the whole base table, and
the garbage collector would keep the generations, until the next catch-up).

Example:
    ``tbl.merge(); compact_base(tbl).fragments_removed``
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lance

from memwal_sql.compat.lance import is_commit_conflict
from memwal_sql.errors import CommitConflictError
from memwal_sql.formats.index_catchup import index_coverage
from memwal_sql.maintenance.config import (
    DELETION_THRESHOLD,
    SMALL_FRAGMENT_TRIGGER,
    TARGET_ROWS_PER_FRAGMENT,
    MaintenanceConfig,
)
from memwal_sql.maintenance.indexes import catch_up_indexes

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState

__all__ = [
    "DELETION_THRESHOLD",
    "SMALL_FRAGMENT_TRIGGER",
    "TARGET_ROWS_PER_FRAGMENT",
    "CompactionResult",
    "compact_base",
]


@dataclass
class CompactionResult:
    """What one compaction pass rewrote (all zero: the base table was already compact)."""

    fragments_removed: int = 0
    fragments_added: int = 0
    base_version: int = 0  # the base-table version after the pass
    seconds: float = 0.0


def compact_base(
    table: TableState, config: MaintenanceConfig | None = None, *, in_pass: bool = False
) -> CompactionResult:
    """Merge small base-table fragments up to ``config.target_rows_per_fragment`` rows and
    rewrite those with ``config.deletion_threshold`` or more of their rows deleted (see the
    module docstring). ``in_pass`` (a maintenance pass) does nothing while fewer than
    ``config.small_fragment_trigger`` fragments are small and none reaches the threshold.

    Example:
        ``compact_base(tbl, MaintenanceConfig(deletion_threshold=0.0))  # no deletion vector``
    """
    config = config or MaintenanceConfig()
    target_rows_per_fragment = config.target_rows_per_fragment
    deletion_threshold = config.deletion_threshold
    t0 = time.perf_counter()
    ds = table.dataset()
    if not _worth_compacting(
        ds.get_fragments(),
        target_rows_per_fragment,
        deletion_threshold,
        config.small_fragment_trigger if in_pass else 1,
    ):
        return CompactionResult(base_version=ds.version, seconds=time.perf_counter() - t0)
    if not all(c.complete for c in index_coverage(table.store, ds)):
        catch_up_indexes(table)
        ds = table.dataset()
    try:
        metrics = ds.optimize.compact_files(
            target_rows_per_fragment=target_rows_per_fragment,
            materialize_deletions=True,
            materialize_deletions_threshold=deletion_threshold,
        )
    except OSError as e:
        if not is_commit_conflict(e):
            raise
        raise CommitConflictError(
            f"compacting {table.uri} lost a commit race to a concurrent merge or compaction "
            f"of the same fragments; run it again ({e})"
        ) from e
    return CompactionResult(
        fragments_removed=metrics.fragments_removed,
        fragments_added=metrics.fragments_added,
        base_version=table.dataset().version,
        seconds=time.perf_counter() - t0,
    )


def _worth_compacting(
    fragments: list[lance.LanceFragment], target_rows: int, threshold: float, trigger: int
) -> bool:
    small = 0
    for f in fragments:
        meta = f.metadata
        deleted = meta.deletion_file.num_deleted_rows if meta.deletion_file else 0
        if deleted and deleted >= threshold * meta.physical_rows:
            return True
        small += meta.physical_rows - deleted < target_rows
    return small >= max(trigger, 2)
