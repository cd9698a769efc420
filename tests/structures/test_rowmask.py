"""RowMask against numpy's isin, on contiguous, sparse and multi-fragment batches."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal_sql.structures.rowmask import RowMask


def addresses(fragment: int, offsets) -> np.ndarray:
    return (np.uint64(fragment) << np.uint64(32)) | np.asarray(offsets, dtype=np.uint64)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
    density=st.floats(0, 1),
)
def test_hits_equal_isin(sizes, seed, density):
    rng = np.random.default_rng(seed)
    rows = {f * 3: n for f, n in enumerate(sizes)}  # fragment ids need not be dense
    everything = np.concatenate([addresses(f, np.arange(n)) for f, n in rows.items()])
    masked = everything[rng.random(len(everything)) < density]
    mask = RowMask(rng.permutation(masked), rows)
    assert len(mask) == len(masked)
    for _ in range(5):
        lo = int(rng.integers(0, len(everything)))
        hi = int(rng.integers(lo, len(everything) + 1))
        for batch in (everything[lo:hi], np.sort(rng.choice(everything, hi - lo))):
            batch = np.unique(batch)
            got = mask.hits(batch)
            want = np.isin(batch, masked)
            if got is None:
                assert not want.any()
            else:
                assert got.dtype == bool and (got == want).all()


def test_no_masked_row_in_the_fragment_is_no_answer():
    mask = RowMask(addresses(1, [0, 9]), {0: 5, 1: 10})
    assert mask.hits(addresses(0, range(5))) is None
    assert mask.hits(np.zeros(0, np.uint64)) is None
    assert mask.hits(addresses(1, range(3, 10))).tolist() == [False] * 6 + [True]
    assert RowMask(np.zeros(0, np.uint64), {0: 5}).hits(addresses(0, [1])) is None
