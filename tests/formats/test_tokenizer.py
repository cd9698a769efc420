"""The terms of a column of documents: every occurrence of a set of terms found at once."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal_sql.formats.tokenizer import GrowingTokens, Tokenizer

WORDS = ["red", "fox", "hen", "den", "sky", "blue", "the", "runs"]


@settings(max_examples=100, deadline=None)
@given(
    docs=st.lists(st.lists(st.sampled_from(WORDS), max_size=8).map(" ".join), max_size=12),
    terms=st.lists(st.sampled_from([*WORDS, "run", "nowhere"]), unique=True, max_size=6),
    sort_postings=st.booleans(),
)
def test_occurrences_are_every_occurrence_of_each_term_in_order(docs, terms, sort_postings):
    tokens = Tokenizer().tokenize(pa.array(docs, pa.string()))
    tokens = dataclasses.replace(tokens, sort_postings=sort_postings)
    want_term, want_doc = [], []
    for position, term in enumerate(terms):  # the naive way: one scan per term
        tid = tokens.vocabulary.index(term) if term in tokens.vocabulary else -1
        found = tokens.docs[tokens.term_ids == tid]
        want_term += [position] * len(found)
        want_doc += found.tolist()
    term, doc = tokens.occurrences(pa.array(terms, pa.string()))
    assert term.tolist() == want_term and doc.tolist() == want_doc
    assert term.dtype == doc.dtype == np.int64


_TEXT = st.lists(
    st.sampled_from(
        # Letters and digits of 2, 3 and 4 bytes, and non-ASCII characters that split words
        # (punctuation, a combining mark, a symbol, an emoji, a non-breaking space), and
        # letters whose lower case has another length ("İ", "Ω" as "Ω").
        [*"aZ09 _-.\t\nÄéß漢ı", *"\u0301“—€😀\u00a0İΩ٣𝐀ǅ", "ab", "Runner", "x" * 41, "é" * 20]
    ),
    max_size=12,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(
    docs=st.lists(st.one_of(st.none(), _TEXT), max_size=10),
    lower_case=st.booleans(),
    max_token_length=st.sampled_from([None, 3, 40]),
    large=st.booleans(),
)
def test_documents_split_over_bytes_as_the_unicode_regex_splits_them(
    docs, lower_case, max_token_length, large
):
    """The split over UTF-8 bytes (ASCII and non-ASCII documents alike) gives the regex's
    tokens, document by document, documents ascending: a wrong boundary, character class,
    case or length limit differs."""
    tok = Tokenizer({"lower_case": lower_case, "max_token_length": max_token_length})
    texts = pa.array(docs, pa.large_string() if large else pa.string())
    texts = pa.compute.fill_null(texts, "")
    for sliced in (texts, texts.slice(1)):
        flat, doc = tok._split(sliced)
        want_flat, want_doc = tok._split_by_kernel(sliced)
        assert np.all(np.diff(doc) >= 0)
        got = sorted(zip(doc.tolist(), flat.to_pylist()))
        assert got == sorted(zip(want_doc.tolist(), want_flat.to_pylist()))
        tokens = tok.tokenize(sliced)
        assert np.all(np.diff(tokens.docs) >= 0)  # occurrences by document
        finals = tok._finals(want_flat.to_pylist())
        want_terms = sorted((d, t) for d, t in zip(want_doc.tolist(), finals) if t is not None)
        got_terms = [tokens.vocabulary[i] for i in tokens.term_ids]
        assert sorted(zip(tokens.docs.tolist(), got_terms)) == want_terms


@settings(max_examples=100, deadline=None)
@given(
    batches=st.lists(st.lists(st.one_of(st.none(), _TEXT), max_size=6), min_size=1, max_size=4),
    terms=st.lists(st.sampled_from(["ab", "runner", "é", "ss", "a", "z", "09"]), unique=True),
)
def test_growing_tokens_are_the_tokens_of_all_documents_at_once(batches, terms):
    """Documents added batch by batch (the first batch's term ids kept as they are, the
    later ones mapped into its vocabulary) have each document's length and each term's
    occurrences that tokenizing them together gives: a wrong id or offset differs."""
    tok = Tokenizer()
    grown = GrowingTokens(tok)
    for batch in batches:
        grown.extend(pa.array(batch, pa.string()))
    every = [d for batch in batches for d in batch]
    got, want = grown.tokens(), tok.tokenize(pa.array(every, pa.string()))
    assert got.lengths.tolist() == want.lengths.tolist()
    asked = pa.array(terms, pa.string())
    assert [a.tolist() for a in got.occurrences(asked)] == [
        a.tolist() for a in want.occurrences(asked)
    ]
    words = lambda t: sorted(zip(t.docs.tolist(), (t.vocabulary[i] for i in t.term_ids)))  # noqa: E731
    assert words(got) == words(want)


def test_growing_tokens_keep_the_first_batch_ids_and_map_the_later_ones():
    """A reader's WAL tail is one extend, its term ids kept as the tokenizer gave them; a
    later batch's ids join that vocabulary (not restart it)."""
    grown = GrowingTokens(Tokenizer())
    grown.extend(pa.array(["red fox", None, "fox den"]))
    first = grown.tokens()
    assert first.vocabulary == ["red", "fox", "den"]
    assert first.term_ids.tolist() == [0, 1, 1, 2]
    grown.extend(pa.array(["den hen"]))
    second = grown.tokens()
    assert second.vocabulary == ["red", "fox", "den", "hen"]
    assert second.term_ids.tolist() == [0, 1, 1, 2, 2, 3]
    assert second.docs.tolist() == [0, 0, 2, 2, 3, 3]
    assert first.term_ids.tolist() == [0, 1, 1, 2]  # the earlier view is unchanged


def test_one_tokenizer_shared_by_threads_gives_each_the_terms_of_its_own(monkeypatch):
    """A search tokenizes its sources side by side with one tokenizer, whose remembered
    tokens are cleared when too many: each thread's terms are those a tokenizer of its own
    gives (an unguarded clear between a lookup and its use loses a token)."""
    from concurrent.futures import ThreadPoolExecutor

    from memwal_sql.formats import tokenizer

    monkeypatch.setattr(tokenizer, "_MAX_KNOWN_TOKENS", 50)  # cleared over and over
    rng = np.random.default_rng(3)
    columns = [
        pa.array([" ".join(f"t{n}x{i}" for n in rng.integers(0, 400, 20)) for _ in range(200)])
        for i in range(6)
    ]
    shared = Tokenizer()

    def terms(tok: Tokenizer, texts: pa.Array) -> list[tuple[int, str]]:
        t = tok.tokenize(texts)
        return sorted(zip(t.docs.tolist(), (t.vocabulary[i] for i in t.term_ids)))

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda texts: terms(shared, texts), columns * 4))
    assert got == [terms(Tokenizer(), texts) for texts in columns * 4]


def test_tokens_whose_non_ascii_letters_differ_in_case_are_one_term():
    """Non-ASCII letters are lower-cased on the distinct tokens, after the split: tokens that
    differ only in their case become one term, counted where each occurs (a tokenizer that
    lower-cased nothing, or that kept one term per spelling, differs)."""
    tokens = Tokenizer().tokenize(pa.array(["Äpfel äpfel", None, "ÄPFEL ÉTÉ", "été"]))
    assert tokens.vocabulary == ["apfel", "ete"]  # ASCII-folded too
    assert tokens.docs.tolist() == [0, 0, 2, 2, 3]
    assert tokens.term_ids.tolist() == [0, 0, 0, 1, 1]
    assert tokens.lengths.tolist() == [2, 0, 2, 1]
    upper = Tokenizer({"lower_case": False}).tokenize(pa.array(["Äpfel äpfel"]))
    assert sorted(upper.vocabulary) == ["Apfel", "apfel"]
