"""The terms of a column of documents: every occurrence of a set of terms found at once."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal_sql.formats.tokenizer import Tokenizer

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
    st.sampled_from([*"aZ09 _-.\t\nÄéß漢ı", "ab", "Runner", "x" * 41]), max_size=12
).map("".join)


@settings(max_examples=200, deadline=None)
@given(
    docs=st.lists(st.one_of(st.none(), _TEXT), max_size=10),
    lower_case=st.booleans(),
    max_token_length=st.sampled_from([None, 3, 40]),
    large=st.booleans(),
)
def test_ascii_documents_split_as_the_unicode_regex_splits_them(
    docs, lower_case, max_token_length, large
):
    """The byte-table split of ASCII documents (and of the ASCII ones among others) gives the
    regex's tokens, document by document: a wrong boundary, case or length limit differs."""
    tok = Tokenizer({"lower_case": lower_case, "max_token_length": max_token_length})
    texts = pa.array(docs, pa.large_string() if large else pa.string())
    texts = pa.compute.fill_null(texts, "")
    for sliced in (texts, texts.slice(1)):
        flat, doc = tok._split(sliced)
        want_flat, want_doc = tok._split_by_kernel(sliced)
        got = sorted(zip(doc.tolist(), flat.to_pylist()))
        assert got == sorted(zip(want_doc.tolist(), want_flat.to_pylist()))
        tokens = tok.tokenize(sliced)
        assert np.all(np.diff(tokens.docs) >= 0)  # occurrences by document
        finals = tok._finals(want_flat.to_pylist())
        want_terms = sorted((d, t) for d, t in zip(want_doc.tolist(), finals) if t is not None)
        got_terms = [tokens.vocabulary[i] for i in tokens.term_ids]
        assert sorted(zip(tokens.docs.tolist(), got_terms)) == want_terms
