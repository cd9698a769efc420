"""Plan searches over a snapshot (spec, "Vector Search Queries", "Full-Text Search Queries").

One KNN node per source: the base table through Lance (its vector index, refined), each MemTable
exactly, and per region its big flushed generations through their own vector indexes by Lance,
the others exactly as one matrix (their keys and vectors read once);
:class:`~exec_nodes.stale.FilterStaleExec` over them keeps only each key's latest version,
checked against *every* region (a region the filter prunes may still hold a newer version of a
base row's key, one that no longer matches); a global
:class:`~exec_nodes.stale.TopKExec` ranks what is left. The filter goes into every source, so it
applies to each row's latest version: an older version that matched is stale either way.

A full-text search has an FTS leaf per source under :class:`~exec_nodes.fts.GlobalBM25Exec`,
which scores with BM25 statistics of the latest corpus (see :mod:`exec_nodes.fts`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal, TypeAlias, TypeVar

import lance
import numpy as np
import pyarrow as pa

from exec_nodes.fts import (
    SCORE,
    GlobalBM25Exec,
    start_early,
)
from exec_nodes.fts_index import open_text_index, prefetch_text_index
from exec_nodes.knn import (
    GenerationRunsKnnExec,
    KnnQuery,
    KnnSource,
    OwnIndex,
)
from exec_nodes.source import FullText, Knn, SourceLeaf
from exec_nodes.stale import FilterStaleExec
from exec_nodes.topk import TopKExec
from memwal_sql.compat.lance import index_directory, storage_options_of, vector_index_statistics
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.partitioning.region_spec import RegionSpec
from memwal_sql.read_snapshot import ReadAt, ReadSnapshot
from memwal_sql.storage import ObjectStore
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.vectors import DISTANCE
from memwal_sql.writer.memtable_indexes import tokenizer_for
from planner.indexed import IndexedRead, plan_indexed_read
from planner.leaves import base_leaf, memtable_leaves, region_leaves
from planner.lookup import region_lookups
from planner.plan import PlanExec
from planner.pruning import prune_regions
from planner.regions import check_one_region_per_key

#: A generation with at least this many rows is searched through its own vector index, a
#: smaller one exactly. On 15k rows of 32 dimensions (benchmarks/bench_scale.py), reading the
#: keys and vectors took 3-4 ms and an exact search 1 ms; Lance's flat search 5-8 ms on every
#: query, its IVF_PQ search (the base's 76 of 353 partitions probed, refined) 18-23 ms on the
#: first (opening the index) and 5-6 after.
INDEXED_GENERATION_ROWS = 1 << 16

#: A PQ- or SQ-quantized index ranks by approximate distances: its candidates are re-ranked by
#: exact distance over this many times ``k`` rows unless the caller says otherwise.
DEFAULT_REFINE_FACTOR = 10
#: ... but over twice ``k`` for a PQ index of at most 2 dimensions per sub-vector, whose codes
#: rank almost exactly: recall is the same from 2 to 20 (docs/search.md has the measurements),
#: while each refined row is a random read (a base search at 2M rows: 9 ms at 10, 6 at 2).
#: Coarser codes gain recall up to 20 and beyond: they keep the default.
FINE_PQ_REFINE_FACTOR = 2
FINE_PQ_DIMENSIONS = 2
#: IVF partitions probed per square root of the index's partitions unless the caller says.
NPROBES_PER_SQRT_PARTITION = 5.5


@dataclass(frozen=True)
class VectorIndex:
    """A vector index on the base table: its name, type and metric."""

    name: str
    index_type: str
    metric: str
    num_partitions: int
    #: Of a PQ index: the vector dimensions each sub-vector's code stands for (else None).
    dimensions_per_code: float | None = None

    def default_refine_factor(self) -> int | None:
        """Candidates re-ranked by exact distance unless the caller says (times ``k``): none
        for IVF_FLAT (exact already), :data:`FINE_PQ_REFINE_FACTOR` for a PQ index of at most
        :data:`FINE_PQ_DIMENSIONS` dimensions per code, else :data:`DEFAULT_REFINE_FACTOR`.

        Example:
            >>> VectorIndex("v", "IVF_PQ", "l2", 64, dimensions_per_code=2.0).default_refine_factor()
            2
        """
        if self.index_type == "IVF_FLAT":
            return None
        per_code = self.dimensions_per_code
        if per_code is not None and per_code <= FINE_PQ_DIMENSIONS:
            return FINE_PQ_REFINE_FACTOR
        return DEFAULT_REFINE_FACTOR

    def default_nprobes(self) -> int:
        """IVF partitions probed unless the caller says: ``5.5 * sqrt(partitions)``, at least
        20 (all of a small index), for recall@10 >= 0.95 on hard data. Measured on random
        Gaussian 32-d vectors, IVF_PQ with 16 sub-vectors (docs/search.md): at 2M rows (353
        partitions) 76 probes reach 0.92, 100 reach 0.955; at 10M (790) 113 reach 0.965.

        Example:
            >>> VectorIndex("v", "IVF_PQ", "l2", 353).default_nprobes()
            104
        """
        probes = math.ceil(NPROBES_PER_SQRT_PARTITION * math.sqrt(self.num_partitions))
        return min(self.num_partitions, max(20, probes))


#: What a search looks for: a text (full-text search) or a vector (a sequence of numbers).
Query: TypeAlias = str | Sequence[float] | np.ndarray | pa.Array


@dataclass(frozen=True, kw_only=True)
class SearchQuery:
    """One search, vector or full-text (a ``str`` query), with every option named.

    ``filter`` (SQL) applies to each row's latest version; ``metric``, ``nprobes`` and
    ``refine_factor`` apply to vector searches only (see ``MemWalTable.vector_search``).

    Example:
        >>> SearchQuery(query="red fox", k=5).is_text
        True
        >>> SearchQuery(query=[0.1, 0.2], column="vec", nprobes=8).k
        10
    """

    query: Query
    column: str | None = None
    k: int = 10
    filter: str | None = None
    nprobes: int | None = None
    refine_factor: int | None = None
    metric: str | None = None
    consistency: ReadAt = "strong"
    #: ``"vector"`` or ``"fts"``; None: full-text search for a text query, else vector search.
    kind: Literal["vector", "fts"] | None = None

    @property
    def is_text(self) -> bool:
        """Whether this is a full-text search."""
        return self.kind == "fts" if self.kind is not None else isinstance(self.query, str)


class SearchPlan(PlanExec):
    """A search's root: the snapshot it reads, what was pruned, and the node tree (ranking
    runs when it executes); ``residual`` filters the ranked rows (terms on the score)."""

    name = "SearchPlan"
    title = "MemWAL search"

    def __init__(
        self,
        snapshot: ReadSnapshot,
        kept_regions: list[str],
        pruned_regions: list[str],
        root: TopKExec,
        residual: Predicate | None = None,
        indexed: IndexedRead | None = None,
    ) -> None:
        super().__init__(snapshot, root, residual)
        self.root: TopKExec = root
        self.kept_regions = kept_regions
        self.pruned_regions = pruned_regions
        self.indexed = indexed

    def header(self) -> list[str]:
        lines = [
            *super().header(),
            f"regions: {len(self.kept_regions)} searched, {len(self.pruned_regions)} pruned "
            "(every region is still asked for newer versions of the candidates)",
        ]
        return lines if self.indexed is None else [*lines, self.indexed.describe()]


def _layout(
    snapshot: ReadSnapshot,
    spec: RegionSpec | None,
    base_schema: pa.Schema,
    predicate: Predicate | None,
) -> tuple[list[str], list[str], pa.Schema, dict[str, str] | None, list[str]]:
    """What both searches start from: the regions kept and pruned by the filter, the newer
    sources' schema, the storage options and the primary key."""
    kept, pruned = prune_regions(
        predicate, spec, base_schema, [(r.region_id, r.region_values) for r in snapshot.regions]
    )
    return (
        kept,
        pruned,
        snapshot.source_schema,
        dict(snapshot.storage_options or {}) or None,
        list(snapshot.primary_key),
    )


T = TypeVar("T")


def _base_index(
    dataset: lance.LanceDataset,
    column: str,
    type_word: str,
    parse: Callable[[str, dict], T],
    caches: Caches,
) -> T | None:
    """``parse(name, statistics)`` of the base index on ``column`` whose type names
    ``type_word``; parsed once per index (its segments' uuids: a merge or a new base version
    leaves them as they are, and Lance's ``index_statistics`` carry every centroid, so only
    what ``parse`` keeps is cached, in ``caches.search``). A vector index's statistics are
    read from its files' metadata when their layout is known, without the centroids."""
    for d in dataset.describe_indices():
        if d.field_names == [column] and type_word in d.type_url:

            def load(name: str = d.name, uuid: str = d.segments[0].uuid) -> tuple[T, int]:
                stats: dict | str | None = None
                if type_word == "Vector":
                    directory = index_directory(dataset, uuid)
                    stats = vector_index_statistics(directory, storage_options_of(dataset))
                if stats is None:
                    stats = dataset.index_statistics(name)
                stats = json.loads(stats) if isinstance(stats, str) else stats
                return parse(name, stats), 1024

            key = f"{dataset.uri}#{d.name}#{','.join(sorted(g.uuid for g in d.segments))}"
            return caches.search.get(f"base_index_{type_word}", key, load)
    return None


def _vector_index(name: str, stats: dict) -> VectorIndex:
    first = (stats.get("indices") or [{}])[0]
    sub = first.get("sub_index") or {}
    per_code = None
    if sub.get("index_type") == "PQ" and sub.get("num_sub_vectors") and sub.get("dimension"):
        per_code = int(sub["dimension"]) / int(sub["num_sub_vectors"])
    return VectorIndex(
        name,
        str(stats.get("index_type", "")),
        str(first.get("metric_type", "l2")).lower(),
        int(first.get("num_partitions") or 1),
        per_code,
    )


def vector_index(dataset: lance.LanceDataset, column: str, caches: Caches) -> VectorIndex | None:
    """The base table's vector index on ``column`` (None if it has none).

    Example:
        ``vector_index(tbl.dataset(), "vec", tbl.caches)  # VectorIndex("vec_idx", "IVF_PQ", …)``
    """
    return _base_index(dataset, column, "Vector", _vector_index, caches)


def plan_vector_search(
    snapshot: ReadSnapshot,
    store: ObjectStore,
    spec: RegionSpec | None,
    base_schema: pa.Schema,
    search: SearchQuery,
    *,
    predicate: Predicate | None = None,
    post_filter: Callable[[pa.Table], pa.Table] | None = None,
    residual: Predicate | None = None,
) -> SearchPlan:
    """Build the vector-search plan of ``snapshot`` for ``search`` (its column named and its
    query a checked vector; its filter given as ``predicate``, the rest of it as
    ``post_filter``; ``residual`` filters the ranked rows). Nothing is searched until the
    plan executes.

    Example:
        ``plan_vector_search(take_read_snapshot(tbl), tbl.store, tbl.region_spec, tbl.schema,
        SearchQuery(query=q, column="vec", k=10)).to_table()``
    """
    column = search.column
    assert column is not None  # the API layer names it (the table's only vector column)
    index = vector_index(snapshot.dataset, column, snapshot.caches)
    metric = search.metric or (index.metric if index else "l2")
    if index is not None and index.metric != metric:
        index = None  # the index ranks by another metric: search the base exactly instead
    refine_factor, nprobes = search.refine_factor, search.nprobes
    if refine_factor is None and index is not None:
        refine_factor = index.default_refine_factor()
    if nprobes is None and index is not None:
        nprobes = index.default_nprobes()
    kept, pruned, schema, opts, pk = _layout(snapshot, spec, base_schema, predicate)
    vector = np.asarray(search.query, dtype=np.float32)
    knn = KnnQuery(column, vector, metric, predicate, search.k, tuple(pk))
    # While the index lags the merges, the base is searched through it alone, and the merged
    # generations it does not cover yet are searched with the newer ones (spec, "Indexed Read
    # Plan"): not the uncovered base rows flat.
    indexed = plan_indexed_read(snapshot, [column]) if index is not None else None
    gap = indexed.gap if indexed is not None else {}
    fragments = indexed.fragment_ids if indexed is not None else None
    base = Knn(knn, index.name if index else None, nprobes, refine_factor, fragments)
    sources: list[KnnSource] = [base_leaf(snapshot, base)]
    # A big generation through its own index (built at flush with the base index's centroids,
    # probed like the base's: spec, "Indexed Read Plan"); the others exactly, their vectors
    # read once (about what Lance's flat search reads) and kept: about 1 ms for 15k rows after,
    # against 5-8 for Lance's flat search each time.
    own_index = None
    if index is not None:
        own_index = OwnIndex(INDEXED_GENERATION_ROWS, nprobes, refine_factor)
    kept_ids = set(kept)
    for region in snapshot.regions:
        if region.region_id not in kept_ids:
            continue
        sources.extend(memtable_leaves(snapshot, region, Knn(knn)))
        # Which generation is searched how is decided at execution, once the base's search
        # has started: opening the generations (their files verified) then runs beside it.
        generations = [
            (g.generation, g.uri)
            for g in region.generations_newest_first(gap.get(region.region_id, ()))
        ]
        if generations:
            sources.append(
                GenerationRunsKnnExec(
                    region.region_id,
                    generations,
                    schema,
                    knn,
                    opts,
                    caches=snapshot.caches,
                    own_index=own_index,
                )
            )

    def newer_sources(keys: pa.Table) -> list:
        # The gap generations too: a gap candidate may have a newer version in a later one.
        # Their versions only: which row is a key's latest needs no row read.
        return region_lookups(snapshot, store, spec, keys, gap or None, versions=True)

    k = search.k
    stale = FilterStaleExec(
        sources, snapshot.primary_key, newer_sources, k, score=DISTANCE, post_filter=post_filter
    )
    root = TopKExec(stale, k, DISTANCE, columns=[*base_schema.names, DISTANCE])
    return SearchPlan(snapshot, kept, pruned, root, residual, indexed)


def text_index(dataset: lance.LanceDataset, column: str, caches: Caches) -> tuple[str, dict] | None:
    """The base table's inverted index on ``column``: its name and tokenizer parameters."""
    return _base_index(
        dataset,
        column,
        "Inverted",
        lambda name, stats: (name, dict((stats.get("indices") or [{}])[0].get("params") or {})),
        caches,
    )


def prefetch_fts(
    uri: str,
    dataset: Callable[[], lance.LanceDataset],
    column: str,
    query: str,
    caches: Caches,
) -> None:
    """On the first full-text search of ``column`` of the table at ``uri`` with these
    ``caches``, start reading what it reads first of the base's inverted index
    (:func:`~exec_nodes.fts_index.prefetch_text_index`: its documents files, the query
    terms' postings), of the latest base version (``dataset()``), beside the caller, which
    takes the search's snapshot meanwhile: on a cold search, one thread replaying the WAL
    tails while the other core waits. The index is found here (a few milliseconds, kept for
    the search's base leaf) and only its reads go to another thread: that thread needs the
    GIL between steps, which the replay holds most of the time (finding the index there
    took 60-80 ms instead of 4). The search then finds them read, or waits for the read
    under way; what this did not read (another base version's index, a failure), the search
    reads itself. Later searches start nothing (opening the dataset again would cost a warm
    search more than it saves).

    Example:
        ``prefetch_fts(tbl.uri, tbl.dataset, "text", "red fox", tbl.caches)``
    """
    first = f"{uri}#{column}"
    if caches.search.contains("fts_early", first):
        return
    caches.search.get("fts_early", first, lambda: (True, 64))
    try:
        ds = dataset()
        opened = open_text_index(ds, column, {f.fragment_id for f in ds.get_fragments()}, caches)
        if isinstance(opened, str):
            return
        files = opened[0]
        # The distinct terms in the query's order, as the search asks for them, by the
        # tokenizer the index's own files name (the generations' indexes are read so too).
        terms = list(dict.fromkeys(tokenizer_for(files[0].params, caches).terms(query)))
    except Exception:  # the search meets it where it reads, and reports it
        return
    start_early(partial(prefetch_text_index, files, terms, caches))


def plan_fts(
    snapshot: ReadSnapshot,
    spec: RegionSpec | None,
    base_schema: pa.Schema,
    search: SearchQuery,
    *,
    predicate: Predicate | None = None,
    post_filter: Callable[[pa.Table], pa.Table] | None = None,
    residual: Predicate | None = None,
) -> SearchPlan:
    """Build the full-text search plan of ``snapshot`` for ``search`` (a text query, its
    column named): an FTS leaf per source, every region's sources counted in the statistics,
    the filter's regions searched (``predicate``, ``post_filter`` and ``residual`` as in
    :func:`plan_vector_search`). Nothing is searched until the plan executes.

    Example:
        ``plan_fts(take_read_snapshot(tbl), tbl.region_spec, tbl.schema,
        SearchQuery(query="red fox", column="text", k=10)).to_table()``
    """
    column, query = search.column, search.query
    assert column is not None and isinstance(query, str)  # the API layer checked both
    # BM25 counts every source's latest documents: a key in two regions has no latest one.
    check_one_region_per_key(snapshot, spec)
    caches = snapshot.caches
    index = text_index(snapshot.dataset, column, caches)
    tokenizer = tokenizer_for(index[1] if index else {}, caches)
    kept, pruned, _, _, pk = _layout(snapshot, spec, base_schema, predicate)
    text = FullText(column, tokenizer, tuple(pk))
    kept_ids = set(kept)
    sources: list[SourceLeaf] = [base_leaf(snapshot, text)]
    searched = [True]
    for region in snapshot.regions:
        leaves = region_leaves(snapshot, region, text)
        sources.extend(leaves)
        searched.extend([region.region_id in kept_ids] * len(leaves))
    k = search.k
    bm25 = GlobalBM25Exec(
        sources, pk, tokenizer.terms(query), k, predicate, searched, post_filter=post_filter
    )
    root = TopKExec(bm25, k, SCORE, descending=True, columns=[*base_schema.names, SCORE])
    return SearchPlan(snapshot, kept, pruned, root, residual)


def plan_search(
    snapshot: ReadSnapshot,
    store: ObjectStore,
    spec: RegionSpec | None,
    base_schema: pa.Schema,
    search: SearchQuery,
    *,
    predicate: Predicate | None = None,
    post_filter: Callable[[pa.Table], pa.Table] | None = None,
    residual: Predicate | None = None,
) -> SearchPlan:
    """The plan of ``search``: :func:`plan_fts` for a full-text search, else
    :func:`plan_vector_search` (same arguments).

    Example:
        ``plan_search(snap, tbl.store, tbl.region_spec, tbl.schema, checked_query)``
    """
    if search.is_text:
        return plan_fts(
            snapshot,
            spec,
            base_schema,
            search,
            predicate=predicate,
            post_filter=post_filter,
            residual=residual,
        )
    return plan_vector_search(
        snapshot,
        store,
        spec,
        base_schema,
        search,
        predicate=predicate,
        post_filter=post_filter,
        residual=residual,
    )
