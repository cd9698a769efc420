"""The base-table index builder: bring every index over the merged rows.

Merges add rows the base table's indexes (primary-key btree, vector, full-text) do not cover;
until they are optimized, reads of those rows go through the gap generations
(:mod:`planner.indexed`) and the garbage collector keeps the generations. Each pass optimizes the
indexes that lag (Lance's ``optimize_indices``: the new rows go into the index). Lance 14 records
the catch-up progress (``index_catchup`` in the MemWAL index details) in that same commit; our
readers and the garbage collector derive it from what each index covers instead
(:mod:`memwal_sql.index.catchup`), which stays exact even for an index rebuilt by other means.

Example:
    ``catch_up_indexes(tbl).caught_up  # {"id_pk_btree": {"<region id>": 7}}``
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails
from memwal_sql.index.catchup import index_coverage
from memwal_sql.index.details import region_generations

if TYPE_CHECKING:
    from memwal_sql.table import MemWalTable


@dataclass
class CatchupResult:
    """What one index catch-up pass did."""

    optimized: list[str] = field(default_factory=list)  # indexes that lagged and were optimized
    caught_up: dict[str, dict[str, int]] = field(default_factory=dict)  # index -> region -> gen
    seconds: float = 0.0


def catch_up_indexes(table: MemWalTable) -> CatchupResult:
    """Optimize every base-table index that does not cover all merged rows.

    Example:
        ``tbl.merge(); catch_up_indexes(tbl).optimized``
    """
    t0 = time.perf_counter()
    result = CatchupResult()
    ds = table.dataset()
    behind = [c.name for c in index_coverage(table.store, ds) if not c.complete]
    if behind:
        ds.optimize.optimize_indices(index_names=behind)
        result.optimized = behind
        ds = table.dataset()
    result.caught_up = {
        c.name: dict(c.caught_up)
        for c in index_coverage(table.store, ds)
        if c.caught_up is not None
    }
    result.seconds = time.perf_counter() - t0
    return result


def recorded_catchup(details: MemWalIndexDetails) -> dict[str, dict[str, int]]:
    """``index_catchup`` of the details: index name -> region id -> generation."""
    return {
        p.index_name: region_generations(p.caught_up_generations) for p in details.index_catchup
    }
