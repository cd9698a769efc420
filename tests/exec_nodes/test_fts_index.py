"""The base's inverted index as a full-text search reads it: the parts that need no table."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import exec_nodes.fts_index as fts_index


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), max_size=12),
    gaps=st.lists(st.integers(1, 3), min_size=12, max_size=12),
    searched=st.integers(1, 5),
    last=st.booleans(),
)
def test_fragment_runs_are_the_runs_of_each_row_ids_fragment(sizes, gaps, searched, last):
    """Binary searches for the first fragments and a pass for the rest find every fragment
    and where its rows start, as shifting every row id does; the last possible fragment id
    (whose end overflows 64 bits) included."""
    fids = np.cumsum(gaps[: len(sizes)]).astype(np.uint64)
    if last and len(sizes):
        fids[-1] = np.uint64(0xFFFFFFFF)
    rowid = np.concatenate(
        [np.zeros(0, np.uint64)]
        + [
            (f << np.uint64(32)) | np.arange(0, 2 * n, 2, dtype=np.uint64)
            for f, n in zip(fids, sizes)
        ]
    )
    old = fts_index._FRAGMENTS_SEARCHED
    fts_index._FRAGMENTS_SEARCHED = searched
    try:
        fragments, starts = fts_index._fragment_runs(rowid)
    finally:
        fts_index._FRAGMENTS_SEARCHED = old
    assert fragments.tolist() == fids.tolist()
    assert starts.tolist() == [0, *np.cumsum(sizes).tolist()]
    assert fragments.dtype == np.uint64 and starts.dtype == np.int64
