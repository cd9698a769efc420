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
