"""_pk_index/: our BTree sidecar against the one Lance 14 writes for the same generation.

Lance indexes **every physical row** of the generation's fragment 0 (ids = row offsets),
including rows hidden by the deletion vector (older duplicates) and ``_tombstone`` rows.
``page_data.lance`` comes out byte-identical. ``page_lookup.lance`` is identical except that
Lance serialises the two schema-metadata keys in hash-map (random) order, so it is compared by
content, schema and metadata instead.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lance.file import LanceFileReader

from memwal_sql.errors import SchemaMismatchError
from memwal_sql.formats.key_index import (
    PK_INDEX_PAGE_SIZE,
    SortedKeys,
    encode_composite_keys,
    pk_index_schemas,
    read_pk_index,
    write_pk_index,
)
from memwal_sql.writer.memtable import latest_per_key, latest_per_key_in_key_order
from tests.formats.test_bloom import (
    build_lance_generation,
    lance_generation,
    physical_rows,
    pk_schema,
)


def _read(path: str) -> tuple[pa.Table, object]:
    reader = LanceFileReader(path)
    return reader.read_all().to_table(), reader.metadata()


@pytest.fixture(scope="module", params=["int64", "int32", "utf8", "composite"])
def lance_gen(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[str]]:
    # 12000 puts + 3000 re-puts + 150 deletes: > 8192 physical rows, i.e. two BTree pages.
    return build_lance_generation(str(tmp_path_factory.mktemp(request.param)), request.param, 12000)


@pytest.mark.interop
def test_pk_index_matches_lance(lance_gen: tuple[str, list[str]], tmp_path: str) -> None:
    gen_dir, names = lance_gen
    rows = physical_rows(gen_dir)
    assert rows.num_rows > PK_INDEX_PAGE_SIZE
    mine = str(tmp_path / "gen")
    write_pk_index(mine, rows.select(names))
    for name in ("page_data.lance", "page_lookup.lance"):
        theirs_t, theirs_m = _read(os.path.join(gen_dir, "_pk_index", name))
        mine_t, mine_m = _read(os.path.join(mine, "_pk_index", name))
        assert mine_t.schema.equals(theirs_t.schema, check_metadata=True), name
        assert mine_t.equals(theirs_t), name
        assert (
            (mine_m.major_version, mine_m.minor_version)
            == (theirs_m.major_version, theirs_m.minor_version)
            == (0, 3)
        )
        assert mine_m.num_rows == theirs_m.num_rows
    with (
        open(os.path.join(gen_dir, "_pk_index", "page_data.lance"), "rb") as a,
        open(os.path.join(mine, "_pk_index", "page_data.lance"), "rb") as b,
    ):
        assert a.read() == b.read()
    lookup, _ = _read(os.path.join(mine, "_pk_index", "page_lookup.lance"))
    assert lookup.column("page_idx").to_pylist() == [0, 1]
    assert read_pk_index(mine).num_rows == rows.num_rows


@pytest.mark.interop
def test_pk_index_all_rows_sorted_with_ids(lance_gen: tuple[str, list[str]], tmp_path: str) -> None:
    """Independent of Lance: every row offset appears once, values ascending, ties by id."""
    gen_dir, names = lance_gen
    keys = physical_rows(gen_dir).select(names)
    write_pk_index(str(tmp_path), keys)
    index = read_pk_index(str(tmp_path))
    ids = index.column("ids").to_numpy()
    assert sorted(ids.tolist()) == list(range(keys.num_rows))
    values = keys.column(0) if len(names) == 1 else encode_composite_keys(keys)
    assert index.column("values").to_pylist() == values.take(pa.array(ids)).to_pylist()
    pairs = list(zip(index.column("values").to_pylist(), ids.tolist()))
    assert pairs == sorted(pairs)


@pytest.mark.interop
@pytest.mark.parametrize(
    "pk_type, values",
    [
        (pa.int8(), [3, -128, 127, 0]),
        (pa.int16(), [-300, 300]),
        (pa.int32(), [-(2**31), 2**31 - 1]),
        (pa.uint8(), [0, 255]),
        (pa.uint16(), [65535, 1]),
        (pa.uint32(), [2**32 - 1, 7]),
        (pa.uint64(), [2**64 - 1, 2**63 + 1, 0]),
        (pa.bool_(), [True, False]),
        (pa.utf8(), ["a\x00b", "", "a", "a\x00"]),
        (pa.large_utf8(), ["é", "e\x00"]),
        (pa.binary(), [b"\x00\xff", b"\x00", b""]),
        (pa.large_binary(), [b"a\x00\xffb", b"a"]),
    ],
)
def test_composite_encoding_matches_lance(
    tmp_path: str, pk_type: pa.DataType, values: list
) -> None:
    """(x, int64) composite keys: our binary encoding equals what Lance puts in its index."""
    schema = pk_schema(("x", pk_type), ("y", pa.int64()))
    n = len(values)
    table = pa.table(
        {
            "x": pa.array(values, pk_type),
            "y": pa.array(range(-1, n - 1), pa.int64()),
            "payload": [None] * n,
        },
        schema=schema,
    )
    gen_dir = lance_generation(str(tmp_path), schema, [("put", table)])
    theirs, _ = _read(os.path.join(gen_dir, "_pk_index", "page_data.lance"))
    keys = physical_rows(gen_dir).select(["x", "y"])
    assert (
        encode_composite_keys(keys)
        .take(pa.array(theirs.column("ids")))
        .equals(theirs.column("values").combine_chunks())
    )
    mine = str(tmp_path / "mine")
    write_pk_index(mine, keys)
    assert read_pk_index(mine).equals(theirs)


def test_composite_known_vector_and_nulls() -> None:
    enc = encode_composite_keys(pa.table({"a": pa.array([1], pa.int64()), "b": ["x"]}))
    assert enc.type == pa.binary()
    assert enc[0].as_py() == bytes.fromhex("01 80 00 00 00 00 00 00 01 01 78 00 00")
    # Lance forbids nullable PK columns; the encoding still defines nulls as 0x00 (sorts first).
    enc = encode_composite_keys(
        pa.table({"a": pa.array([None, 2], pa.int32()), "b": pa.array(["y", None])})
    )
    assert enc.to_pylist() == [b"\x00\x01y\x00\x00", bytes.fromhex("01 80 00 00 00 00 00 00 02 00")]


_KEY_COLUMN = st.sampled_from(["i64", "i8", "u32", "s", "b"])
_GEN = {
    "i64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "i8": (pa.int8(), st.integers(-128, 127)),
    "u32": (pa.uint32(), st.integers(0, 2**32 - 1)),
    "s": (pa.utf8(), st.text(alphabet=st.sampled_from("\x00\x01aé\uffff"), max_size=4)),
    "b": (pa.binary(), st.binary(max_size=4)),
}


@settings(max_examples=80, deadline=None)
@given(data=st.data(), kinds=st.lists(_KEY_COLUMN, min_size=1, max_size=3))
def test_composite_encoding_preserves_tuple_order(data: st.DataObject, kinds: list[str]) -> None:
    """Byte order of the encodings == lexicographic order of the (nullable) tuples, nulls first."""
    rows = data.draw(
        st.lists(st.tuples(*[st.none() | _GEN[k][1] for k in kinds]), min_size=2, max_size=20)
    )
    table = pa.table(
        {f"c{i}": pa.array([r[i] for r in rows], _GEN[k][0]) for i, k in enumerate(kinds)}
    )
    enc = encode_composite_keys(table).to_pylist()

    def sort_key(row: tuple) -> tuple:
        return tuple(
            (0,) if v is None else (1, v.encode() if isinstance(v, str) else v) for v in row
        )

    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (enc[i] < enc[j]) == (sort_key(rows[i]) < sort_key(rows[j]))
            assert (enc[i] == enc[j]) == (rows[i] == rows[j])


@settings(max_examples=120, deadline=None)
@given(data=st.data(), kinds=st.lists(_KEY_COLUMN, min_size=1, max_size=2))
def test_a_flush_sorts_once_to_deduplicate_and_to_index(
    data: st.DataObject, kinds: list[str]
) -> None:
    """The flush's one sort keeps each key's last row, as the group-by of latest_per_key does,
    and gives the key index the order a fresh sort of the kept keys gives."""
    keys = st.tuples(*[st.none() | _GEN[k][1] for k in kinds])
    pool = data.draw(st.lists(keys, min_size=1, max_size=6))
    rows = data.draw(st.lists(st.sampled_from(pool), max_size=40))  # keys repeat
    names = [f"c{i}" for i in range(len(kinds))]
    columns = {
        n: pa.array([r[i] for r in rows], _GEN[k][0]) for i, (n, k) in enumerate(zip(names, kinds))
    }
    table = pa.table({**columns, "seq": pa.array(range(len(rows)), pa.int64())})
    kept, keys = latest_per_key_in_key_order(table, names)
    assert kept.equals(latest_per_key(table, names))
    fresh = SortedKeys.of(kept.select(names))
    assert keys.values.equals(fresh.values)
    assert keys.order.tolist() == fresh.order.tolist()


def test_single_column_nulls_first_and_page_stats(tmp_path: str) -> None:
    n = PK_INDEX_PAGE_SIZE * 2 + 5
    vals = pa.array([None if i % 1000 == 0 else (i * 7919) % n for i in range(n)], pa.int64())
    write_pk_index(str(tmp_path), pa.table({"k": vals}))
    index = read_pk_index(str(tmp_path))
    nulls = vals.null_count
    assert index.column("values").slice(0, nulls).null_count == nulls
    lookup, _ = _read(os.path.join(str(tmp_path), "_pk_index", "page_lookup.lance"))
    assert lookup.column("page_idx").to_pylist() == [0, 1, 2]
    assert lookup.column("null_count").to_pylist() == [nulls, 0, 0]
    assert lookup.column("max").to_pylist()[-1] == max(v for v in vals.to_pylist() if v is not None)
    _, lookup_schema = pk_index_schemas(pa.int64())
    assert lookup.schema.equals(lookup_schema, check_metadata=True)


def test_empty_and_invalid(tmp_path: str) -> None:
    write_pk_index(str(tmp_path), pa.table({"k": pa.array([], pa.utf8())}))
    assert read_pk_index(str(tmp_path)).num_rows == 0
    with pytest.raises(SchemaMismatchError):
        write_pk_index(str(tmp_path), pa.table({"k": pa.array([1.5])}))
    with pytest.raises(SchemaMismatchError):
        encode_composite_keys(pa.table({"a": [1], "t": pa.array([0], pa.timestamp("s"))}))


def test_pk_index_on_object_store(table_root: tuple[str, dict | None]) -> None:
    """storage_options reach Lance's file writer/reader (local disk and S3)."""
    uri, options = table_root
    keys = pa.table({"a": pa.array([5, 1, 5], pa.int64()), "b": ["x", "y", "x"]})
    write_pk_index(f"{uri}/_mem_wal/r/0000abcd_gen_1", keys, storage_options=options)
    index = read_pk_index(f"{uri}/_mem_wal/r/0000abcd_gen_1", storage_options=options)
    assert index.column("ids").to_pylist() == [1, 0, 2]
    assert (
        index.column("values").to_pylist()
        == encode_composite_keys(keys).take(pa.array([1, 0, 2])).to_pylist()
    )
    assert np.all(np.diff(index.column("ids").to_numpy()[1:]) > 0)
