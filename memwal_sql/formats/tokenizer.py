"""Lance's full-text tokenizer, re-implemented over Arrow columns.

A full-text search over live data scores MemTable and generation rows the way Lance's inverted
index scores base rows, so they must be split into the same terms. Lance 14 builds its tokenizer
from the index parameters in this order (``InvertedIndexParams::build``): a base tokenizer
(``simple``: runs of letters and digits; ``whitespace``; ``raw``: the whole text), tokens of
``max_token_length`` bytes or more removed, lower case, Snowball stemming, stop words (compared
with the *stemmed* token), ASCII folding. The splitting and casing run over the whole column's
bytes in numpy (Arrow kernels for the whitespace and raw tokenizers); stemming, stop words and
folding run once per distinct token.

Example:
    >>> t = Tokenizer()
    >>> t.terms("The runners were running quickly, naïvely!")
    ['runner', 'run', 'quick', 'naiv']
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.compat.lance_fts import ENGLISH_STOP_STEMS
from memwal_sql.errors import InvalidInputError

# Folding beyond what Unicode decomposition gives (Lucene's ASCIIFoldingFilter, the letters
# that have no combining-mark decomposition).
_FOLD = str.maketrans(
    {
        "ß": "ss",
        "æ": "ae",
        "Æ": "AE",
        "œ": "oe",
        "Œ": "OE",
        "ø": "o",
        "Ø": "O",
        "đ": "d",
        "Đ": "D",
        "ł": "l",
        "Ł": "L",
        "þ": "th",
        "Þ": "TH",
        "ð": "d",
        "Ð": "D",
        "ı": "i",
        "ĸ": "q",
        "ŀ": "l",
        "ŉ": "n",
    }
)


_MAX_KNOWN_TOKENS = 1 << 20  # distinct tokens whose final term a tokenizer remembers
_MAX_KEPT_QUERY = 4096  # longer query texts are not kept: 1024 of them would hold too much
# What one remembered token costs in memory: two short str objects and a dict slot.
_TOKEN_BYTES = 160


class DocumentTerms(Protocol):
    """What a full-text search reads of a list of documents: each one's token count and the
    occurrences of the query's terms. :class:`Tokens` holds them tokenized; an inverted
    index's files give them without tokenizing."""

    @property
    def lengths(self) -> np.ndarray: ...

    @property
    def nbytes(self) -> int: ...

    def occurrences(self, terms: pa.Array) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class Tokens:
    """The terms of a column of documents: token ``i`` is term ``term_ids[i]`` (an index into
    ``vocabulary``) of document ``docs[i]``; ``lengths`` counts each document's tokens."""

    docs: np.ndarray
    term_ids: np.ndarray
    vocabulary: list[str]
    lengths: np.ndarray
    sort_postings: bool = True
    """Find terms' documents in a term-sorted copy (built once: for tokens that live long)
    rather than by scanning every token (for tokens rebuilt often, as a MemTable's are)."""

    @property
    def nbytes(self) -> int:
        """The token arrays' memory (about thrice the documents array: with the term ids
        and the term-sorted copy), what a cache counts."""
        return self.docs.nbytes * 3 + self.lengths.nbytes

    @cached_property
    def _vocabulary_array(self) -> pa.Array:
        return pa.array(self.vocabulary, pa.string())

    @cached_property
    def _postings(self) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(self.term_ids, kind="stable")
        bounds = np.zeros(len(self.vocabulary) + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.term_ids, minlength=len(self.vocabulary)), out=bounds[1:])
        return self.docs[order], bounds

    def occurrences(self, terms: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Every occurrence of any of ``terms`` (distinct strings): the position in ``terms``
        of its term and its document, ordered by that position, then by document. Linear in
        the vocabulary, the terms and the occurrences found, whatever the number of terms.

        Example:
            >>> t = Tokenizer().tokenize(pa.array(["red fox", "red hen", "fox"]))
            >>> [x.tolist() for x in t.occurrences(pa.array(["fox", "red"]))]
            [[0, 0, 1, 1], [0, 2, 0, 1]]
        """
        empty = np.zeros(0, dtype=np.int64)
        if not self.vocabulary or not len(terms):
            return empty, empty
        found = pc.index_in(self._vocabulary_array, value_set=terms)
        position = pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        if not self.sort_postings:  # one pass over the tokens, then grouped by term
            wanted = position[self.term_ids]
            hit = wanted >= 0
            which, docs = wanted[hit], self.docs[hit]
            order = np.argsort(which, kind="stable")  # a term's documents stay in order
            return which[order], docs[order]
        # The slices of the term-sorted copy that hold the wanted terms, gathered at once.
        sorted_docs, bounds = self._postings
        ids = np.flatnonzero(position >= 0)
        ids = ids[np.argsort(position[ids], kind="stable")]
        starts, counts = bounds[ids], bounds[ids + 1] - bounds[ids]
        total = int(counts.sum())
        first = np.repeat(np.cumsum(counts) - counts, counts)
        at = np.repeat(starts, counts) + np.arange(total, dtype=np.int64) - first
        return np.repeat(position[ids], counts), sorted_docs[at]


class Tokenizer:
    """Lance's tokenizer for the given index parameters (Lance's defaults when none).

    ``params`` is what ``index_statistics`` reports under ``params``: ``base_tokenizer``,
    ``language``, ``max_token_length``, ``lower_case``, ``stem``, ``remove_stop_words``,
    ``ascii_folding``.
    """

    def __init__(self, params: Mapping[str, Any] | None = None) -> None:
        p = dict(params or {})
        self.base = p.get("base_tokenizer", "simple")
        self.language = p.get("language", "English")
        self.max_token_length = p.get("max_token_length", 40)
        self.lower_case = p.get("lower_case", True)
        self.stem = p.get("stem", True)
        self.remove_stop_words = p.get("remove_stop_words", True)
        self.ascii_folding = p.get("ascii_folding", True)
        if self.base not in ("simple", "whitespace", "raw"):
            raise InvalidInputError(
                f"full-text search over live data supports the simple, "
                f"whitespace and raw tokenizers, not {self.base!r}"
            )
        if (self.stem or self.remove_stop_words) and self.language != "English":
            raise InvalidInputError(
                f"full-text search over live data stems and removes stop "
                f"words for English only, not {self.language!r}"
            )
        if p.get("custom_stop_words"):
            raise InvalidInputError("custom stop words are not supported yet")
        self._stemmer: Any = None
        self._final: dict[str, str | None] = {}
        self._final_lock = threading.Lock()  # sources are tokenized side by side
        self._queries: dict[str, list[str]] = {}

    @property
    def nbytes(self) -> int:
        """An estimate of the memory the tokenizer holds: its stemmer and what it remembers
        (each token's final term, recent queries' terms), for the cache that keeps it."""
        queries = sum(2 * len(text) + _TOKEN_BYTES for text in self._queries)
        return (1 << 16) + _TOKEN_BYTES * len(self._final) + queries

    @property
    def signature(self) -> str:
        """What decides the terms: two tokenizers of one signature split texts alike."""
        return (
            f"{self.base}|{self.language}|{self.max_token_length}|{self.lower_case}|"
            f"{self.stem}|{self.remove_stop_words}|{self.ascii_folding}"
        )

    def tokenize(self, texts: pa.Array | pa.ChunkedArray) -> Tokens:
        """The terms of every document of ``texts`` (a NULL document has none)."""
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks() if texts.num_chunks else pa.array([], pa.string())
        n = len(texts)
        texts = texts.cast(pa.large_string()) if pa.types.is_string_view(texts.type) else texts
        if texts.null_count:  # else a copy of every text for nothing
            texts = pc.fill_null(texts, "")
        flat, docs, lower = self._split_cased(texts)
        encoded = pc.dictionary_encode(flat)
        raw_ids = encoded.indices.to_numpy(zero_copy_only=False)
        # Lower case is a function of the token: applied to the distinct ones (the finals
        # below join tokens that become one), not to every occurrence.
        distinct = pc.utf8_lower(encoded.dictionary) if lower else encoded.dictionary
        index: dict[str, int] = {}  # each final term's id, in order of first appearance
        finals = self._finals(distinct.to_pylist())
        mapping = np.fromiter(
            (-1 if t is None else index.setdefault(t, len(index)) for t in finals),
            dtype=np.int64,
            count=len(finals),
        )
        vocabulary = list(index)
        term_ids = mapping[raw_ids] if len(raw_ids) else np.zeros(0, np.int64)
        live = term_ids >= 0
        doc_ids, term_ids = docs[live], term_ids[live]
        if len(doc_ids) and np.any(doc_ids[1:] < doc_ids[:-1]):
            order = np.argsort(doc_ids, kind="stable")  # occurrences come by document
            doc_ids, term_ids = doc_ids[order], term_ids[order]
        return Tokens(
            doc_ids, term_ids, vocabulary, np.bincount(doc_ids, minlength=n).astype(np.int64)
        )

    def _split(self, texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
        """The tokens of ``texts`` (no NULLs), cased as configured, and each one's document
        (ascending). The simple tokenizer's runs of letters and digits are found over the
        UTF-8 bytes in numpy, each distinct non-ASCII character classified once: the
        tokens of the Unicode regex (``_split_by_kernel``), at a fraction of its cost."""
        flat, docs, lower = self._split_cased(texts)
        return pc.utf8_lower(flat) if lower else flat, docs

    def _split_cased(self, texts: pa.Array) -> tuple[pa.Array, np.ndarray, bool]:
        """:meth:`_split`'s tokens and documents, and whether the tokens are still to be
        lower-cased (the split over bytes lower-cases ASCII letters only)."""
        if self.base != "simple" or len(texts) == 0:
            return (*self._split_by_kernel(texts), False)
        return self._split_bytes(texts)

    def _split_by_kernel(self, texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
        n = len(texts)
        if self.base == "simple":
            parts = pc.split_pattern_regex(texts, r"[^\p{L}\p{N}]+")
        elif self.base == "whitespace":
            parts = pc.utf8_split_whitespace(texts)
        else:
            parts = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), texts)
        flat = pc.list_flatten(parts)
        docs = pc.list_parent_indices(parts)
        keep = pc.not_equal(flat, "")
        if self.max_token_length is not None:  # Lance keeps tokens shorter than the limit
            keep = pc.and_(keep, pc.less(pc.binary_length(flat), self.max_token_length))
        flat, docs = flat.filter(keep), docs.filter(keep)
        if self.lower_case:
            flat = pc.utf8_lower(flat)
        return flat, docs.to_numpy(zero_copy_only=False).astype(np.int64)

    def _split_bytes(self, texts: pa.Array) -> tuple[pa.Array, np.ndarray, bool]:
        """Runs of letters and digits (Unicode ``L*`` and ``N*``): token boundaries from
        byte arithmetic, the tokens' bytes gathered into one buffer; ASCII letters
        lower-cased, and whether other letters are still to be (non-ASCII text)."""
        large = pa.types.is_large_string(texts.type)
        _, offset_buffer, data_buffer = texts.buffers()
        offsets = np.frombuffer(offset_buffer, dtype=np.int64 if large else np.int32)
        offsets = offsets[texts.offset : texts.offset + len(texts) + 1].astype(np.int64)
        data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer else np.zeros(0, np.uint8)
        data = data[offsets[0] : offsets[-1]]
        offsets = offsets - offsets[0]
        # ASCII letters and digits by byte arithmetic (faster than a lookup table).
        word = ((data - np.uint8(48)) < 10) | (((data | np.uint8(32)) - np.uint8(97)) < 26)
        unicode = bool(len(data)) and int(data.max()) >= 0x80
        if unicode:
            word |= _unicode_word_bytes(data)
        # A token starts at a word byte after a non-word byte or at a document's start, and
        # ends before a non-word byte or a document's end.
        inner = offsets[1:-1]
        inner = inner[(inner > 0) & (inner < len(data))]  # empty documents at either end
        before = np.empty(len(data), dtype=bool)
        before[:1] = False
        before[1:] = word[:-1]
        before[inner] = False
        after = np.empty(len(data), dtype=bool)
        after[-1:] = False
        after[:-1] = word[1:]
        after[inner - 1] = False
        starts = np.flatnonzero(np.greater(word, before, out=before))  # word and not before
        ends = np.flatnonzero(np.greater(word, after, out=after)) + 1
        token_bytes = np.compress(word, data)
        if self.lower_case:  # in place: each array here is fresh memory to a cold search
            upper = (token_bytes - np.uint8(65)) < 26
            token_bytes += upper.view(np.uint8) << np.uint8(5)
        lengths = np.subtract(ends, starts, out=ends)  # ends are not needed further
        kind, width = (
            (pa.large_string(), np.int64)
            if len(token_bytes) >= 1 << 31
            else (pa.string(), np.int32)
        )
        token_offsets = np.zeros(len(lengths) + 1, dtype=width)
        np.cumsum(lengths, out=token_offsets[1:])
        flat = pa.Array.from_buffers(
            kind, len(starts), [None, pa.py_buffer(token_offsets), pa.py_buffer(token_bytes)]
        )
        # Each document's tokens are the starts within it: their counts found per document
        # (a search per document rather than per token), each token's document repeated.
        within = np.diff(np.searchsorted(starts, offsets))
        docs = np.repeat(np.arange(len(within), dtype=np.int64), within)
        if self.max_token_length is not None:  # Lance keeps tokens shorter than the limit
            keep = lengths < self.max_token_length
            if not keep.all():
                flat, docs = flat.filter(pa.array(keep)), docs[keep]
        # The ASCII letters are lower already.
        return flat, docs.astype(np.int64, copy=False), self.lower_case and unicode

    def terms(self, text: str) -> list[str]:
        """The terms of one text, in order (what a query becomes); recent short texts are
        kept."""
        terms = self._queries.get(text)
        if terms is None:
            tokens = self.tokenize(pa.array([text], pa.string()))
            terms = [tokens.vocabulary[i] for i in tokens.term_ids]
            if len(text) <= _MAX_KEPT_QUERY:
                if len(self._queries) >= 1024:
                    self._queries.clear()
                self._queries[text] = terms
        return list(terms)

    def _finals(self, tokens: list[str]) -> list[str | None]:
        """Each distinct token after stemming, stop words and folding (None: removed)."""
        with self._final_lock:
            known = self._final
            new = [t for t in tokens if t not in known]
            if len(known) + len(new) > _MAX_KNOWN_TOKENS:
                known.clear()  # a long-lived tokenizer must not grow without bound
                new = list(dict.fromkeys(tokens))  # the ones known a moment ago too
            if new:
                stems = self._stems(new)
                for token, stem in zip(new, stems):
                    final: str | None = stem
                    if self.remove_stop_words and stem in ENGLISH_STOP_STEMS:
                        final = None
                    elif self.ascii_folding and not stem.isascii():
                        final = _fold(stem)
                    known[token] = final
            return [known[t] for t in tokens]

    def _stems(self, tokens: list[str]) -> list[str]:
        if not self.stem:
            return tokens
        if self._stemmer is None:
            import Stemmer  # PyStemmer: the Snowball English (Porter2) stemmer Lance uses

            self._stemmer = Stemmer.Stemmer("english")
        return self._stemmer.stemWords(tokens)


def _unicode_word_bytes(data: np.ndarray) -> np.ndarray:
    """Which bytes of UTF-8 ``data`` belong to a non-ASCII letter or digit (Unicode ``L*``
    or ``N*``, as the regex ``\\p{L}\\p{N}`` has them): each character's code point decoded
    from its lead byte, each distinct one classified once.

    Example:
        >>> _unicode_word_bytes(np.frombuffer("é-€".encode(), np.uint8)).tolist()
        [True, True, False, False, False, False]
    """
    lead = np.flatnonzero(data >= 0xC0)  # a continuation byte is 0x80-0xBF
    b0 = data[lead].astype(np.int32)
    width = 2 + (b0 >= 0xE0) + (b0 >= 0xF0)
    last = len(data) - 1

    def tail(i: int) -> np.ndarray:
        return (data[np.minimum(lead + i, last)] & 0x3F).astype(np.int32)

    point = np.where(
        width == 2,
        ((b0 & 0x1F) << 6) | tail(1),
        np.where(
            width == 3,
            ((b0 & 0x0F) << 12) | (tail(1) << 6) | tail(2),
            ((b0 & 0x07) << 18) | (tail(1) << 12) | (tail(2) << 6) | tail(3),
        ),
    )
    distinct, which = np.unique(point, return_inverse=True)
    letter = np.array(
        [unicodedata.category(chr(c))[0] in "LN" for c in distinct.tolist()], dtype=bool
    )
    out = np.zeros(len(data), dtype=bool)
    hit = letter[which.reshape(-1)]
    at, n = lead[hit], width[hit]
    total = int(n.sum())
    # Every byte of each letter: its lead's position plus 0 .. width - 1.
    first = np.repeat(np.cumsum(n) - n, n)
    out[np.minimum(np.repeat(at, n) + np.arange(total) - first, last)] = True
    return out


def _fold(token: str) -> str:
    decomposed = unicodedata.normalize("NFKD", token.translate(_FOLD))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


class GrowingTokens:
    """The terms of a growing list of documents (a MemTable's), extended as it grows: only
    new documents are tokenized; their terms join one vocabulary.

    Example:
        >>> g = GrowingTokens(Tokenizer())
        >>> g.extend(pa.array(["red fox"])); g.extend(pa.array(["red hen"]))
        >>> g.tokens().occurrences(pa.array(["red"]))[1].tolist()
        [0, 1]
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocabulary: list[str] = []
        self._index: dict[str, int] = {}
        self._docs: list[np.ndarray] = []
        self._term_ids: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self.documents = 0
        self._cached: Tokens | None = None

    def extend(self, texts: pa.Array | pa.ChunkedArray) -> None:
        """Add the documents of ``texts`` after the ones already held."""
        if len(texts) == 0:
            return
        new = self.tokenizer.tokenize(texts)
        index = self._index
        if index:
            mapping = np.fromiter(
                (index.setdefault(t, len(index)) for t in new.vocabulary),
                dtype=np.int64,
                count=len(new.vocabulary),
            )
            self.vocabulary.extend(list(index)[len(self.vocabulary) :])
            term_ids = mapping[new.term_ids] if len(new.term_ids) else new.term_ids
        else:  # the first documents (a reader's whole WAL tail): their ids as they are
            index.update(zip(new.vocabulary, range(len(new.vocabulary))))
            self.vocabulary.extend(new.vocabulary)
            term_ids = new.term_ids
        self._docs.append(new.docs + self.documents)
        self._term_ids.append(term_ids)
        self._lengths.append(new.lengths)
        self.documents += len(new.lengths)
        self._cached = None

    @property
    def nbytes(self) -> int:
        """An estimate of the memory held: the token arrays (twice: as extended and joined)
        and the vocabulary with its index."""
        arrays = sum(
            a.nbytes for parts in (self._docs, self._term_ids, self._lengths) for a in parts
        )
        return 2 * arrays + _TOKEN_BYTES * len(self.vocabulary)

    def tokens(self) -> Tokens:
        """Everything so far as :class:`Tokens` (no sorted postings: rebuilt as it grows)."""
        if self._cached is None:

            def joined(parts: list[np.ndarray]) -> np.ndarray:
                if len(parts) == 1:  # arrays are never written to: shared, not copied
                    return parts[0]
                return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

            self._cached = Tokens(
                joined(self._docs),
                joined(self._term_ids),
                list(self.vocabulary),
                joined(self._lengths),
                sort_postings=False,
            )
        return self._cached


__all__ = ["DocumentTerms", "GrowingTokens", "Tokenizer", "Tokens"]
