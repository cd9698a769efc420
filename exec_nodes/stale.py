"""FilterStaleExec: the LSM-merging step of a search (its ranking is :mod:`exec_nodes.topk`).

A search asks every source of a snapshot (base table, flushed generations, MemTables) for its
best rows. A row is in the answer only if it is its key's *latest* version: a newer source may
hold a newer version of the key (which did not rank, or does not match the filter any more) or
a tombstone. :class:`FilterStaleExec` finds, for the candidates' keys, where each key's latest
version lives, through the point-lookup nodes of every region (the spec's bloom filters as the
fast path, each hit confirmed in that generation's ``_pk_index``, so a false positive never drops
a valid row), and keeps a candidate only if it *is* that version.

Dropping stale candidates can leave a source's share of the top ``k`` short. So the sources are
asked again for more (four times as many) while some source lost candidates and its last
candidate still ranks within the current ``k`` best: the answer is then exactly the top ``k``
of the latest rows that each source can find.

The newest version of a key follows the scan's rule (``DeduplicateExec``): highest ``_gen``, then
highest ``_rowaddr``; the base table (``_gen`` -1) is oldest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from exec_nodes.base import ExecNode
from exec_nodes.dedup import Versions
from exec_nodes.knn import KnnSource
from exec_nodes.lookup import CoalesceFirstExec, distinct_keys
from exec_nodes.regions import raise_if_shared
from memwal_sql.formats.source_rows import (
    BASE_GENERATION,
    GEN,
    ROWADDR,
    TOMBSTONE,
    empty_rows,
    gather,
)
from memwal_sql.structures.vectors import ONE_BLAS_THREAD

SOURCE = "__memwal_source"  # which child a candidate came from
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="memwal-search")
_MORE = 4  # a source asked again is asked for this many times as many rows


class FilterStaleExec(ExecNode):
    """Candidates of every source, with the rows that are not their key's latest version
    (or that a newer tombstone deleted) dropped.

    ``newer_sources(keys)`` gives, per region, the lookup node of those keys (see
    :func:`planner.lookup.region_lookups`); ``post_filter`` (optional) drops candidates a
    filter the sources could not apply rejects. ``score`` names the ranking column and
    ``descending`` its order; ``k`` is how many results the parent keeps.
    """

    name = "FilterStaleExec"

    def __init__(
        self,
        children: Sequence[KnnSource],
        primary_key: Sequence[str],
        newer_sources: Callable[[pa.Table], list[CoalesceFirstExec]],
        k: int,
        *,
        score: str,
        descending: bool = False,
        post_filter: Callable[[pa.Table], pa.Table] | None = None,
    ) -> None:
        self._children = list(children)
        self.primary_key = list(primary_key)
        self.newer_sources = newer_sources
        self.k = k
        self.score = score
        self.descending = descending
        self.post_filter = post_filter
        self.dropped_stale = 0  # candidates a newer version of their key made stale
        self.dropped_deleted = 0  # candidates whose key a newer tombstone deleted
        self.rounds = 0

    @property
    def schema(self) -> pa.Schema:
        return self._children[0].schema if self._children else pa.schema([])

    @property
    def children(self) -> list[ExecNode]:
        return list(self._children)

    def describe(self) -> str:
        return (
            f"{self.name}: key={self.primary_key} latest version only, {self.rounds} "
            f"round(s); dropped {self.dropped_stale} stale, {self.dropped_deleted} deleted"
        )

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        yield from self.valid().to_batches()

    def valid(self) -> pa.Table:
        """Every valid candidate found (at least the best ``k`` of them), unsorted."""
        with ONE_BLAS_THREAD:  # numpy here, Lance's threads beside it
            return self._valid()

    def _valid(self) -> pa.Table:
        # The base table's best rows are the likeliest to be stale (every newer source may
        # hold a newer version of them): ask it for twice as many up front, which saves a
        # second round for most searches.
        fetch = [
            2 * self.k if c.generation == BASE_GENERATION and len(self._children) > 1 else self.k
            for c in self._children
        ]
        while True:
            self.rounds += 1
            # The searches Lance runs (the base table, generations through their indexes)
            # release the GIL: start them first and search the rest (numpy) meanwhile.
            pairs = list(enumerate(zip(self._children, fetch)))
            in_lance = {i: _POOL.submit(c.top, n) for i, (c, n) in pairs if c.in_lance}
            here = {i: c.top(n) for i, (c, n) in pairs if i not in in_lance}
            parts = [in_lance[i].result() if i in in_lance else here[i] for i, _ in pairs]
            parts = [
                rows.append_column(SOURCE, pa.array(np.full(rows.num_rows, i)))
                for i, rows in enumerate(parts)
            ]
            candidates = (
                pa.concat_tables(parts)
                if parts
                else empty_rows(self.schema).append_column(SOURCE, pa.array([], pa.int64()))
            )
            candidates = candidates.append_column("__row", pa.array(np.arange(candidates.num_rows)))
            keep = self._latest(candidates)
            if self.post_filter is not None and keep.any():
                kept_rows = candidates.filter(pa.array(keep))
                survivors = self.post_filter(
                    self.rows_of(kept_rows).append_column("__row", kept_rows.column("__row"))
                )
                keep[:] = False
                keep[survivors.column("__row").to_numpy()] = True
            kept = candidates.filter(pa.array(keep))
            more = self._more(candidates, keep, kept, fetch)
            if not more:
                self.dropped_stale, self.dropped_deleted = self._drops
                return kept.drop_columns(["__row"])
            fetch = more

    def rows_of(self, candidates: pa.Table) -> pa.Table:
        """The full rows of ``candidates`` (as :meth:`valid` gives them), in their order,
        with their score: each source reads its own."""
        if candidates.num_rows == 0:
            table = empty_rows(self._children[0].source_schema)
        else:
            table = gather(
                candidates.column(SOURCE).to_numpy(),
                lambda i, at: self._children[i].rows(candidates.take(pa.array(at))),
            )
        return table.append_column(
            candidates.schema.field(self.score), candidates.column(self.score)
        )

    def _more(
        self, candidates: pa.Table, keep: np.ndarray, kept: pa.Table, fetch: list[int]
    ) -> list[int] | None:
        """The next fetch sizes, or None when the ``k`` best valid candidates are final."""
        scores = kept.column(self.score).to_numpy()
        if len(scores) >= self.k:
            part = np.partition(-scores if self.descending else scores, self.k - 1)
            kth = part[self.k - 1]
        else:
            kth = np.inf
        source = candidates.column(SOURCE).to_numpy()
        all_scores = candidates.column(self.score).to_numpy()
        out, grew = list(fetch), False
        for i, _child in enumerate(self._children):
            mine = source == i
            returned = int(mine.sum())
            if returned < fetch[i] or keep[mine].all():
                continue  # exhausted, or nothing of it was dropped
            last = all_scores[mine].min() if self.descending else all_scores[mine].max()
            if (-last if self.descending else last) <= kth:
                out[i], grew = fetch[i] * _MORE, True
        return out if grew else None

    def _latest(self, candidates: pa.Table) -> np.ndarray:
        """Which candidates are their key's latest live version (counting what is not)."""
        n = candidates.num_rows
        self._drops = (0, 0)
        if n == 0:
            return np.zeros(0, dtype=bool)
        keys = distinct_keys(candidates.select(self.primary_key))
        regions = [node for node in self.newer_sources(keys) if node.keys is not None]
        found = [node.probe(node.keys).rows for node in regions]
        raise_if_shared(
            [(r.region_id, rows, r.routed) for r, rows in zip(regions, found)], self.primary_key
        )
        found = [f for f in found if f.num_rows]
        gen = candidates.column(GEN).to_numpy()
        is_base = gen == BASE_GENERATION
        if not found:  # no newer source holds any of these keys: only base rows are latest
            self._drops = (int((~is_base).sum()), 0)
            return is_base
        # The newest version of each candidate key among the newer sources, the scan's way.
        newest = Versions.of(
            [f.select([*self.primary_key, GEN, ROWADDR, TOMBSTONE]) for f in found],
            self.primary_key,
            [],
        )
        pos = newest.positions(candidates.select(self.primary_key))
        in_newer = pos >= 0
        at = np.where(in_newer, pos, 0)
        deleted = in_newer & newest.dead[at]
        is_newest = (
            in_newer
            & (newest.gen[at] == gen)
            & (newest.addr[at] == candidates.column(ROWADDR).to_numpy().astype(np.int64))
        )
        keep = np.where(in_newer, is_newest & ~is_base, is_base) & ~deleted
        self._drops = (int((~keep & ~deleted).sum()), int(deleted.sum()))
        return keep


__all__ = ["SOURCE", "FilterStaleExec"]
