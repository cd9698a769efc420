"""Full-text search over live data: one FTS leaf per source and GlobalBM25Exec over them.

BM25 scores depend on the corpus: the number of documents N, their average length, and per
term the number of documents holding it. Over an LSM tree the corpus is the *latest* row of
every key: an updated document counts once, with its new text, and a deleted one not at all.
Each source's statistics are therefore computed on its latest rows only, and summed; a
document's score then uses those global statistics, so every score is the BM25 score the same
document would have in the fully merged table (Lance's scorer, ``memwal_sql.compat.lance_fts``).

* An FTS leaf holds its source's terms, tokenized with Lance's tokenizer (the base index's
  parameters), cached per immutable piece: a generation, a MemTable batch list, a base fragment
  the base's inverted index does not cover. The fragments it covers are searched through it
  (:class:`~exec_nodes.fts_index.BaseTextIndex`): the query terms' postings, and the index's
  statistics less the rows deleted, vanished or superseded since.
* :class:`GlobalBM25Exec` finds the newest version of every key among the newer-than-base
  sources (highest ``_gen``, then ``_rowaddr``, the scan's rule), marks each source's rows that
  are their key's latest live version, gathers the statistics over those rows, scores the
  documents holding a query term, and returns the best, the filter applied to each candidate
  (its latest version) until ``k`` pass.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.base import ExecNode
from exec_nodes.dedup import Versions
from exec_nodes.fts_index import BaseTextIndex
from exec_nodes.source import PieceKeys, SourceLeaf
from memwal_sql.compat.lance_fts import BM25_B, BM25_K1
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.expressions.visitors import evaluate
from memwal_sql.formats.source_rows import (
    BASE_GENERATION,
    GEN,
    ROWADDR,
    TOMBSTONE,
    empty_rows,
    gather,
)
from memwal_sql.structures.cache import CachePart
from memwal_sql.writer.memtable_indexes import Piece

SCORE = "_score"
_T = TypeVar("_T")


@dataclass
class CorpusStats:
    """BM25 statistics of the latest corpus (what :class:`GlobalBM25Exec` gathered)."""

    documents: int = 0  # latest documents with at least one term (Lance's N)
    tokens: int = 0
    document_frequency: dict[str, int] | None = None
    superseded: int = 0  # rows of older versions left out
    deleted: int = 0  # rows whose key a newer tombstone deleted, left out

    @property
    def average_length(self) -> float:
        return self.tokens / self.documents if self.documents else 0.0


class GlobalBM25Exec(ExecNode):
    """The ``k`` best latest documents for ``terms`` by BM25 over the latest corpus (see the
    module docstring); ``predicate`` filters the candidates, then ``post_filter`` (optional:
    what of a filter the predicate tree cannot say, on full rows); ``searched`` names the
    children whose rows may be returned (the others, pruned by the filter, still count in the
    statistics)."""

    name = "GlobalBM25Exec"

    def __init__(
        self,
        children: Sequence[SourceLeaf],
        primary_key: Sequence[str],
        terms: Sequence[str],
        k: int,
        predicate: Predicate | None,
        searched: Sequence[bool] | None = None,
        *,
        post_filter: Callable[[pa.Table], pa.Table] | None = None,
    ) -> None:
        self._children = list(children)
        self.primary_key = list(primary_key)
        self.terms = list(terms)
        self.k = k
        self.predicate = predicate
        self.post_filter = post_filter
        self.searched = list(searched) if searched is not None else [True] * len(children)
        self.stats = CorpusStats()

    @property
    def schema(self) -> pa.Schema:
        return self._children[0].schema.append(pa.field(SCORE, pa.float32()))

    @property
    def children(self) -> list[ExecNode]:
        return list(self._children)

    def describe(self) -> str:
        s = self.stats
        shown = self.terms if len(self.terms) <= 10 else [*self.terms[:10], "..."]
        return (
            f"{self.name}: terms={shown} ({len(self.terms)}) k={self.k} over the latest "
            f"corpus: {s.documents} documents, average length {s.average_length:.2f}, left out "
            f"{s.superseded} superseded and {s.deleted} deleted"
        )

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        yield from self.valid().to_batches()

    def valid(self) -> pa.Table:
        """The best ``k`` (or fewer) latest documents matching the filter, with ``_score``."""
        searched = {id(c) for c, ok in zip(self._children, self.searched) if ok}
        # Each distinct term once, weighted by how often the query names it (as in Lance).
        counts = Counter(self.terms)
        indexed = [(c, x) for c in self._children if (x := c.text_index()) is not None]
        # The index's files are read and decoded, and the sources opened and tokenized, side
        # by side (Lance and numpy, mostly without the GIL): a cold search waits for the
        # longest of them, not for their sum. The rows newer sources supersede are found from
        # their keys alone, here: once the sources whose keys come only with their pieces
        # (generations) are opened, while those whose keys come without tokenizing (MemTables)
        # are still tokenized. The index's files are read first (the document file, then the
        # postings once the generations are opened): what follows the lookup needs them.
        newer = [c.generation != BASE_GENERATION for c in self._children]
        keys = [c.text_keys() if n else None for c, n in zip(self._children, newer)]
        reading = [_POOL.submit(x.prefetch_documents) for _, x in indexed]
        opened: dict[int, futures.Future[list[Piece]]] = {}
        for late in (False, True):
            for i in range(1, len(self._children)):
                if (keys[i] is not None) == late:
                    opened[i] = _POOL.submit(self._children[i].pieces)
            if not late:
                reading += [_POOL.submit(x.prefetch_postings, list(counts)) for _, x in indexed]
        query = pa.array(list(counts), pa.string())
        # The query terms' occurrences in each piece (a generation's read from its index).
        found_in = [_POOL.submit(_occurrences, c, query) for c in self._children[1:]]
        try:
            first = _occurrences(self._children[0], query) if self._children else []

            def pieces_of(i: int) -> list[Piece]:
                if i == 0:
                    return [p for p, _ in first]
                # Not started on the pool yet: opened here rather than waited for.
                return self._children[i].pieces() if opened[i].cancel() else opened[i].result()

            gone = self._superseded(
                [
                    (c, k if k is not None else [PieceKeys.of(p) for p in pieces_of(i)])
                    for i, (c, k, n) in enumerate(zip(self._children, keys, newer))
                    if n
                ],
                indexed,
            )
            futures.wait(reading)
            for future in reading:
                future.result()
            found = [x.matches(list(counts), r) for (_, x), r in zip(indexed, gone.replaced)]
            each = [first, *(f.result() for f in found_in)]
            pieces = [
                (c, i, p) for c, ps in zip(self._children, each) for i, (p, _) in enumerate(ps)
            ]
            occurrences = [o for ps in each for _, o in ps]
            # Kept by the pieces' own keys: a MemTable's next search gives those.
            _keep(_piece_keys(self._children, pieces), indexed, gone)
            live = self._latest(pieces, gone)
        finally:
            # Each task ends before the search goes on or fails.
            futures.wait(reading)
            futures.wait(opened.values())
            futures.wait(found_in)
        weights = np.array(list(counts.values()), dtype=np.float64)
        stats = CorpusStats()
        frequency = np.zeros(len(query), dtype=np.int64)
        postings = []
        for (child, i, piece), ok, (term, doc) in zip(pieces, live, occurrences):
            lengths = piece.tokens.lengths
            stats.documents += int(np.count_nonzero(ok & (lengths > 0)))
            stats.tokens += int(lengths[ok].sum())
            kept = ok[doc]
            term, doc, tf = _pairs(term[kept], doc[kept])
            per_term = np.bincount(term, minlength=len(query))
            frequency += per_term
            read = partial(child.piece_rows, i)
            postings.append(
                _Postings(
                    read,
                    doc,
                    tf,
                    lengths[doc],
                    len(lengths),
                    id(child) in searched,
                    per_term,
                )
            )
        for (child, _), matched in zip(indexed, found):
            stats.documents += matched.documents
            stats.tokens += matched.tokens
            frequency += matched.frequency
            for part in matched.partitions:
                read = partial(_rows_at, child, part.rowid)
                postings.append(
                    _Postings(
                        read,
                        part.doc,
                        part.tf,
                        part.length,
                        part.documents,
                        id(child) in searched,
                        part.counts,
                        part.key,
                        part.cache,
                    )
                )
        stats.document_frequency = dict(zip(counts, frequency.tolist()))
        stats.superseded, stats.deleted = self._left_out
        self.stats = stats
        return self._best(postings, stats, weights, frequency)

    def _superseded(
        self,
        newer: list[tuple[SourceLeaf, list[PieceKeys]]],
        indexed: list[tuple[SourceLeaf, BaseTextIndex]],
    ) -> _Superseded:
        """The newest version of every key among the newer sources' pieces, and per index the
        (sorted) addresses of the live rows it covers that a newer source supersedes or
        deletes; the same keys and indexes (no write since the last search) give the same
        answer, kept (:func:`_keep`)."""
        with _LATEST_LOCK:
            hit = _SUPERSEDED.get(_named(newer, indexed))
        if hit is not None:
            return hit[1]
        return self._compute_superseded(newer, indexed)

    def _compute_superseded(
        self,
        newer: list[tuple[SourceLeaf, list[PieceKeys]]],
        indexed: list[tuple[SourceLeaf, BaseTextIndex]],
    ) -> _Superseded:
        pieces = [(c, k) for c, ks in newer for k in ks]
        if not pieces:
            return _Superseded(None, [np.zeros(0, np.uint64) for _ in indexed], 0, 0)
        # The newest version of every key among the newer sources, the scan's way.
        newest = Versions.of(
            [
                k.keys.append_column(GEN, pa.array(np.full(k.keys.num_rows, c.generation)))
                .append_column(ROWADDR, pa.array(k.addresses.astype(np.uint64)))
                .append_column(TOMBSTONE, pa.array(~k.present))
                for c, k in pieces
            ],
            self.primary_key,
            list(pieces[0][1].keys.schema),
        )
        superseded, deleted, replaced = 0, 0, []
        for child, index in indexed:  # the base rows its index covers, found by key
            addr = child.key_addresses(newest.keys)
            hit = addr >= 0
            hit[hit] = np.isin(addr[hit] >> 32, list(index.covered))
            deleted += int(np.count_nonzero(hit & newest.dead))
            superseded += int(np.count_nonzero(hit & ~newest.dead))
            replaced.append(np.sort(addr[hit].astype(np.uint64)))
        return _Superseded(newest, replaced, superseded, deleted)

    def _latest(
        self, pieces: list[tuple[SourceLeaf, int, Piece]], gone: _Superseded
    ) -> list[np.ndarray]:
        """Per piece, which rows are their key's latest live version (and ``_left_out`` set);
        the same pieces and versions give the same answer, kept."""
        key = (*(id(p) for _, _, p in pieces), id(gone))
        with _LATEST_LOCK:
            hit = _LATEST.get(key)
        if hit is not None:
            self._left_out = hit[2]
            return hit[1]
        out = self._compute_latest(pieces, gone)
        with _LATEST_LOCK:
            _LATEST.clear()  # one entry: the pieces it holds keep their ids unique
            _LATEST[key] = ([p for _, _, p in pieces] + [gone], out, self._left_out)
        return out

    def _compute_latest(
        self, pieces: list[tuple[SourceLeaf, int, Piece]], gone: _Superseded
    ) -> list[np.ndarray]:
        newest = gone.newest
        if newest is None:
            self._left_out = (0, 0)
            return [p.present for _, _, p in pieces]
        win_gen, win_addr, win_dead = newest.gen, newest.addr, newest.dead
        out, superseded, deleted = [], gone.superseded, gone.deleted
        for child, _, piece in pieces:
            if child.generation == BASE_GENERATION:
                # Probe the base rows with the (few) newer keys, not the other way round.
                where = piece.row_of(newest.keys)
                found = where >= 0
                hit = np.zeros(len(piece.present), dtype=bool)
                hit[where[found]] = True
                dead = np.zeros(len(piece.present), dtype=bool)
                dead[where[found & win_dead]] = True
                ok = piece.present & ~hit
                deleted += int(np.count_nonzero(piece.present & dead))
                superseded += int(np.count_nonzero(piece.present & hit & ~dead))
                out.append(ok)
                continue
            pos = newest.positions(piece.keys)
            hit = pos >= 0
            at = np.where(hit, pos, 0)
            ok = (
                piece.present
                & hit
                & (win_gen[at] == child.generation)
                & (win_addr[at] == piece.addresses)
                & ~win_dead[at]
            )
            lost = piece.present & ~ok
            deleted += int(np.count_nonzero(lost & hit & win_dead[at]))
            superseded += int(np.count_nonzero(lost & ~(hit & win_dead[at])))
            out.append(ok)
        self._left_out = (superseded, deleted)
        return out

    def _best(
        self,
        postings: list[_Postings],
        stats: CorpusStats,
        weights: np.ndarray,
        frequency: np.ndarray,
    ) -> pa.Table:
        n_docs, avgdl = stats.documents, max(stats.average_length, 1e-12)
        idf = np.log(1 + (n_docs - frequency + 0.5) / (frequency + 0.5))
        coefficient = weights * idf * (BM25_K1 + 1)
        groups = []  # (postings number, each posting's part of its document's score)
        for number, p in enumerate(postings):
            if not p.searched or len(p.doc) == 0:
                continue
            groups.append((number, _Parts(_ratio(p, avgdl), coefficient, p.bounds)))
        if not groups:
            return empty_rows(self.schema)
        # Without a filter the best k are known to score at least ``reached``: only documents
        # that may reach it are scored (MaxScore) and kept; a filter may reject any of them.
        unfiltered = self.predicate is None and self.post_filter is None
        floor, reached = (
            _floors(postings, groups, coefficient, self.k, avgdl) if unfiltered else (None, None)
        )
        scored = [(*_scores(postings[n], part, floor, reached), n) for n, part in groups]
        scores = np.concatenate([s for s, _, _ in scored])
        rows = np.concatenate([r for _, r, _ in scored])
        numbers = np.repeat([n for _, _, n in scored], [len(r) for _, r, _ in scored])
        picked: list[pa.Table] = []
        have, start, step = 0, 0, max(self.k, 16)
        order = np.zeros(0, dtype=np.int64)
        while have < self.k and start < len(scores):  # the filter on candidates, best first
            if start + step > len(order):  # rank only as far as needed
                order = _best_first(scores, min(len(scores), (start + step) * 4))
            chunk = order[start : start + step]
            start += step
            step *= 4
            table = self._rows(postings, numbers[chunk], rows[chunk], scores[chunk])
            if self.predicate is not None:
                table = table.filter(pc.fill_null(evaluate(self.predicate, table), False))
            if self.post_filter is not None and table.num_rows:
                table = self.post_filter(table)
            picked.append(table)
            have += table.num_rows
        out = pa.concat_tables(picked) if picked else empty_rows(self.schema)
        return out.slice(0, self.k)

    def _rows(
        self, postings: list[_Postings], numbers: np.ndarray, rows: np.ndarray, scores: np.ndarray
    ) -> pa.Table:
        def read(number: int, at: np.ndarray) -> pa.Table:
            return postings[number].read(rows[at])

        return gather(numbers, read).append_column(
            pa.field(SCORE, pa.float32()), pa.array(scores.astype(np.float32))
        )


@dataclass(frozen=True)
class _Postings:
    """One group of scored documents: a piece's, or an index partition's. Per posting
    (grouped by term, ``counts`` a term) its document (``0..documents``), term frequency
    and document length; ``read(rows)`` gives the full rows of document numbers ``rows``."""

    read: Callable[[np.ndarray], pa.Table]
    doc: np.ndarray
    tf: np.ndarray
    length: np.ndarray
    documents: int
    searched: bool
    counts: np.ndarray
    key: str | None = None  # names the postings in ``cache``: what is derived from them is kept
    cache: CachePart | None = None

    @property
    def bounds(self) -> np.ndarray:
        """Where each term's postings start and end."""
        return np.concatenate([[0], np.cumsum(self.counts)])

    def keep(self, kind: str, name: str, load: Callable[[], tuple[_T, int]]) -> _T:
        """``load()``'s value, kept in the cache if these postings are named."""
        if self.cache is None or self.key is None:
            return load()[0]
        return self.cache.get(kind, f"{self.key}#{name}", load)


@dataclass(frozen=True)
class _Parts:
    """Each posting's part of its document's score: its term's coefficient times its
    ratio (``bounds`` where each term's postings start and end). Computed where it is used,
    a term or a range at a time, not as one array of the postings' size (25 MB of fresh
    memory for 3.2M postings on a cold search); the same products, so the same values."""

    ratio: np.ndarray
    coefficient: np.ndarray
    bounds: np.ndarray

    def __len__(self) -> int:
        return len(self.ratio)

    def of(self, term: int, at: np.ndarray | slice) -> np.ndarray:
        """The parts of ``term``'s postings at ``at`` (indices among all postings)."""
        return self.coefficient[term] * self.ratio[at]

    def terms(self) -> Iterator[tuple[int, int, int]]:
        """Each term with postings: (term, first posting, end)."""
        for t, (a, b) in enumerate(zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist())):
            if b > a:
                yield t, a, b

    def whole(self) -> np.ndarray:
        """Every posting's part as one array."""
        part = np.repeat(self.coefficient, np.diff(self.bounds))
        return np.multiply(part, self.ratio, out=part)


def _ratio(p: _Postings, avgdl: float) -> np.ndarray:
    """Per posting the part of BM25 that depends on the document, ``tf / (tf + norm)``
    (its score part is the term's coefficient times it): a function of the postings and the
    average length alone, so kept with named postings until the corpus changes."""

    def load() -> tuple[np.ndarray, int]:
        # In place, the kept array and one range's worth of scratch rather than four arrays
        # of the postings' size (fresh pages cost as much as the arithmetic on millions of
        # postings); the same operations, so the same values, bit for bit.
        ratio = p.tf.astype(np.float64)
        norm = np.empty(max(1, min(len(ratio), _DENSE_DOCUMENTS)))
        for lo in range(0, len(ratio), len(norm)):
            tf, part = ratio[lo : lo + len(norm)], norm[: len(ratio) - lo]
            np.copyto(part, p.length[lo : lo + len(part)], casting="unsafe")
            part *= BM25_K1 * BM25_B / avgdl
            part += BM25_K1 * (1 - BM25_B)
            part += tf
            np.divide(tf, part, out=tf)
        return ratio, ratio.nbytes + 64

    return p.keep("fts_ratio", repr(avgdl), load)


def _rows_at(child: SourceLeaf, rowid: np.ndarray, rows: np.ndarray) -> pa.Table:
    return child.rows_at(rowid[rows])


@dataclass(frozen=True)
class _Superseded:
    """The newest version of every key among the newer sources (None: no newer rows), and
    per base index the sorted addresses of the live rows it covers that they supersede or
    delete, counted."""

    newest: Versions | None
    replaced: list[np.ndarray]
    superseded: int
    deleted: int


_SUPERSEDED: dict[tuple[int, ...], tuple[list[object], _Superseded]] = {}
_LATEST: dict[tuple[int, ...], tuple[list[object], list[np.ndarray], tuple[int, int]]] = {}
_LATEST_LOCK = threading.Lock()
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="memwal-fts")


def start_early(read: Callable[[], None]) -> None:
    """Run ``read`` (a search's first reads, into a cache) on the full-text search's threads
    and return at once. Its failure is not reported: the search reads what it did not."""
    _POOL.submit(read)


def _named(
    newer: list[tuple[SourceLeaf, list[PieceKeys]]],
    indexed: list[tuple[SourceLeaf, BaseTextIndex]],
) -> tuple[int, ...]:
    """What names a :class:`_Superseded`: its key tables and indexes (kept with it)."""
    return (*(id(k.keys) for _, ks in newer for k in ks), *(id(x) for _, x in indexed))


def _keep(
    newer: list[tuple[SourceLeaf, list[PieceKeys]]],
    indexed: list[tuple[SourceLeaf, BaseTextIndex]],
    found: _Superseded,
) -> None:
    """``found`` kept as the one entry, named by ``newer`` and ``indexed`` (held with it, so
    their ids stay unique)."""
    held = [k.keys for _, ks in newer for k in ks] + [x for _, x in indexed]
    with _LATEST_LOCK:
        _SUPERSEDED.clear()
        _SUPERSEDED[_named(newer, indexed)] = (held, found)


def _piece_keys(
    children: Sequence[SourceLeaf], pieces: list[tuple[SourceLeaf, int, Piece]]
) -> list[tuple[SourceLeaf, list[PieceKeys]]]:
    """The newer children's pieces' keys, as :meth:`GlobalBM25Exec._superseded` takes them."""
    return [
        (c, [PieceKeys.of(p) for owner, _, p in pieces if owner is c])
        for c in children
        if c.generation != BASE_GENERATION
    ]


def _occurrences(
    child: SourceLeaf, query: pa.Array
) -> list[tuple[Piece, tuple[np.ndarray, np.ndarray]]]:
    """Each of ``child``'s pieces with the occurrences of the ``query`` terms in it."""
    return [(p, p.tokens.occurrences(query)) for p in child.pieces()]


def _pairs(term: np.ndarray, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (term, document) pairs of occurrences ordered by term, then document, and
    how often each occurs (the term's frequency in the document)."""
    if len(doc) == 0:
        return term, doc, doc
    new = np.ones(len(doc), dtype=bool)
    new[1:] = (term[1:] != term[:-1]) | (doc[1:] != doc[:-1])
    starts = np.flatnonzero(new)
    return term[starts], doc[starts], np.diff(np.append(starts, len(doc)))


_DENSE = 4  # every posting is scored when more than 1 in _DENSE name a candidate


def _floors(
    postings: list[_Postings],
    groups: list[tuple[int, _Parts]],
    coefficient: np.ndarray,
    k: int,
    avgdl: float,
) -> tuple[np.ndarray, float] | tuple[None, None]:
    """Per term the least part a posting must have for its document to possibly be among the
    best ``k`` (MaxScore), and a score the best ``k`` reach (None, None: fewer than ``k``
    documents sampled). The documents with each term's best parts are scored exactly, and
    their ``k``-th best score is one the best ``k`` reach. A document reaches it only if each
    of its parts plus every other term's best part does, and only if it holds one of the
    *essential* terms: those the least-scoring terms' best parts cannot reach it without. A
    term that is not essential gets an infinite floor (its postings name no candidate; they
    still add to the candidates' scores)."""
    best = np.zeros(len(coefficient))
    sampled = []
    for number, part in groups:
        p = postings[number]
        top, picked = _sample(p, avgdl, 4 * k)
        # The coefficient scales a term's ratios alike: the best ratio gives the best part.
        best = np.maximum(best, coefficient * top)
        sampled.append(_exact(p, part, np.unique(p.doc[picked])))
    scores = np.concatenate(sampled)
    if len(scores) < k:
        return None, None
    # A hair lower than exact: the sums below may round differently from the bound.
    reached = float(np.partition(scores, len(scores) - k)[len(scores) - k]) * (1 - 1e-9)
    floor = reached - (best.sum() - best)
    order = np.argsort(best, kind="stable")
    floor[order[np.cumsum(best[order]) < reached]] = np.inf
    return floor, reached


def _sample(p: _Postings, avgdl: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per term its best ratio (0 without postings), and the postings of each term's ``n``
    best ratios (its ``n`` best parts), kept with named postings."""

    def load() -> tuple[tuple[np.ndarray, np.ndarray], int]:
        ratio, bounds = _ratio(p, avgdl), p.bounds
        top = np.zeros(len(p.counts))
        picked = [np.zeros(0, np.int64)]
        for t in np.flatnonzero(p.counts).tolist():
            chunk = ratio[bounds[t] : bounds[t + 1]]
            top[t] = chunk.max()
            m = min(len(chunk), n)
            picked.append(bounds[t] + np.argpartition(chunk, len(chunk) - m)[len(chunk) - m :])
        at = np.concatenate(picked)
        return (top, at), top.nbytes + at.nbytes + 64

    return p.keep("fts_sample", f"{avgdl!r}#{n}", load)


def _exact(p: _Postings, part: _Parts, rows: np.ndarray) -> np.ndarray:
    """The scores of a group's documents ``rows`` (ascending), their parts added term by term
    as the bincount adds them."""
    score = np.zeros(len(rows))
    for t, a, b in part.terms():
        docs = p.doc[a:b]
        if len(rows) == 0:
            break
        at = np.minimum(np.searchsorted(docs, rows.astype(docs.dtype, copy=False)), len(docs) - 1)
        score += np.where(docs[at] == rows, part.of(t, a + at), 0.0)
    return score


def _scores(
    p: _Postings, part: _Parts, floor: np.ndarray | None, reached: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """The scores of a group's documents with a posting, and the documents, ascending; with a
    ``floor``, only of those with a part above their term's floor that score ``reached``."""
    if floor is not None and reached is not None:
        kept = np.zeros(len(part), dtype=bool)
        for t, a, b in part.terms():
            if np.isfinite(floor[t]):  # an infinite floor: the term names no candidate
                np.greater_equal(part.of(t, slice(a, b)), floor[t], out=kept[a:b])
        if np.count_nonzero(kept) * _DENSE < len(part):  # else scoring them all costs less
            rows = np.sort(p.doc[kept])  # each term's documents ascending: one run per term
            new = np.ones(len(rows), dtype=bool)
            new[1:] = rows[1:] != rows[:-1]
            rows = rows[new]
            score = _exact(p, part, rows)
            high = score >= reached
            return score[high], rows[high]
    # A document's parts are added in the query's order of terms. Every part is positive
    # (idf > 0 as a term's documents are at most all, tf >= 1): a document scores iff it
    # holds a term.
    kept_scores, kept_rows = [], []
    for lo, score in _dense_scores(p, part):
        at = np.flatnonzero(score > 0 if reached is None else score >= reached)
        kept_scores.append(score[at])
        kept_rows.append(at + lo)
    return np.concatenate(kept_scores), np.concatenate(kept_rows)


# Documents added up at once: a 256 KiB score array, in the CPU's cache while each term's
# postings are added to it (at 10M documents 28 ms instead of 39 with ranges of 2^18).
_DENSE_DOCUMENTS = 1 << 15
# Partitions of at most this many documents are added up at once: at 2M documents one array
# was 3-4 ms faster warm than ranges; at 10M ranges were as fast and 80 MB less fresh memory.
_DENSE_WHOLE = 1 << 22


def _dense_scores(p: _Postings, part: _Parts) -> Iterator[tuple[int, np.ndarray]]:
    """Every document's score as ``(first document, scores)``: at once for a partition of
    at most ``_DENSE_WHOLE`` documents, else ``_DENSE_DOCUMENTS`` documents at a time (a
    score array of its size, 80 MB at 10M documents, would be fresh memory on every search).
    A term's documents ascend, so each range is a slice of each term's postings, and each
    range adds the terms' parts in the query's order, as one ``bincount`` over all the
    postings would: the same scores, bit for bit.

    Example:
        ``list(_dense_scores(p, part))`` -> ``[(0, array([...])), (32768, array([...]))]``
    """
    if p.documents <= _DENSE_WHOLE:
        yield 0, np.bincount(p.doc, weights=part.whole(), minlength=p.documents)
        return
    terms = [(t, start, p.doc[start:end]) for t, start, end in part.terms()]
    for lo in range(0, p.documents, _DENSE_DOCUMENTS):
        hi = min(lo + _DENSE_DOCUMENTS, p.documents)
        score = None
        for t, start, doc in terms:
            # Bounds of the documents' own type: another would convert ``doc`` whole.
            a, b = np.searchsorted(doc, np.array([lo, hi], dtype=doc.dtype))
            weights = part.of(t, slice(start + a, start + b))
            added = np.bincount(doc[a:b] - lo, weights=weights, minlength=hi - lo)
            score = added if score is None else np.add(score, added, out=score)
        yield lo, score if score is not None else np.zeros(hi - lo)


def _best_first(scores: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` highest scores, highest first, ties in index order (the lowest
    indices of a tie that ``n`` cuts through: the same rows whatever else was scored)."""
    if n < len(scores):
        nth = scores[np.argpartition(-scores, n - 1)[n - 1]]
        above = np.flatnonzero(scores > nth)
        top = np.concatenate([above, np.flatnonzero(scores == nth)[: n - len(above)]])
    else:
        top = np.arange(len(scores))
    return top[np.lexsort((top, -scores[top]))]


__all__ = [
    "SCORE",
    "CorpusStats",
    "GlobalBM25Exec",
    "start_early",
]
