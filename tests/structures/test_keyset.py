"""KeySet and last_per_key: the key sets lookups and deduplication probe."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memwal_sql.structures.keyset import KeySet, last_per_key


def test_keyset_and_last_per_key():
    s = KeySet(pa.table({"a": ["x", "y"], "b": [1, 2]}))
    assert s.positions(pa.table({"a": ["y", "x", "x"], "b": [2, 2, 1]})).tolist() == [1, -1, 0]
    keys, best = last_per_key(pa.table({"id": [5, 7, 5]}), np.array([10, 3, 20]))
    assert dict(zip(keys.column("id").to_pylist(), best.tolist())) == {5: 20, 7: 3}


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.integers(-50, 50), unique=True),
    probes=st.lists(st.integers(-80, 80), max_size=200),
    kind=st.sampled_from(["int", "composite", "string"]),
)
def test_keyset_positions_match_a_dict(keys, probes, kind):
    """Integer, packed composite and hashed string keys, probes below, inside and above the
    set's range (the search is confined to the probes' window of the set); a set built by
    ``indexing`` finds each probe's value."""

    def table(values):
        if kind == "string":
            return pa.table({"k": pa.array([f"k{v}" for v in values], pa.string())})
        cols = {"k": pa.array(values, pa.int64())}
        if kind == "composite":
            cols["j"] = pa.array([v % 3 for v in values], pa.int32())
        return pa.table(cols)

    where = {k: i for i, k in enumerate(keys)}
    got = KeySet(table(keys)).positions(table(probes)).tolist()
    assert got == [where.get(p, -1) for p in probes]
    s, values = KeySet.indexing(table(keys), np.array(keys, dtype=np.int64) * 10)
    pos = s.positions(table(probes))
    assert [int(values[i]) if i >= 0 else None for i in pos] == [
        p * 10 if p in where else None for p in probes
    ]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    spread=st.sampled_from([10_000, 1 << 20, 1 << 40]),  # dense, sparse, too wide for bits
    composite=st.booleans(),
    probe_dtype=st.sampled_from([pa.int64(), pa.int32()]),
)
def test_keyset_contains_of_big_sets_matches_numpy(seed, spread, composite, probe_dtype):
    """Sets and probe batches big enough for the membership bitset, keys of the set at its
    edges, probes outside its range and outside a composite key's packed range."""
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(-spread, spread, 6000))
    keys = np.concatenate([keys, keys[::7]])  # a key set may hold a key twice
    probes = np.concatenate([rng.choice(keys, 3000), rng.integers(-2 * spread, 2 * spread, 3000)])
    if probe_dtype == pa.int32():
        keys, probes = keys // (1 << 12), probes // (1 << 12)

    def table(values):
        cols = {"k": pa.array(values, probe_dtype)}
        if composite:
            cols["j"] = pa.array(np.abs(values) % 5, pa.int32())
        return pa.table(cols)

    got = KeySet(table(keys)).contains(table(probes))
    assert got.tolist() == np.isin(probes, keys).tolist()


def test_a_keysets_bytes_include_its_bitset_once_built():
    keys = pa.table({"id": pa.array(np.arange(0, 80_000, 2), pa.int64())})
    s = KeySet(keys)
    before = s.nbytes
    assert s.contains(keys).all()  # a big test builds the bitset: one bit per value spanned
    assert s.nbytes == before + (80_000 - 2 + 8) // 8


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.integers(-20, 20), min_size=1, max_size=60),
    ranks=st.lists(st.integers(0, 1 << 40), min_size=60, max_size=60, unique=True),
)
def test_last_per_key_sorts_few_integer_keys_as_the_aggregate_would(keys, ranks):
    """Few integer keys are sorted in numpy (no Acero start-up, about 27 ms in a process's
    first aggregate): the same keys and highest ranks as the hash aggregate gives (string
    keys go through it)."""
    table, rank = pa.table({"id": pa.array(keys, pa.int64())}), np.array(ranks[: len(keys)])
    got_keys, got = last_per_key(table, rank)
    assert got_keys.column("id").to_pylist() == sorted(set(keys))  # sorted: not the aggregate
    want_keys, want = last_per_key(pa.table({"id": pa.array(map(str, keys), pa.string())}), rank)
    assert sorted(zip(got_keys.column("id").to_pylist(), got.tolist())) == sorted(
        zip(map(int, want_keys.column("id").to_pylist()), want.tolist())
    )


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=50),
    dense=st.booleans(),
    strings=st.booleans(),
)
def test_key_membership_agrees_with_a_key_set(keys, dense, strings):
    """Many integer keys over a dense range take the bitset built without a sort (counted:
    no KeySet is built); sparse, string and few keys fall back to a KeySet."""
    from memwal_sql.structures import keyset as keyset_module
    from memwal_sql.structures.keyset import KeyMembership

    values = np.array(keys, dtype=np.int64)
    if dense:  # past the bitset's minimum, in a span it takes
        values = np.concatenate([values % 100_000, np.arange(5_000, dtype=np.int64) * 7])
    table = pa.table({"id": values.astype(str) if strings else values})
    probes = np.concatenate([values[::3], values[::5] + 1, np.arange(-10, 10_000, 13)])
    probe = pa.table({"id": probes.astype(str) if strings else probes})
    built = []
    real_init = keyset_module.KeySet.__init__

    def init(self, k):
        built.append(k.num_rows)
        real_init(self, k)

    keyset_module.KeySet.__init__ = init  # type: ignore[method-assign]
    try:
        got = KeyMembership(table).contains(probe)
    finally:
        keyset_module.KeySet.__init__ = real_init  # type: ignore[method-assign]
    assert got.tolist() == np.isin(probes, values).tolist()
    assert (built == []) == (dense and not strings)
