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
a document) are kept per partition to look lengths up. The documents left out are a mask per
partition (1 byte a document) and a query's live postings are kept per left-out set, so the
searches between two writes filter nothing again.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import lance
import numpy as np
import pyarrow as pa

from memwal_sql.compat.lance import index_directory, storage_options_of
from memwal_sql.compat.lance_inverted import (
    IndexFiles,
    open_index,
    read_docs,
    read_postings,
    token_ids,
)
from memwal_sql.structures.cache import CachePart, Caches
from memwal_sql.structures.rowmask import RowMask

_Posting = tuple[np.ndarray, np.ndarray]  # document ids, frequencies (uint32, as decoded)
_T = TypeVar("_T")


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
class PartitionMatches:
    """One partition's live postings of a query's distinct terms, in the partition's document
    ids, grouped by term (``counts`` a term): per posting its document, term frequency and
    document length (``uint32``, as Lance's index holds them); ``rowid`` gives each
    document's row address. ``key`` names these postings (the partition, its left-out set
    and the terms) in ``cache``, where a search keeps what it derives from them."""

    doc: np.ndarray
    tf: np.ndarray
    length: np.ndarray
    rowid: np.ndarray
    counts: np.ndarray
    key: str
    cache: CachePart

    @property
    def documents(self) -> int:
        return len(self.rowid)


@dataclass(frozen=True)
class IndexMatches:
    """What the index gives one query: the corpus it covers after the corrections (documents,
    tokens), per distinct term how many of those documents hold it, and per partition the
    postings of its live documents."""

    documents: int
    tokens: int
    frequency: np.ndarray
    partitions: list[PartitionMatches]


@dataclass(frozen=True)
class _Dead:
    """A partition's documents out of the latest corpus (by document id), and how many
    documents and tokens stay."""

    mask: np.ndarray
    documents: int
    tokens: int


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

    def prefetch_documents(self) -> None:
        """Read each partition's document file into the cache, ahead of :meth:`matches`
        (not again if :func:`prefetch_text_index` is reading it: :meth:`matches` waits)."""
        for files, p in self.partitions:
            if not _under_way(_docs_key(files, p)):
                index_docs(self.caches, files, p)

    def prefetch_postings(self, terms: Sequence[str]) -> None:
        """Read and decode ``terms``' postings in each partition into the cache, ahead of
        :meth:`matches` (not again if they are being read)."""
        for files, p in self.partitions:
            if not _under_way(_postings_key(files, p, terms)):
                index_postings(self.caches, files, p, terms)

    def matches(self, terms: Sequence[str], superseded: np.ndarray) -> IndexMatches:
        """The index's part of a search for distinct ``terms``: the base rows at row addresses
        ``superseded`` (sorted; live rows of covered fragments that newer sources replace or
        delete) left out of everything, as are deleted rows and rows of fragments no longer
        covered."""
        documents = tokens = 0
        frequency = np.zeros(len(terms), dtype=np.int64)
        out = []
        # One search after a write and every later one until the next: the left-out set is
        # named by its content, so the masks and live postings are found again.
        superseded_key = hashlib.sha1(superseded.tobytes(), usedforsecurity=False).hexdigest()
        for files, p in self.partitions:
            docs = index_docs(self.caches, files, p)
            dead_key = f"{files.uri}#{p}#{self._gone_key}#{superseded_key}"
            dead = self._dead(files, p, docs, superseded, dead_key)
            documents += dead.documents
            tokens += dead.tokens
            part = self._partition_matches(files, p, terms, docs, dead, dead_key)
            frequency += part.counts
            out.append(part)
        return IndexMatches(documents, tokens, frequency, out)

    def _dead(
        self, files: IndexFiles, partition: int, docs: _Docs, superseded: np.ndarray, key: str
    ) -> _Dead:
        def load() -> tuple[_Dead, int]:
            pos = np.searchsorted(docs.sorted_rowid, superseded)
            found = pos < len(docs.rowid)
            found[found] = docs.sorted_rowid[pos[found]] == superseded[found]
            mask = np.zeros(len(docs.rowid), dtype=bool)
            mask[self._gone(files, partition, docs)] = True
            mask[docs.doc_of(pos[found])] = True
            n = int(np.count_nonzero(mask))
            dropped = int(docs.length[mask].sum(dtype=np.int64)) if n else 0
            dead = _Dead(mask, len(docs.rowid) - n, docs.total - dropped)
            return dead, mask.nbytes + 64

        return self.caches.search.get("fts_dead", key, load)

    def _partition_matches(
        self,
        files: IndexFiles,
        partition: int,
        terms: Sequence[str],
        docs: _Docs,
        dead: _Dead,
        dead_key: str,
    ) -> PartitionMatches:
        """The partition's live postings of ``terms`` as one group, kept per left-out set and
        terms (a warm search concatenates nothing). Built from the decoded postings in one
        pass: joined, the dead left out, lengths looked up for the live ones only (each copy
        of a common term's postings is fresh memory a cold search pays for)."""
        key = dead_key + "#" + "\x1f".join(terms)

        def load() -> tuple[PartitionMatches, int]:
            decoded = index_postings(self.caches, files, partition, terms)
            lives = [np.logical_not(m, out=m) for m in (dead.mask[d] for d, _ in decoded)]
            counts = np.array([np.count_nonzero(live) for live in lives], dtype=np.int64)
            # The live postings written once, where they go, as decoded (uint32, as Lance's
            # document ids are): joining and filtering int64 copies was 90 MB of fresh memory
            # for 3.2M postings at 10M documents, this is 38 MB.
            doc = np.empty(int(counts.sum()), dtype=np.uint32)
            tf = np.empty_like(doc)
            length = np.empty_like(doc)
            at = 0
            for (d, f), live, n in zip(decoded, lives, counts.tolist()):
                # The live positions listed once, each array gathered into its place:
                # np.compress lists them per array, and with ``out`` (its default mode
                # "raise") writes through a fresh copy of it.
                kept = np.flatnonzero(live)
                np.take(d, kept, out=doc[at : at + n], mode="clip")
                np.take(f, kept, out=tf[at : at + n], mode="clip")
                np.take(docs.length, doc[at : at + n], out=length[at : at + n], mode="clip")
                at += n
            found = PartitionMatches(doc, tf, length, docs.rowid, counts, key, self.caches.search)
            return found, doc.nbytes + tf.nbytes + length.nbytes + 64

        return self.caches.search.get("fts_matches", key, load)

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


class IndexTerms:
    """A generation's documents as its own inverted index holds them (the
    :class:`~memwal_sql.formats.tokenizer.DocumentTerms` a full-text search reads): each row's
    token count from the document files, the query terms' occurrences from their postings.
    Nothing is tokenized; only the documents files and the query terms' postings are read.

    Example:
        ``IndexTerms(files, rows=ds.count_rows(), caches=c).occurrences(pa.array(["fox"]))``
    """

    def __init__(self, files: IndexFiles, rows: int, caches: Caches) -> None:
        self.files = files
        self.caches = caches
        self.lengths = np.zeros(rows, dtype=np.int64)
        # A generation is one fragment: a row id's low half is the row's offset.
        self._rows = []
        for p in files.partitions:
            docs = index_docs(caches, files, p)
            offsets = (docs.rowid & np.uint64(0xFFFFFFFF)).astype(np.int64)
            self.lengths[offsets] = docs.length
            self._rows.append(offsets)

    @property
    def nbytes(self) -> int:
        return self.lengths.nbytes + sum(r.nbytes for r in self._rows)

    def occurrences(self, terms: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Every occurrence of ``terms`` as :meth:`Tokens.occurrences` gives them: a
        document holding a term ``tf`` times is named ``tf`` times."""
        names = terms.to_pylist()
        position, row = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for p, offsets in zip(self.files.partitions, self._rows):
            for number, (doc, tf) in enumerate(index_postings(self.caches, self.files, p, names)):
                position.append(np.full(int(tf.sum()), number, dtype=np.int64))
                row.append(np.repeat(offsets[doc], tf.astype(np.int64)))
        position_all, row_all = np.concatenate(position), np.concatenate(row)
        order = np.lexsort((row_all, position_all))
        return position_all[order], row_all[order]


def prefetch_text_index(files: Sequence[IndexFiles], terms: Sequence[str], caches: Caches) -> None:
    """Read the document files of an inverted index's ``files`` and decode the postings of
    distinct ``terms``, into ``caches.search``: what a search of ``terms`` reads first, started
    before its snapshot is taken (a search that asks for them meanwhile waits for this read
    rather than reading them again).

    Example:
        ``prefetch_text_index(open_text_index(ds, "text", ids)[0], ["fox"], tbl.caches)``
    """
    for f in files:
        for p in f.partitions:
            index_docs(caches, f, p)
    for f in files:
        for p in f.partitions:
            index_postings(caches, f, p, terms)


# Loads under way, by key: a second caller of a key shares the first one's load.
_LOADING: dict[str, futures.Future[object]] = {}
_LOADING_LOCK = threading.Lock()


def _shared(key: str, load: Callable[[], _T]) -> _T:
    """``load()``, or the value of the load of ``key`` another thread has under way: one
    read of a file, even when a search asks for it while an early read
    (:func:`prefetch_text_index`) is not done, and whether the cache keeps it or not."""
    with _LOADING_LOCK:
        running = _LOADING.get(key)
        if running is None:
            mine: futures.Future[object] = futures.Future()
            _LOADING[key] = mine
    if running is not None:
        return running.result()  # type: ignore[return-value]
    try:
        value = load()
    except BaseException as e:
        mine.set_exception(e)
        raise
    finally:
        with _LOADING_LOCK:
            del _LOADING[key]
    mine.set_result(value)
    return value


def _under_way(key: str) -> bool:
    """Whether a load of ``key`` is under way (a prefetch need not wait for it)."""
    with _LOADING_LOCK:
        return key in _LOADING


def _docs_key(files: IndexFiles, partition: int) -> str:
    return f"{files.uri}#{partition}"


def _postings_key(files: IndexFiles, partition: int, terms: Sequence[str]) -> str:
    return "\x1f".join(f"{files.uri}#{partition}#{t}" for t in terms)


def index_docs(caches: Caches, files: IndexFiles, partition: int) -> _Docs:
    """A partition's document file, read once and kept in ``caches.search``."""

    def load() -> tuple[_Docs, int]:
        rowid, length, total = read_docs(files, partition)
        order = None if np.all(rowid[1:] > rowid[:-1]) else np.argsort(rowid, kind="stable")
        ascending = rowid if order is None else rowid[order]
        docs = _Docs(rowid, length, total, ascending, order, *_fragment_runs(ascending))
        return docs, docs.nbytes

    key = _docs_key(files, partition)
    return _shared(key, lambda: caches.search.get("fts_docs", key, load))


_FRAGMENTS_SEARCHED = 64  # fragments found by binary search before the rest by a pass


def _fragment_runs(rowid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fragments of ascending row ids ``rowid`` and where each one's rows start (and the
    last ends). A row id's high half is its fragment: each fragment's end is a binary search,
    so the ids are not shifted whole (at 10M documents that was 80 MB of fresh memory); past
    a few dozen fragments the rest are found in one pass.

    Example:
        >>> [a.tolist() for a in _fragment_runs(np.array([1, 2, 5 << 32, 7 << 32], np.uint64))]
        [[0, 5, 7], [0, 2, 3, 4]]
    """
    fragments: list[int] = []
    starts, at = [0], 0
    while at < len(rowid) and len(fragments) < _FRAGMENTS_SEARCHED:
        fragment = int(rowid[at]) >> 32
        fragments.append(fragment)
        end = (fragment + 1) << 32  # past the largest row id for the last fragment id
        at = len(rowid) if end >= 1 << 64 else int(np.searchsorted(rowid, np.uint64(end)))
        starts.append(at)
    if at < len(rowid):
        rest = rowid[at:] >> np.uint64(32)
        new = np.ones(len(rest), dtype=bool)
        new[1:] = rest[1:] != rest[:-1]
        fragments.extend(rest[new].tolist())
        starts.extend([*(at + np.flatnonzero(new[1:]) + 1).tolist(), len(rowid)])
    return np.array(fragments, dtype=np.uint64), np.array(starts, dtype=np.int64)


def index_postings(
    caches: Caches, files: IndexFiles, partition: int, terms: Sequence[str]
) -> list[_Posting]:
    """Each term's (document ids, term frequencies) in a partition, as decoded (``uint32``):
    the terms not cached yet decoded together, then kept in ``caches.search``."""
    cache = caches.search
    keys = [f"{files.uri}#{partition}#{t}" for t in terms]

    def read() -> list[_Posting]:
        missing = [t for t, key in zip(terms, keys) if not cache.contains("fts_postings", key)]
        fresh = _decode(files, partition, missing) if missing else {}

        def load(term: str) -> tuple[_Posting, int]:
            value = fresh[term] if term in fresh else _decode(files, partition, [term])[term]
            return value, sum(a.nbytes for a in value) + 64

        return [cache.get("fts_postings", key, partial(load, t)) for t, key in zip(terms, keys)]

    return _shared(_postings_key(files, partition, terms), read)


def _decode(files: IndexFiles, partition: int, terms: Sequence[str]) -> dict[str, _Posting]:
    ids = token_ids(files, partition, terms)
    decoded = dict(zip(ids, read_postings(files, partition, list(ids.values()))))
    none = (np.zeros(0, np.uint32), np.zeros(0, np.uint32))
    return {t: decoded.get(t, none) for t in terms}


def open_text_index(
    dataset: lance.LanceDataset,
    column: str,
    fragment_ids: set[int],
    caches: Caches | None = None,
    before_open: Callable[[str], None] | None = None,
) -> tuple[list[IndexFiles], set[int]] | str:
    """The files of ``dataset``'s inverted index on ``column`` and the fragments of
    ``fragment_ids`` it covers, or why it is not read here. With ``caches``, each index
    directory's files are opened once (in ``caches.search``: a directory never changes);
    ``before_open(uuid)`` runs before a segment's files are first opened (a generation
    verifies them: its other indexes' files are not opened).

    Example:
        ``open_text_index(ds, "text", {f.fragment_id for f in ds.get_fragments()})``
    """
    found = [
        d
        for d in dataset.describe_indices()
        if d.field_names == [column] and "Inverted" in d.type_url
    ]
    if not found:
        return "no inverted index"
    if dataset.has_stable_row_ids:
        return "the table has stable row ids, the index holds no row addresses"
    files: list[IndexFiles] = []
    covered: set[int] = set()
    for segment in found[0].segments:
        fragments = set(segment.fragment_ids)
        if segment.base_id is not None or fragments & covered:
            return "index segments in another base or overlapping"
        if before_open is not None:
            before_open(segment.uuid)
        directory, options = index_directory(dataset, segment.uuid), storage_options_of(dataset)
        load = partial(_open_index, directory, options)
        if caches is None:
            opened = load()[0]
        else:  # opened with these storage options (named by a digest: they may hold secrets)
            named = repr(sorted((options or {}).items())).encode()
            digest = hashlib.sha1(named, usedforsecurity=False).hexdigest()
            opened = caches.search.get("fts_files", f"{directory}#{digest}", load)
        if isinstance(opened, str):
            return opened
        files.append(opened)
        covered |= fragments
    return files, covered & fragment_ids


def _open_index(directory: str, options: dict[str, str] | None) -> tuple[IndexFiles | str, int]:
    return open_index(directory, options), 1024


def _deletion_name(fragment: lance.LanceFragment) -> str:
    dv = fragment.metadata.deletion_file
    assert dv is not None  # only fragments with deletions are named
    return f"{dv.id}-{dv.read_version}"


__all__ = [
    "BaseTextIndex",
    "IndexMatches",
    "IndexTerms",
    "PartitionMatches",
    "index_docs",
    "index_postings",
    "open_text_index",
    "prefetch_text_index",
]
