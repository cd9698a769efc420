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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import ExecNode
from exec_nodes.generation_source import GenerationSourceExec, generation_rows
from exec_nodes.source import Knn, KnnQuery, KnnSource
from memwal_sql.formats.source_rows import (
    GEN,
    ROWADDR,
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
    """Exact KNN over a region's flushed generations that the lookup cache keeps (each is
    MemTable-sized), searched as one matrix: one matrix-vector product for all of them
    instead of one per generation, whose fixed costs dominated with many generations.

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
        # Read from each generation's own rows: a take from the concatenation of them all
        # gathers over its chunks, which is far slower (benchmarks/bench_search.py). A kept
        # generation has one
        # fragment, its row i at offset i.
        offsets = split_addresses(candidates.column(ROWADDR).to_numpy())[1]
        uris = dict(zip(self.generations, self.uris, strict=True))

        def read(generation: int, at: np.ndarray) -> pa.Table:
            table = _kept_rows(
                uris[generation], self.storage_options, generation, self.source_schema, self.caches
            )
            return table.take(pa.array(offsets[at]))

        return gather(candidates.column(GEN).to_numpy(), read)

    def _vectors(self) -> SourceVectors:
        uris = tuple(self.uris)

        def load() -> tuple[tuple[tuple[str, ...], SourceVectors], int]:
            # The rows are the entries lookups use: a generation read whole serves both.
            table = pa.concat_tables(
                _kept_rows(uri, self.storage_options, g, self.source_schema, self.caches)
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
            # The rows are shared with the generations' own entries, but this one keeps them
            # alive after those are evicted: counted here too.
            nbytes = table.nbytes + matrix.nbytes + live.nbytes + sq_norms.nbytes
            return (uris, (table, matrix, live, sq_norms)), nbytes

        # One entry per run of generations, named by its oldest, and replaced when a flush
        # adds a generation to the run: sets that no snapshot reads do not pile up.
        key = f"{uris[0]}#{self.column}"
        return self.caches.search.get("vectors", key, load, lambda v: v[0] == uris)[1]


def _kept_rows(
    uri: str,
    storage_options: dict[str, str] | None,
    generation: int,
    schema: pa.Schema,
    caches: Caches,
) -> pa.Table:
    table = generation_rows(uri, storage_options, generation, schema, caches)
    if table is None:
        raise ValueError(
            f"generation {uri} is not kept in memory: search it with GenerationSourceExec"
        )
    return table


#: A run of a region's generations searched as one matrix holds at most this share of the lookup
#: cache (rows, vectors, norms and masks), so a run never outgrows the cache and is rebuilt per
#: query.
_GENERATION_RUN_SHARE = 8


class GenerationRunsKnnExec(KnnSource):
    """A region's flushed generations as one KNN source. At execution (deciding needs their
    rows), those the lookup cache keeps are grouped in runs of consecutive generations (oldest
    first, so a flush changes only the newest run), each searched as one matrix
    (:class:`GenerationsKnnExec`); any other is searched through Lance on its own (a
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
    ) -> None:
        ordered = sorted(generations)  # oldest first, as the runs are cut
        super().__init__(region_id, ordered[-1][0], schema, search)
        self.generations = ordered
        self.search = search
        self.storage_options = storage_options
        self.caches = caches
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
        vector_bytes = 4 * (schema.field(self.column).type.list_size + 2)  # vector, norm, masks

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
            rows = generation_rows(uri, opts, generation, schema, self.caches)
            if rows is None:
                close_run()
                sources.append(
                    GenerationSourceExec(
                        rid, generation, uri, schema, Knn(self.search), opts, caches=self.caches
                    )
                )
                continue
            nbytes = rows.nbytes + rows.num_rows * vector_bytes  # as the run's entry counts it
            if run and run_bytes + nbytes > budget:
                close_run()
            run.append((generation, uri))
            run_bytes += nbytes
        close_run()
        return sources[::-1]

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
]
