"""KeyRegions and the scan's check (planner.regions) against a plain Python reference."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from exec_nodes.regions import OTHER_REGION, REGION, KeyRegions
from memwal_sql.read_snapshot import take_read_snapshot
from planner.regions import keys_in_two_regions_of

# (region, composite key) pairs: which region holds a version of which key.
placements = st.lists(
    st.tuples(st.sampled_from("abc"), st.tuples(st.integers(0, 4), st.sampled_from(["x", "y"]))),
    max_size=25,
)


def reference(pairs: list[tuple[str, tuple[int, str]]]) -> set[tuple[int, str]]:
    regions: dict[tuple[int, str], set[str]] = {}
    for region, key in pairs:
        regions.setdefault(key, set()).add(region)
    return {k for k, rs in regions.items() if len(rs) > 1}


def found(shared: pa.Table | None) -> set[tuple[int, str]]:
    if shared is None:
        return set()
    assert all(r[REGION] != r[OTHER_REGION] for r in shared.to_pylist())
    return {(r["a"], r["b"]) for r in shared.to_pylist()}


@settings(max_examples=60, deadline=None)
@given(placements)
def test_unflushed_keys_in_two_regions(pairs):
    batches = {
        region: pa.record_batch(
            {
                "a": [k[0] for r, k in pairs if r == region],
                "b": [k[1] for r, k in pairs if r == region],
            },
            schema=pa.schema([("a", pa.int64()), ("b", pa.string())]),
        )
        for region in "abc"
    }
    held = KeyRegions([(r, pa.Table.from_batches([b])) for r, b in batches.items()], ["a", "b"])
    assert found(held.shared()) == reference(pairs)
    # The same pairs split in two parts, one checked against the other.
    first = KeyRegions(
        [(r, pa.table({"a": [k[0]], "b": [k[1]]})) for r, k in pairs[::2]], ["a", "b"]
    )
    second = KeyRegions(
        [(r, pa.table({"a": [k[0]], "b": [k[1]]})) for r, k in pairs[1::2]], ["a", "b"]
    )
    parts = [first.shared(), second.shared(), first.shared_with(second)]
    assert set().union(*(found(p) for p in parts)) == reference(pairs)


def test_generations_and_memtables_together(tmp_path):
    """A key flushed in one region and unflushed in another, and keys in two regions'
    generations, with a composite key."""
    schema = pa.schema(
        [pa.field("a", pa.int64(), False), pa.field("b", pa.string(), False), ("g", pa.string())]
    )
    tbl = mw.create_table(
        str(tmp_path),
        schema,
        primary_key=["a", "b"],
        region_spec=mw.RegionSpec.identity("g"),
        allow_non_key_region_spec=True,
    )

    def write(g: str, keys: list[tuple[int, str]], flush: bool) -> None:
        w = tbl.writer(region_values=(g,))
        w.upsert(
            pa.table(
                {"a": [k[0] for k in keys], "b": [k[1] for k in keys], "g": [g] * len(keys)}, schema
            )
        )
        if flush:
            w.flush()

    write("p", [(1, "x"), (2, "x"), (3, "y")], flush=True)
    write("q", [(2, "x"), (4, "y")], flush=True)  # (2, x) in two generations
    write("r", [(3, "y"), (5, "x")], flush=False)  # (3, y): a generation and a MemTable
    write("p", [(5, "x"), (6, "y")], flush=False)  # (5, x): two MemTables
    snap = take_read_snapshot(tbl)
    assert found(keys_in_two_regions_of(snap, tbl.region_spec)) == {(2, "x"), (3, "y"), (5, "x")}
    # Kept while nothing changes; a write to a MemTable is seen.
    assert found(keys_in_two_regions_of(take_read_snapshot(tbl), tbl.region_spec)) == {
        (2, "x"),
        (3, "y"),
        (5, "x"),
    }
    write("q", [(6, "y")], flush=False)
    got = found(keys_in_two_regions_of(take_read_snapshot(tbl), tbl.region_spec))
    assert got == {(2, "x"), (3, "y"), (5, "x"), (6, "y")}
    tbl.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(-3, 9)), max_size=30))
def test_one_integer_key_sorted_in_numpy_agrees_with_the_reference(pairs):
    # One integer key column takes the sort path (_regions_per_key), not Acero's aggregate.
    def held(part: list[tuple[str, int]]) -> KeyRegions:
        return KeyRegions(
            [
                (r, pa.table({"a": pa.array([k for q, k in part if q == r], pa.int64())}))
                for r in "abc"
            ],
            ["a"],
        )

    def keys(shared: pa.Table | None) -> set[int]:
        if shared is None:
            return set()
        assert all(r[REGION] != r[OTHER_REGION] for r in shared.to_pylist())
        return set(shared.column("a").to_pylist())

    want = {k for k, _ in reference([(r, (k, "x")) for r, k in pairs])}
    assert keys(held(pairs).shared()) == want
    first, second = held(pairs[::2]), held(pairs[1::2])
    parts = [first.shared(), second.shared(), first.shared_with(second)]
    assert set().union(*(keys(p) for p in parts)) == want
