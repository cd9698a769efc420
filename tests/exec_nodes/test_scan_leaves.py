"""The scan leaves alone: MemTable, generation and base-table scans."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import FragmentRange, Scan
from memwal_sql.expressions.predicate import And, Compare, InList, IsNull, Not, Or, Predicate
from memwal_sql.formats.source_rows import (
    GEN,
    ROWADDR,
    TOMBSTONE,
)
from tests.exec_nodes.nodes import CACHES, SOURCE, base_scan, check_contract, wal_rows

_INTS = st.integers(-2, 40)
_TEXTS = st.sampled_from(["a", "b", "c", "ab", ""])
_FLOATS = st.sampled_from([0.0, -0.0, 1.5, float("nan"), -3.0])
_OPS = st.sampled_from(["=", "!=", "<", "<=", ">", ">="])


def _leaf() -> st.SearchStrategy[Predicate]:
    values = {"id": _INTS, "v": _TEXTS, "f": _FLOATS}
    kinds = {"id": pa.int64(), "v": pa.string(), "f": pa.float64()}
    column = st.sampled_from(["id", "v", "f"])
    compare = st.builds(
        lambda c, op, data: Compare(c, op, pa.scalar(data.draw(values[c]), kinds[c])),
        column,
        _OPS,
        st.data(),
    )
    in_list = st.builds(
        lambda c, data, null: InList(
            c, pa.array(data.draw(st.lists(values[c], min_size=1, max_size=4)), kinds[c]), null
        ),
        column,
        st.data(),
        st.booleans(),
    )
    return st.one_of(compare, in_list, st.builds(IsNull, column))


PREDICATES = st.recursive(
    _leaf(),
    lambda inner: st.one_of(
        st.builds(Not, inner),
        st.builds(lambda cs: And(tuple(cs)), st.lists(inner, min_size=2, max_size=3)),
        st.builds(lambda cs: Or(tuple(cs)), st.lists(inner, min_size=2, max_size=3)),
    ),
    max_leaves=5,
)


def test_memtable_scan_reads_tagged_rows_and_applies_sql_semantics():
    rows = wal_rows([1, 2, 3, 4], "m", f=[1.0, 2.0, None, -0.0])
    node = MemTableSourceExec("r", 7, rows.to_batches(), SOURCE, Scan(), caches=CACHES)
    out = check_contract(node, want_rows=4)
    assert out.column(GEN).to_pylist() == [7] * 4 and out.column(ROWADDR).to_pylist() == [
        0,
        1,
        2,
        3,
    ]
    # NOT IN is NULL for a NULL value; -0.0 and 0.0 are apart in an IN list.
    got = node.read_counted(None, Not(InList("f", pa.array([2.0, 0.0, 8.0, 7.0]))))
    assert got.column("id").to_pylist() == [1, 4] and node.opened == 2


def test_generation_scan_reads_its_lance_dataset(generation):
    _, uri, _ = generation
    node = GenerationSourceExec("r", 1, uri, SOURCE, Scan(), caches=CACHES)
    out = check_contract(node, want_rows=3)
    assert out.column(GEN).to_pylist() == [1, 1, 1]
    assert out.column(TOMBSTONE).to_pylist() == [False, True, False]
    hit = node.read_counted(["id"], Compare("id", ">", pa.scalar(2)))
    assert hit.column("id").to_pylist() == [3, 5]


def test_base_scan_pushes_exact_filters_and_checks_the_rest_itself(base):
    exact = base_scan(base, ["id"], Compare("v", "=", pa.scalar("b2")))
    assert exact.exact and check_contract(exact).column("id").to_pylist() == [2]
    # Lance would match -0.0 to 0.0 in an IN list; DataFusion's SQL does not.
    checked = base_scan(base, ["id"], InList("f", pa.array([0.0, 5.0, 6.0, 7.0])))
    assert not checked.exact and check_contract(checked, want_rows=0).num_rows == 0
    assert "then InList" in checked.describe()


@settings(max_examples=25, deadline=None)
@given(
    deleted=st.sets(st.integers(0, 199), max_size=60),
    start=st.integers(0, 99),
    length=st.one_of(st.none(), st.integers(0, 120)),
    threshold=st.integers(-1, 200),
)
def test_base_scan_reads_fragments_with_deletion_vectors_from_their_files(
    tmp_path_factory, deleted, start, length, threshold
):
    # Two fragments of 100 rows; deleted rows get a deletion vector, which Lance's scanner
    # reads slowly, so the base leaf reads such a fragment's data file and drops them itself.
    ids = np.arange(200, dtype=np.int64)
    rows = pa.table({"id": ids, "v": [f"s{i}" for i in ids], "f": ids / 2.0})
    ds = lance.write_dataset(rows, str(tmp_path_factory.mktemp("dv") / "t"), max_rows_per_file=100)
    if deleted:
        ds.delete(f"id IN ({', '.join(map(str, sorted(deleted)))})")

    def lance_rows(columns, flt=None):
        t = ds.to_table(columns=columns, filter=flt, with_row_address=True)
        return t.sort_by(ROWADDR).column(ROWADDR).to_pylist(), t.select(columns).to_pylist()

    def ours(node):
        t = check_contract(node).sort_by(ROWADDR)
        return t.column(ROWADDR).to_pylist(), t.select(node.columns).to_pylist()

    whole = base_scan(ds, ["v", "id"], None)
    assert [whole._direct_file(f) is not None for f in ds.get_fragments()] == [
        any(d // 100 == i for d in deleted) for i in range(2)
    ]
    assert ours(whole) == lance_rows(["v", "id"])
    exact = base_scan(ds, ["v"], Compare("id", "<", pa.scalar(threshold)))
    assert exact.exact and ours(exact) == lance_rows(["v"], f"id < {threshold}")
    # Lance would match -0.0 to 0.0 in an IN list: the scan evaluates it on every column.
    checked = base_scan(ds, ["id"], InList("f", pa.array([0.0, 1.5, threshold / 2.0])))
    assert not checked.exact
    want = [i for i in (0, 3, threshold) if 0 <= i < 200 and i not in deleted]
    assert sorted(check_contract(checked).column("id").to_pylist()) == sorted(set(want))
    counted = base_scan(ds, [], Compare("id", ">=", pa.scalar(threshold)))
    assert ours(counted)[0] == lance_rows(["id"], f"id >= {threshold}")[0]
    # A row range of the first fragment (what a Spark partition reads) and the whole second.
    end = None if length is None else min(100, start + 1 + length)
    part = base_scan(ds, ["id"], None, [FragmentRange(0, start, end), FragmentRange(1)])
    stop = 100 if end is None else end
    want_ids = [i for i in range(start, stop) if i not in deleted]
    want_ids += [i for i in range(100, 200) if i not in deleted]
    assert sorted(check_contract(part).column("id").to_pylist()) == want_ids


def test_base_scan_reads_through_lance_a_changed_schema_or_an_indexed_filter(tmp_path):
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    ds = lance.write_dataset(rows, str(tmp_path / "t"))
    ds.delete("id = 2")
    ds.add_columns({"w": "id * 10"})  # a second data file
    node = base_scan(ds, ["id", "w"], None)
    assert node._direct_file(ds.get_fragments()[0]) is None
    assert check_contract(node).select(["id", "w"]).to_pylist() == [
        {"id": 1, "w": 10},
        {"id": 3, "w": 30},
    ]
    indexed = lance.write_dataset(rows, str(tmp_path / "i"))
    indexed.delete("id = 2")
    indexed.create_scalar_index("id", "BTREE")
    by_index = base_scan(indexed, ["v"], Compare("id", ">", pa.scalar(1)))
    assert by_index._direct_file(indexed.get_fragments()[0]) is None  # Lance uses the index
    assert check_contract(by_index).column("v").to_pylist() == ["c"]
    by_file = base_scan(indexed, ["id"], Compare("v", ">", pa.scalar("a")))
    assert by_file._direct_file(indexed.get_fragments()[0]) is not None
    assert check_contract(by_file).column("id").to_pylist() == [3]
    renamed = lance.write_dataset(rows, str(tmp_path / "r"))
    renamed.delete("id = 2")
    renamed.alter_columns({"path": "v", "name": "x"})
    node = base_scan(renamed, ["x"], None)
    assert node._direct_file(renamed.get_fragments()[0]) is None
    assert check_contract(node).column("x").to_pylist() == ["a", "c"]


@settings(max_examples=60, deadline=None)
@given(
    predicate=PREDICATES,
    deleted=st.sets(st.integers(0, 39), max_size=12),
    start=st.integers(0, 19),
    end=st.one_of(st.none(), st.integers(0, 20)),
    columns=st.sampled_from([["id"], ["v", "f"], [], ["f", "id", "v"]]),
    data=st.data(),
)
def test_base_scan_in_memory_returns_exactly_the_lance_scans_rows(
    tmp_path_factory, predicate, deleted, start, end, columns, data
):
    # Two fragments of 20 rows, NULLs, NaN and -0.0 in them, some rows deleted: the scan over
    # the fragments kept whole returns what the scan through Lance returns, row address and
    # all, for a whole table and for a row range of a fragment.
    n = 40
    ids = pa.array(np.arange(n), pa.int64())
    v = data.draw(st.lists(st.one_of(st.none(), _TEXTS), min_size=n, max_size=n))
    f = data.draw(st.lists(st.one_of(st.none(), _FLOATS), min_size=n, max_size=n))
    rows = pa.table({"id": ids, "v": pa.array(v, pa.string()), "f": pa.array(f, pa.float64())})
    ds = lance.write_dataset(rows, str(tmp_path_factory.mktemp("mem") / "t"), max_rows_per_file=20)
    if deleted:
        ds.delete(f"id IN ({', '.join(map(str, sorted(deleted)))})")
    end = None if end is None else min(20, start + 1 + end)  # the planner makes no empty range
    ranges = [FragmentRange(0, start, end), FragmentRange(1)]
    for part in (None, ranges):
        lance_node = base_scan(ds, columns, predicate, part)
        memory = base_scan(ds, columns, predicate, part, in_memory=True)
        want = check_contract(lance_node).sort_by(ROWADDR)
        got = check_contract(memory).sort_by(ROWADDR)
        assert got.schema.equals(want.schema)
        # repr tells NaN, -0.0 and NULL apart (equality would not)
        assert repr(got.to_pylist()) == repr(want.to_pylist()), (predicate, part)
        assert "in memory" in memory.describe() and "in memory" not in lance_node.describe()
        # Served from the rows kept whole: Lance's filter was never made for it.
        assert "_pushed" not in vars(memory)
