"""The indexed read plan (spec, "Indexed Read Plan"): stay on indexes while they catch up.

After a merge, the base table holds rows its indexes do not cover until the index builder has
caught up; Lance would scan those rows. For a query an index serves, the base table is read only
in the fragments the index covers, and the generations of the gap (newer than what the index
covers, already merged) are read in place of the rest, through their own indexes. This is exact
because catch-up is derived so that the uncovered fragments hold only rows of those generations
(:mod:`memwal_sql.formats.index_catchup`). When catch-up is unknown or a gap generation is gone, there is
no indexed plan and the whole base table is read.

Vector searches use it: the gap generations are searched like the region's newer ones, each
through its own vector index when it is not in memory and big enough (planner/search.py).
Point lookups through the base table's btree use it: a generation answers a key from its cached
``_pk_index`` behind its bloom filter, which is faster than probing the uncovered fragments
(benchmarks/bench_maintenance.py, reads while the index lags). Scans do not: a generation has no
index a scan filter can use, so reading the generations for a key-range filter is slower than
Lance's filtered scan of the uncovered fragments (same benchmark).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from memwal_sql.formats.index_catchup import index_coverage, min_caught_up
from memwal_sql.read_snapshot import GenerationRef, ReadSnapshot


@dataclass(frozen=True)
class IndexedRead:
    """Read the base table only in ``fragment_ids``; read ``gap`` (region -> generations,
    newest first) as newer sources."""

    indexes: tuple[str, ...]
    fragment_ids: tuple[int, ...]
    gap: Mapping[str, tuple[GenerationRef, ...]]

    def describe(self) -> str:
        gens = sum(len(g) for g in self.gap.values())
        return (
            f"indexed read: {', '.join(self.indexes)} behind the merges; base fragments "
            f"{list(self.fragment_ids)}, {gens} gap generation(s) read instead"
        )


def plan_indexed_read(snapshot: ReadSnapshot, columns: Collection[str]) -> IndexedRead | None:
    """The indexed read of ``snapshot`` for a query on ``columns``, or None when no index on
    them lags behind the merges (or the gap cannot be read from generations).

    Example:
        ``plan_indexed_read(take_read_snapshot(tbl), {"id"})``
    """
    if snapshot.store is None:
        return None
    wanted = set(columns)
    coverage = [
        c for c in index_coverage(snapshot.store, snapshot.dataset) if wanted & set(c.columns)
    ]
    if not coverage or all(c.complete for c in coverage):
        return None
    if any(c.caught_up is None for c in coverage):
        return None  # some uncovered rows are not from merged generations
    fragments = frozenset.intersection(*(c.fragment_ids for c in coverage))
    listed = {
        r.region_id: {g.generation: g for g in r.merged_generations} for r in snapshot.regions
    }
    gap: dict[str, tuple[GenerationRef, ...]] = {}
    for rid, merged in snapshot.merged.items():
        caught_up = min_caught_up(coverage, rid)
        assert caught_up is not None
        if caught_up >= merged:
            continue
        gens = listed.get(rid, {})
        needed = range(merged, caught_up, -1)
        if any(g not in gens for g in needed):
            return None  # collected: the gap cannot be read from generations
        gap[rid] = tuple(gens[g] for g in needed)
    live = [f.fragment_id for f in snapshot.dataset.get_fragments()]
    return IndexedRead(
        tuple(c.name for c in coverage), tuple(f for f in live if f in fragments), gap
    )
