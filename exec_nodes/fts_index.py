"""The base table's inverted index as a full-text search over the latest corpus reads it.

Lance's index holds every document it indexed, deleted ones included, and its statistics count
them all. :class:`BaseTextIndex` takes from its files only what a query needs: per query term
the postings (row id, term frequency, document length), and the corpus totals (documents,
tokens) from the files' metadata. It then takes out exactly the documents that are no longer
part of the latest corpus: rows deleted in the base, rows of fragments the table no longer
has, and rows that newer sources (generations, MemTables) supersede or delete, each with its
length from the index's document file. Fragments the index does not cover are not its
business: the base leaf tokenizes those.

Decoded postings are kept per (index, partition, term) in the ``search`` cache, so memory grows
with the terms searched, not with the base; the document files (row id and length, 12 bytes
a document) are kept per partition to look lengths up.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import lance
import numpy as np

from memwal_sql.compat.lance_inverted import (
    IndexFiles,
    read_docs,
    read_postings,
    token_ids,
)
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.rowmask import RowMask

_Posting = tuple[np.ndarray, np.ndarray, np.ndarray]  # row ids, term frequencies, lengths


@dataclass(frozen=True)
class _Docs:
    """One partition's documents: row id and length by document id, total tokens, the row
    ids ascending (``order`` gives their document ids; None when the file holds them in
    order, as a fresh index does; a partition that ``optimize_indices`` merged does not), and
    where each fragment's rows start among them (``fragments[i]`` from ``starts[i]`` to
    ``starts[i + 1]``)."""

    rowid: np.ndarray
    length: np.ndarray
    total: int
    sorted_rowid: np.ndarray
    order: np.ndarray | None
    fragments: np.ndarray
    starts: np.ndarray

    def doc_of(self, at: np.ndarray) -> np.ndarray:
        """The document ids of positions ``at`` in ``sorted_rowid``."""
        return at if self.order is None else self.order[at]

    @property
    def nbytes(self) -> int:
        extra = 0 if self.order is None else self.sorted_rowid.nbytes + self.order.nbytes
        return self.rowid.nbytes + self.length.nbytes + extra + 16 * len(self.fragments) + 64


@dataclass(frozen=True)
class IndexMatches:
    """What the index gives one query: the corpus it covers after the corrections (documents,
    tokens), per distinct term how many of those documents hold it, and the postings of the
    live documents (term number, row address, term frequency, document length)."""

    documents: int
    tokens: int
    frequency: np.ndarray
    term: np.ndarray
    rowid: np.ndarray
    tf: np.ndarray
    length: np.ndarray


class BaseTextIndex:
    """The base's inverted index (``files``, one per segment) at ``dataset``'s version, which
    covers the fragments ``covered`` (those of the version it indexed that still exist).

    Example:
        ``BaseTextIndex(ds, [files], {0, 1}, caches).matches(["fox"], superseded)``
    """

    def __init__(
        self,
        dataset: lance.LanceDataset,
        files: Sequence[IndexFiles],
        covered: set[int],
        caches: Caches,
        deleted_rows: Callable[[lance.LanceFragment], RowMask],
    ) -> None:
        self.dataset = dataset
        self.files = list(files)
        self.covered = covered
        self.caches = caches
        self._deleted_rows = deleted_rows
        # Covered fragments with deleted rows: the rows gone from the base depend on nothing
        # else, so these name what ``_gone`` found.
        self._deleting = {
            f.fragment_id: f
            for f in dataset.get_fragments()
            if f.fragment_id in covered and f.metadata.deletion_file is not None
        }
        names = sorted(f"{i}:{_deletion_name(f)}" for i, f in self._deleting.items())
        self._gone_key = hashlib.sha1(
            f"{sorted(covered)}|{','.join(names)}".encode(), usedforsecurity=False
        ).hexdigest()

    @property
    def partitions(self) -> list[tuple[IndexFiles, int]]:
        return [(f, p) for f in self.files for p in f.partitions]

    def describe(self) -> str:
        uuids = ",".join(f.uri.rstrip("/").rsplit("/", 1)[-1][:8] for f in self.files)
        return (
            f"index {uuids} ({len(self.partitions)} partitions) over {len(self.covered)} fragments"
        )

    def matches(self, terms: Sequence[str], superseded: np.ndarray) -> IndexMatches:
        """The index's part of a search for distinct ``terms``: the base rows at row addresses
        ``superseded`` (sorted; live rows of covered fragments that newer sources replace or
        delete) left out of everything, as are deleted rows and rows of fragments no longer
        covered."""
        documents = tokens = 0
        dead = []
        for files, p in self.partitions:
            docs = self._docs(files, p)
            pos = np.searchsorted(docs.sorted_rowid, superseded)
            found = pos < len(docs.rowid)
            found[found] = docs.sorted_rowid[pos[found]] == superseded[found]
            out = np.concatenate([self._gone(files, p, docs), docs.doc_of(pos[found])])
            documents += len(docs.rowid) - len(out)
            tokens += docs.total - int(docs.length[out].sum(dtype=np.int64))
            dead.append(docs.rowid[out])
        gone = np.sort(np.concatenate(dead)) if dead else np.zeros(0, np.uint64)
        postings = [self._postings(files, p, terms) for files, p in self.partitions]
        frequency = np.zeros(len(terms), dtype=np.int64)
        none = np.zeros(0, np.uint32)
        parts = [(none.astype(np.int64), none.astype(np.uint64), none, none)]
        for number in range(len(terms)):  # term by term: a document's parts add in query order
            for by_term in postings:
                rowid, tf, length = by_term[number]
                keep = np.ones(len(rowid), dtype=bool)
                if len(gone):
                    keep = gone[np.minimum(np.searchsorted(gone, rowid), len(gone) - 1)] != rowid
                frequency[number] += int(np.count_nonzero(keep))
                term = np.full(int(np.count_nonzero(keep)), number, dtype=np.int64)
                parts.append((term, rowid[keep], tf[keep], length[keep]))
        term, rowid, tf, length = (np.concatenate(c) for c in zip(*parts))
        return IndexMatches(documents, tokens, frequency, term, rowid, tf, length)

    def _docs(self, files: IndexFiles, partition: int) -> _Docs:
        def load() -> tuple[_Docs, int]:
            rowid, length, total = read_docs(files, partition)
            order = None if np.all(rowid[1:] > rowid[:-1]) else np.argsort(rowid, kind="stable")
            ascending = rowid if order is None else rowid[order]
            fragment = ascending >> np.uint64(32)
            new = np.ones(len(fragment), dtype=bool)
            new[1:] = fragment[1:] != fragment[:-1]
            starts = np.append(np.flatnonzero(new), len(fragment))
            docs = _Docs(rowid, length, total, ascending, order, fragment[new], starts)
            return docs, docs.nbytes

        return self.caches.search.get("fts_docs", f"{files.uri}#{partition}", load)

    def _gone(self, files: IndexFiles, partition: int, docs: _Docs) -> np.ndarray:
        """Ids of the partition's documents no longer in the base (deleted, or of a fragment
        it no longer has), per version of the deletions."""

        def load() -> tuple[np.ndarray, int]:
            out = []
            for i, fid in enumerate(docs.fragments.tolist()):
                lo, hi = int(docs.starts[i]), int(docs.starts[i + 1])
                if fid not in self.covered:
                    out.append(np.arange(lo, hi))
                elif fid in self._deleting:
                    hits = self._deleted_rows(self._deleting[fid]).hits(docs.sorted_rowid[lo:hi])
                    if hits is not None:
                        out.append(lo + np.flatnonzero(hits))
            at = np.concatenate(out) if out else np.zeros(0, np.int64)
            gone = docs.doc_of(at.astype(np.int64))
            return gone, gone.nbytes + 64

        key = f"{files.uri}#{partition}#{self._gone_key}"
        return self.caches.search.get("fts_gone", key, load)

    def _postings(self, files: IndexFiles, partition: int, terms: Sequence[str]) -> list[_Posting]:
        """Each term's (row ids, term frequencies, document lengths) in a partition: the terms
        not cached yet decoded together, then kept."""
        cache = self.caches.search
        keys = [f"{files.uri}#{partition}#{t}" for t in terms]
        missing = [t for t, key in zip(terms, keys) if not cache.contains("fts_postings", key)]
        fresh = self._decode(files, partition, missing) if missing else {}

        def load(term: str) -> tuple[_Posting, int]:
            value = fresh[term] if term in fresh else self._decode(files, partition, [term])[term]
            return value, sum(a.nbytes for a in value) + 64

        return [cache.get("fts_postings", key, partial(load, t)) for t, key in zip(terms, keys)]

    def _decode(
        self, files: IndexFiles, partition: int, terms: Sequence[str]
    ) -> dict[str, _Posting]:
        ids = token_ids(files, partition, terms)
        docs = self._docs(files, partition)
        decoded = dict(zip(ids, read_postings(files, partition, list(ids.values()))))
        none = np.zeros(0, np.uint32)
        out = {}
        for t in terms:
            doc, tf = decoded.get(t, (none, none))
            out[t] = (docs.rowid[doc], tf, docs.length[doc])
        return out


def _deletion_name(fragment: lance.LanceFragment) -> str:
    dv = fragment.metadata.deletion_file
    assert dv is not None  # only fragments with deletions are named
    return f"{dv.id}-{dv.read_version}"


__all__ = ["BaseTextIndex", "IndexMatches"]
