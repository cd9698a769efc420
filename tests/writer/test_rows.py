from decimal import Decimal

import pyarrow as pa
import pyarrow.compute
import pytest

from memwal_sql.errors import InvalidInputError, PrimaryKeyError, SchemaMismatchError
from memwal_sql.writer.rows import RowCoercer

BASE = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("n", pa.int32(), False),
        pa.field("s", pa.string()),
    ]
)


@pytest.fixture
def rows():
    return RowCoercer(BASE, ["id"])


def test_upserts_cast_reorder_and_mark_live(rows):
    t = rows.upserts({"s": ["a", None], "n": [1, 2], "id": [10, 11]})
    assert t.schema == rows.schema
    assert t.column("_tombstone").to_pylist() == [False, False]
    assert t.column("id").to_pylist() == [10, 11]


def test_accepts_pandas_batches_and_readers(rows):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"id": [1], "n": [2], "s": ["x"]})
    assert rows.upserts(df).num_rows == 1
    b = pa.record_batch({"id": [1], "n": pa.array([2], pa.int32()), "s": ["x"]})
    assert rows.upserts(b).num_rows == 1
    assert rows.upserts(pa.RecordBatchReader.from_batches(b.schema, [b, b])).num_rows == 2


def test_deletes_are_tombstones(rows):
    t = rows.deletes([3, 4])
    assert t.column("_tombstone").to_pylist() == [True, True]
    assert t.column("n").null_count == 2 and t.column("s").null_count == 2


@pytest.mark.parametrize(
    "data, error, match",
    [
        ({"n": [1], "s": ["a"]}, PrimaryKeyError, "missing"),
        ({"id": [None], "n": [1], "s": ["a"]}, PrimaryKeyError, "null"),
        ({"id": [1], "s": ["a"]}, SchemaMismatchError, "missing \\['n'\\]"),
        ({"id": [1], "n": [1], "s": ["a"], "zz": [1]}, SchemaMismatchError, "unknown"),
        ({"id": ["x"], "n": [1], "s": ["a"]}, SchemaMismatchError, "never cast implicitly"),
        ({"id": [1], "n": [2**40], "s": ["a"]}, SchemaMismatchError, "cannot be cast"),
        ({"id": [1], "n": [None], "s": ["a"]}, SchemaMismatchError, "not nullable"),
    ],
)
def test_bad_input_is_a_typed_error(rows, data, error, match):
    with pytest.raises(error, match=match):
        rows.upserts(data)


def test_unconvertible_input(rows):
    with pytest.raises(InvalidInputError):
        rows.upserts(42)


def test_composite_key_deletes_need_a_table():
    rows = RowCoercer(
        pa.schema([pa.field("a", pa.int64(), False), pa.field("b", pa.string(), False)]), ["a", "b"]
    )
    with pytest.raises(PrimaryKeyError, match="composite"):
        rows.deletes([1])
    assert rows.deletes({"a": [1], "b": ["x"]}).num_rows == 1


def exact(rows, ids, ns, ss, chunks=1):
    """Input already in the WAL schema's order and types (the fast path), in ``chunks`` chunks."""
    t = pa.table(
        {"id": pa.array(ids, pa.int64()), "n": pa.array(ns, pa.int32()), "s": ss},
        schema=pa.schema(list(rows.schema)[:-1]),
    )
    return pa.concat_tables([t.slice(i, 1) for i in range(t.num_rows)]) if chunks > 1 else t


@pytest.mark.parametrize("chunks", [1, 3])
def test_exact_input_takes_the_fast_path_and_still_checks_nulls(rows, chunks):
    out = rows.upserts(exact(rows, [1, 2, 3], [4, 5, 6], ["a", None, "c"], chunks))
    assert isinstance(out, pa.RecordBatch) and out.schema.equals(rows.schema)
    assert out.to_pydict() == {
        "id": [1, 2, 3],
        "n": [4, 5, 6],
        "s": ["a", None, "c"],
        "_tombstone": [False] * 3,
    }
    with pytest.raises(PrimaryKeyError, match="1 null"):
        rows.upserts(exact(rows, [1, None, 3], [4, 5, 6], ["a", "b", "c"], chunks))
    with pytest.raises(SchemaMismatchError, match="not nullable"):
        rows.upserts(exact(rows, [1, 2, 3], [4, None, 6], ["a", "b", "c"], chunks))


def one_column(t):
    return RowCoercer(pa.schema([pa.field("id", pa.int64(), False), pa.field("c", t)]), ["id"])


@pytest.mark.parametrize(
    "table_type, value",
    [
        (pa.float32(), pa.array([0.1, float("nan"), None])),  # precision only: float64 vectors
        (pa.int32(), pa.array([1.0, 2.0])),  # pandas' float64 for integers with missing values
        (pa.float64(), pa.array([2**40])),
        (pa.timestamp("us", "UTC"), pa.array([10**9], pa.timestamp("s", "Asia/Tokyo"))),
        (pa.timestamp("us"), pa.array([0], pa.date32())),
        (pa.decimal128(25, 2), pa.array([5], pa.int64())),
        (pa.string(), pa.array(["a"], pa.large_string())),
        (pa.string(), pa.array(["a", "b"]).dictionary_encode()),
        (pa.list_(pa.float32(), 2), pa.array([[1.0, 2.0]], pa.list_(pa.float64()))),
        (
            pa.struct([("a", pa.int64()), ("b", pa.string())]),
            pa.array([{"b": "x", "a": 1}], pa.struct([("b", pa.string()), ("a", pa.int32())])),
        ),
        (pa.int32(), pa.nulls(1)),
    ],
)
def test_casts_that_keep_every_value(table_type, value):
    out = one_column(table_type).upserts(pa.table({"id": list(range(len(value))), "c": value}))
    assert out.schema.field("c").type == table_type
    assert out.column("c").equals(pa.compute.cast(value, table_type)) or str(
        out.column("c")
    ) == str(pa.compute.cast(value, table_type))  # NaN != NaN


@pytest.mark.parametrize(
    "table_type, value, match",
    [
        (pa.int64(), pa.array(["11"]), "never cast implicitly"),  # no parsing of strings
        (pa.string(), pa.array([5]), "never cast implicitly"),
        (pa.float64(), pa.array([True]), "never cast implicitly"),
        (pa.timestamp("us"), pa.array([5]), "never cast implicitly"),
        (pa.decimal128(10, 2), pa.array([1.239]), "never cast implicitly"),
        (pa.float32(), pa.array([1e300]), "out of the range"),
        (pa.int32(), pa.array([1.5]), "cannot be cast safely"),
        (
            pa.decimal128(10, 2),
            pa.array([Decimal("1.239")], pa.decimal128(10, 3)),
            "cannot be cast safely",
        ),
        (pa.date32(), pa.array([13 * 3600 * 10**6], pa.timestamp("us")), "would change values"),
        (pa.timestamp("us", "UTC"), pa.array([0], pa.timestamp("us")), "time zone"),
        (pa.struct([("a", pa.int64())]), pa.array([{"a": 7, "b": 99}]), "struct fields"),
        (pa.list_(pa.string()), pa.array([[1, 2]]), "never cast implicitly"),
    ],
)
def test_casts_that_would_change_a_value_are_refused(table_type, value, match):
    with pytest.raises(SchemaMismatchError, match=match):
        one_column(table_type).upserts(pa.table({"id": [1], "c": value}))


@pytest.mark.parametrize(
    "data, error",
    [
        ({"id": [1, 2], "n": [1], "s": ["a", "b"]}, InvalidInputError),  # ragged
        (pa.table([[1], [2], [1], ["a"]], names=["id", "n", "id", "s"]), SchemaMismatchError),
        (
            pa.RecordBatchReader.from_batches(
                pa.schema([("id", pa.int64())]), iter([pa.record_batch({"x": ["a"]})])
            ),
            InvalidInputError,
        ),
    ],
)
def test_malformed_input_is_a_typed_error(rows, data, error):
    with pytest.raises(error):
        rows.upserts(data)


@pytest.mark.parametrize(
    "table_type, value",
    [
        # what pandas and numpy hand in for vector and list columns
        (pa.list_(pa.float32(), 3), pa.array([[0.1, 0.2, 0.3], None], pa.list_(pa.float64()))),
        (pa.list_(pa.float64()), pa.array([[float("nan")], []], pa.list_(pa.float32()))),
        (pa.list_(pa.string()), pa.array([[]], pa.list_(pa.null()))),
        (
            pa.struct([("a", pa.float64()), ("b", pa.int64())]),
            pa.array(
                [{"a": float("nan"), "b": 1}], pa.struct([("a", pa.float32()), ("b", pa.int32())])
            ),
        ),
        (pa.struct([("a", pa.string())]), pa.array([{"a": None}], pa.struct([("a", pa.null())]))),
    ],
)
def test_nested_casts_follow_the_same_rules_leaf_by_leaf(table_type, value):
    out = one_column(table_type).upserts(pa.table({"id": list(range(len(value))), "c": value}))
    assert out.schema.field("c").type == table_type


def test_an_empty_or_all_null_column_of_another_type_is_taken(rows):
    pd = pytest.importorskip("pandas")
    empty = pd.DataFrame(
        {
            "id": pd.Series([], dtype="int64"),
            "n": pd.Series([], dtype="int32"),
            "s": pd.Series([], dtype="float64"),
        }
    )
    assert rows.upserts(empty).num_rows == 0
    assert rows.upserts({"id": [1], "n": [2], "s": pa.array([None], pa.float64())}).num_rows == 1


@pytest.mark.parametrize(
    "table_type, value, match",
    [
        (
            pa.map_(pa.string(), pa.float32()),
            pa.array([[("a", 1e300)]], pa.map_(pa.string(), pa.float64())),
            "out of the range",
        ),
        (
            pa.map_(pa.string(), pa.date32()),
            pa.array([[("a", 13 * 3600 * 10**6)]], pa.map_(pa.string(), pa.timestamp("us"))),
            "would change values",
        ),
        (pa.list_(pa.int64()), pa.array([[1]], pa.list_view(pa.int64())), "never cast implicitly"),
    ],
)
def test_maps_and_list_views_are_checked_too(table_type, value, match):
    with pytest.raises(SchemaMismatchError, match=match):
        one_column(table_type).upserts(pa.table({"id": [1], "c": value}))


VECTORS = pa.schema([pa.field("id", pa.int64(), False), ("vec", pa.list_(pa.float32(), 2))])


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ([float("nan"), 0.0], "NaN or an infinity"),
        ([float("-inf"), 0.0], "NaN or an infinity"),
        ([3e38, -3e38], "squared norm of inf"),  # each value finite, its squared norm not
        ([1e19, 0.0], "squared norm of 1e\\+38"),  # finite, but a distance to it overflows
        ([1.0, None], "missing element"),
    ],
)
def test_a_vector_no_index_can_place_is_refused_naming_its_row(bad, why):
    rows = RowCoercer(VECTORS, ["id"])
    good = [0.5, 0.5]
    vec = pa.array([good, None, bad], pa.list_(pa.float32(), 2))
    for data in (  # the fast path (exact schema) and the cast path (float64 input)
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "vec": vec}, schema=VECTORS),
        {"id": [3, 1, 2], "vec": pa.array([bad, good, None], pa.list_(pa.float64(), 2))},
    ):
        with pytest.raises(InvalidInputError, match=f"column 'vec'.*\\{{'id': 3\\}}.*{why}"):
            rows.upserts(data)


def test_null_vectors_and_big_but_usable_ones_are_accepted_in_any_layout():
    rows = RowCoercer(VECTORS, ["id"])
    vec = pa.array([[1e18, -1e18], None, [0.0, 0.0], [9e18, 0.0]], pa.list_(pa.float32(), 2))
    table = pa.table({"id": pa.array(range(4), pa.int64()), "vec": vec}, schema=VECTORS)
    assert rows.upserts(table).num_rows == 4
    # A slice whose hidden neighbour is unusable, and chunks: only the rows given count.
    bad = pa.table({"id": [9], "vec": pa.array([[float("nan"), 0.0]], vec.type)}, schema=VECTORS)
    both = pa.concat_tables([bad, table]).combine_chunks()
    assert rows.upserts(both.slice(1)).num_rows == 4
    assert rows.upserts(pa.concat_tables([table, table.slice(1, 1)])).num_rows == 5
    with pytest.raises(InvalidInputError, match="row 4"):
        rows.upserts(pa.concat_tables([table, bad]))
    # Float64 vectors are checked against float64's range.
    wide = pa.schema([pa.field("id", pa.int64(), False), ("vec", pa.list_(pa.float64(), 2))])
    big = pa.table({"id": [1], "vec": pa.array([[1e100, 0.0]], wide.field("vec").type)})
    assert RowCoercer(wide, ["id"]).upserts(big.cast(wide)).num_rows == 1
