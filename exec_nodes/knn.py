"""KNN leaves of a vector search: the nearest rows of one source, by a vector column.

Each source of a snapshot (the base table, a run of a region's flushed generations, a MemTable
or WAL tail) answers ``top(n)``: its ``n`` nearest rows matching the search's filter, every
column of the source plus ``_gen``, ``_rowaddr`` and ``_distance``, nearest first. A source does
not know whether a row is its key's latest version: :class:`~exec_nodes.stale.FilterStaleExec`
decides that, and asks a source for more rows (a larger ``n``) when stale ones took the places
of valid ones.

Distances are Lance's: ``l2`` is the squared Euclidean distance, ``cosine`` is ``1 - cos``,
``dot`` is ``1 - a·b``; the newer sources compute them exactly in numpy (a MemTable or a
generation is small), the base table through Lance (its ANN index, refined, or a flat search).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import ExecNode
from exec_nodes.generation_source import (
    GenerationSourceExec,
    generation_columns,
    generation_dataset,
    generation_vector_index,
)
from exec_nodes.source import Knn, KnnQuery, KnnSource, take_addresses
from memwal_sql.expressions.visitors import referenced_columns
from memwal_sql.formats.source_rows import (
    GEN,
    ROWADDR,
    TOMBSTONE,
    gather,
)
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import last_per_key
from memwal_sql.structures.rowmask import split_addresses
from memwal_sql.structures.vectors import (
    DISTANCE,
    SourceVectors,
    neighbours,
)


class GenerationsKnnExec(KnnSource):
    """Exact KNN over some of a region's flushed generations (each small enough to keep its
    vectors), searched as one matrix: one matrix-vector product for all of them instead of
    one per generation, whose fixed costs dominated with many generations. Of each, only the
    columns a search reads (keys, tombstones, vectors, the filter's columns) are read, once,
    and kept with the matrix; from its rows when the lookup cache keeps them. The winners'
    rows are read afterwards (:meth:`rows`).

    A row that a newer generation of the set, or a later row of its own flush, supersedes is
    never a neighbour: it cannot be its key's latest version. Leaving it out is query-independent
    (kept with the matrix) and spares :class:`~exec_nodes.stale.FilterStaleExec` rounds; that
    node still checks every candidate against the sources newer than the set.
    """

    name = "GenerationsKnnExec"

    def __init__(
        self,
        region_id: str,
        generations: Sequence[tuple[int, str]],
        schema: pa.Schema,
        search: KnnQuery,
        storage_options: dict[str, str] | None = None,
        *,
        caches: Caches,
    ) -> None:
        ordered = sorted(generations)  # oldest first: a row's position follows its version
        super().__init__(region_id, ordered[-1][0], schema, search)
        self.caches = caches
        self.generations = [g for g, _ in ordered]
        self.uris = [u for _, u in ordered]
        self.storage_options = storage_options

    def describe(self) -> str:
        return (
            f"{self.name}: region={(self.region_id or '')[:8]} "
            f"gen={self.generations[0]}..{self.generations[-1]} "
            f"({len(self.generations)} generations) exact k={self.k}"
        )

    def _nearest(self, n: int) -> pa.Table:
        return self._exact(*self._vectors(), n)

    def rows(self, candidates: pa.Table) -> pa.Table:
        addresses = candidates.column(ROWADDR).to_numpy()
        uris = dict(zip(self.generations, self.uris, strict=True))

        def read(generation: int, at: np.ndarray) -> pa.Table:
            uri, opts = uris[generation], self.storage_options
            kept = self.caches.lookup.peek("rows", uri)
            if isinstance(kept, pa.Table):  # its rows in memory: row i at offset i
                return kept.take(pa.array(split_addresses(addresses[at])[1]))
            ds = generation_dataset(uri, opts, self.caches)
            return take_addresses(ds, addresses[at], self.source_schema, generation)

        return gather(candidates.column(GEN).to_numpy(), read)

    def _columns(self) -> list[str]:
        """The columns read of each generation: what the search and its filter read."""
        names = [*self.primary_key, TOMBSTONE, self.column]
        if self.predicate is not None:
            names += sorted(referenced_columns(self.predicate))
        return list(dict.fromkeys([*names, GEN, ROWADDR]))

    def _vectors(self) -> SourceVectors:
        uris = tuple(self.uris)
        schema = pa.schema([self.source_schema.field(c) for c in self._columns()])

        def load() -> tuple[tuple[tuple[str, ...], SourceVectors], int]:
            table = pa.concat_tables(
                generation_columns(uri, self.storage_options, g, schema, self.caches)
                for g, uri in zip(self.generations, uris, strict=True)
            )
            matrix, live, sq_norms = neighbours(table, self.column)
            if table.num_rows:
                _, newest = last_per_key(
                    table.select(self.primary_key), np.arange(table.num_rows, dtype=np.int64)
                )
                latest = np.zeros(table.num_rows, dtype=bool)
                latest[newest] = True
                live &= latest
            nbytes = table.nbytes + matrix.nbytes + live.nbytes + sq_norms.nbytes
            return (uris, (table, matrix, live, sq_norms)), nbytes

        # One entry per run of generations (and columns a filter adds), named by its oldest,
        # and replaced when a flush adds a generation to the run: sets that no snapshot reads
        # do not pile up.
        extra = schema.names[len(self.primary_key) + 2 : -2]
        key = f"{uris[0]}#{self.column}" + (f"#{','.join(extra)}" if extra else "")
        return self.caches.search.get("vectors", key, load, lambda v: v[0] == uris)[1]


#: A run of a region's generations searched as one matrix holds at most this share of the
#: cache (the columns read, vectors, norms and masks), so a run never outgrows the cache and is
#: rebuilt per query; a generation bigger than that alone is searched by Lance.
_GENERATION_RUN_SHARE = 8


@dataclass(frozen=True)
class OwnIndex:
    """How a generation of at least ``min_rows`` rows is searched when it has its own vector
    index (built at flush with the base index's centroids): through it, probed and refined as
    the base is (``nprobes``, ``refine_factor``), so its distances rank with the base's.

    Example:
        >>> OwnIndex(65536, 76, 2).min_rows
        65536
    """

    min_rows: int
    nprobes: int | None
    refine_factor: int | None


class GenerationRunsKnnExec(KnnSource):
    """A region's flushed generations as one KNN source. At execution (deciding opens them,
    after the base table's search has started), a generation of ``own_index.min_rows`` rows
    or more with its own vector index is searched through it by Lance; the others whose
    vectors fit a run's share of the cache are grouped in runs of consecutive generations
    (oldest first, so a flush changes only the newest run), each searched as one matrix
    (:class:`GenerationsKnnExec`); any other flat by Lance (a
    :class:`~exec_nodes.generation_source.GenerationSourceExec` with ``Knn`` access).
    ``top(n)`` is the ``n`` nearest of them all.
    """

    name = "GenerationRunsKnnExec"
    _computed = ("_top", "_runs")

    def __init__(
        self,
        region_id: str,
        generations: Sequence[tuple[int, str]],
        schema: pa.Schema,
        search: KnnQuery,
        storage_options: dict[str, str] | None = None,
        *,
        caches: Caches,
        own_index: OwnIndex | None = None,
    ) -> None:
        ordered = sorted(generations)  # oldest first, as the runs are cut
        super().__init__(region_id, ordered[-1][0], schema, search)
        self.generations = ordered
        self.search = search
        self.storage_options = storage_options
        self.caches = caches
        self.own_index = own_index
        self._runs: list[KnnSource] | None = None

    @property
    def children(self) -> list[ExecNode]:
        return list(self._runs or [])

    def describe(self) -> str:
        return (
            f"{self.name}: region={(self.region_id or '')[:8]} "
            f"{len(self.generations)} generation(s) exact k={self.k}"
        )

    def runs(self) -> list[KnnSource]:
        """The sources the generations are searched as, newest first (decided once)."""
        if self._runs is None:
            self._runs = self._cut_runs()
        return self._runs

    def _cut_runs(self) -> list[KnnSource]:
        schema, opts, rid = self.source_schema, self.storage_options, self.region_id or ""
        sources: list[KnnSource] = []
        run: list[tuple[int, str]] = []
        run_bytes, budget = 0, self.caches.max_bytes // _GENERATION_RUN_SHARE
        # What a run's entry counts per row: the vector twice (column and matrix), its norm,
        # the key, _gen, _rowaddr and masks, about.
        row_bytes = 8 * schema.field(self.column).type.list_size + 8 * (len(self.primary_key) + 3)

        def close_run() -> None:
            nonlocal run_bytes
            if run:
                sources.append(
                    GenerationsKnnExec(
                        rid, run.copy(), schema, self.search, opts, caches=self.caches
                    )
                )
                run.clear()
            run_bytes = 0

        for generation, uri in self.generations:
            ds = generation_dataset(uri, opts, self.caches)
            rows = sum(f.metadata.physical_rows for f in ds.get_fragments())
            access = self._own_index(uri, rows)
            nbytes = row_bytes * rows
            if access is not None or nbytes > budget:  # too big to keep (or no cache)
                close_run()
                sources.append(
                    GenerationSourceExec(
                        rid,
                        generation,
                        uri,
                        schema,
                        access or Knn(self.search),
                        opts,
                        caches=self.caches,
                    )
                )
                continue
            if run and run_bytes + nbytes > budget:
                close_run()
            run.append((generation, uri))
            run_bytes += nbytes
        close_run()
        return sources[::-1]

    def _own_index(self, uri: str, rows: int) -> Knn | None:
        """The access through the generation's own vector index, if it is big enough and has
        one that ranks by the search's metric."""
        own = self.own_index
        if own is None or rows < own.min_rows:
            return None
        found = generation_vector_index(
            uri, self.storage_options, self.column, self.metric, self.caches
        )
        if found is None or found[1] < own.min_rows:
            return None
        return Knn(self.search, found[0], own.nprobes, own.refine_factor)

    def _nearest(self, n: int) -> pa.Table:
        runs = self.runs()
        if len(runs) == 1:
            return runs[0].top(n)
        rows = pa.concat_tables([r.top(n) for r in runs])
        # Ties broken by key, as the final ranking breaks them (TopKExec).
        order = [(DISTANCE, "ascending"), *[(k, "ascending") for k in self.primary_key]]
        return rows.take(pc.sort_indices(rows, sort_keys=order)[:n])

    def rows(self, candidates: pa.Table) -> pa.Table:
        runs = self.runs()
        # Which run holds each candidate's generation (runs hold disjoint generations).
        firsts = np.array([_oldest(r) for r in runs])
        order = np.argsort(firsts)
        at = np.searchsorted(firsts[order], candidates.column(GEN).to_numpy(), side="right") - 1
        owners = order[at]
        return gather(owners, lambda i, pos: runs[i].rows(candidates.take(pa.array(pos))))


def _oldest(source: KnnSource) -> int:
    return source.generations[0] if isinstance(source, GenerationsKnnExec) else source.generation


__all__ = [
    "GenerationRunsKnnExec",
    "GenerationsKnnExec",
    "KnnQuery",
    "KnnSource",
    "OwnIndex",
]
