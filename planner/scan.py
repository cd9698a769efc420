"""Plan an LSM-merging scan: collect sources per region, prune regions, build the node tree."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from exec_nodes.dedup import DeduplicateExec
from exec_nodes.source import FragmentRange, Scan, SourceLeaf
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.formats.source_rows import GEN, ROWADDR
from memwal_sql.partitioning.region_spec import RegionSpec
from memwal_sql.read_snapshot import ReadSnapshot
from planner.leaves import region_leaves
from planner.plan import PlanExec
from planner.pruning import prune_regions
from planner.regions import check_one_region_per_key


class ScanPlan(PlanExec):
    """The plan of one scan: what was pruned and the exec-node tree that runs it."""

    name = "ScanPlan"
    title = "MemWAL scan"

    def __init__(
        self,
        snapshot: ReadSnapshot,
        predicate: Predicate | None,
        kept_regions: list[str],
        pruned_regions: list[str],
        root: DeduplicateExec,
    ) -> None:
        super().__init__(snapshot, root)
        self.root: DeduplicateExec = root
        self.predicate = predicate
        self.kept_regions = kept_regions
        self.pruned_regions = pruned_regions

    @property
    def sources(self) -> list[SourceLeaf]:
        return self.root.newer

    def sources_opened(self) -> list[SourceLeaf]:
        """The newer-than-base sources that were actually read."""
        return [s for s in self.sources if s.opened]

    def header(self) -> list[str]:
        pruned = self.pruned_regions
        return [
            *super().header(),
            f"regions: {len(self.kept_regions)} scanned, {len(pruned)} pruned"
            + (f" ({', '.join(r[:8] for r in pruned)})" if pruned else ""),
        ]


def output_schema(base: pa.Schema, system_columns: bool) -> pa.Schema:
    """What a scan returns: the base columns, then ``_gen`` and ``_rowaddr`` if asked."""
    fields = list(base)
    if system_columns:
        fields += [pa.field(GEN, pa.int64(), False), pa.field(ROWADDR, pa.uint64(), False)]
    return pa.schema(fields)


# A base table smaller than this (physical rows per partition) is not split further: a part
# costs a Lance scan and a DataFusion partition.
MIN_PART_ROWS = 65_536


def base_parts(snapshot: ReadSnapshot, partitions: int) -> list[list[FragmentRange]]:
    """Split the base table into at most ``partitions`` parts of about as many physical rows,
    cutting a fragment into row ranges where a part ends inside it (merges leave one big
    fragment and many small ones: whole fragments per part would leave one core idle)."""
    sizes = [(f.fragment_id, f.physical_rows) for f in snapshot.dataset.get_fragments()]
    return split_rows(sizes, partitions)


def split_rows(sizes: Sequence[tuple[int, int]], partitions: int) -> list[list[FragmentRange]]:
    """Fragments ``(id, physical rows)`` in order, cut into at most ``partitions`` runs of
    about as many rows (none below :data:`MIN_PART_ROWS` when there is more than one).

    Example:
        >>> [[str(r) for r in p] for p in split_rows([(0, 200_000), (1, 10)], 2)]
        [['0[0:100005]'], ['0[100005:]', '1']]
    """
    total = sum(n for _, n in sizes)
    if not sizes:
        return []
    n_parts = max(1, min(partitions, total // MIN_PART_ROWS))
    cuts = [total * (i + 1) // n_parts for i in range(n_parts)]  # where each part ends
    parts: list[list[FragmentRange]] = [[] for _ in range(n_parts)]
    part, at = 0, 0  # the part being filled; rows before the current fragment
    for fragment_id, rows in sizes:
        start = 0
        while start < rows:
            end = min(rows, cuts[part] - at)
            if end > start:
                parts[part].append(FragmentRange(fragment_id, start, None if end == rows else end))
            if end == rows:
                break
            start, part = end, part + 1
        at += rows
    return [p for p in parts if p]


def plan_scan(
    snapshot: ReadSnapshot,
    spec: RegionSpec | None,
    base_schema: pa.Schema,
    predicate: Predicate | None,
    *,
    system_columns: bool = False,
    partitions: int = 2,
) -> ScanPlan:
    """Build the scan plan of ``snapshot`` for a (pushed-down) ``predicate``.

    Example:
        ``plan = plan_scan(take_read_snapshot(tbl), tbl.region_spec, tbl.schema, pred)``
    """
    check_one_region_per_key(snapshot, spec)
    kept, pruned = prune_regions(
        predicate, spec, base_schema, [(r.region_id, r.region_values) for r in snapshot.regions]
    )
    kept_ids = set(kept)
    sources = [
        leaf
        for region in snapshot.regions
        if region.region_id in kept_ids
        for leaf in region_leaves(snapshot, region, Scan())
    ]
    root = DeduplicateExec(
        sources,
        snapshot.dataset,
        base_parts(snapshot, partitions),
        primary_key=snapshot.primary_key,
        predicate=predicate,
        output=output_schema(base_schema, system_columns),
        caches=snapshot.caches,
        source_schema=snapshot.source_schema,
    )
    return ScanPlan(snapshot, predicate, kept, pruned, root)
