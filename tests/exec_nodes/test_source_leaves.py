"""The leaf contract every source kind shares: one class per kind (base, generation,
MemTable) built with an access method offers that method's protocol, and only that one.

The protocols themselves are tested where their parents are, one file per access method
(scan: test_scan_leaves.py, lookup: test_lookup_nodes.py, KNN: test_knn.py, full text:
test_fts_bm25.py); this file checks what is the same for every kind."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from exec_nodes.base_source import BaseSourceExec
from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import FullText, Knn, KnnQuery, Lookup, Scan, SourceLeaf
from memwal_sql.formats.source_rows import TOMBSTONE
from memwal_sql.writer.memtable_indexes import tokenizer_for
from tests.exec_nodes.nodes import CACHES, SOURCE, check_contract, wal_rows

KEYS = pa.table({"id": pa.array([2, 9], pa.int64())})


def leaves(base, generation, access) -> list[SourceLeaf]:
    _, uri, _ = generation
    rows = wal_rows([1, 2, 3], "m").to_batches()
    return [
        BaseSourceExec(base, SOURCE, access, caches=CACHES),
        GenerationSourceExec("r", 1, uri, SOURCE, access, caches=CACHES),
        MemTableSourceExec("r", 2, rows, SOURCE, access, caches=CACHES),
    ]


def test_every_kind_answers_a_lookup_and_names_its_kind_and_access(base, generation):
    for leaf in leaves(base, generation, Lookup(("id",))):
        probe = leaf.probe(KEYS)
        assert probe.hit.tolist() == [True, False], leaf.name
        assert probe.rows.column("id").to_pylist() == [2]
        assert probe.rows.schema.equals(SOURCE)
        line = leaf.describe()
        assert line.startswith(leaf.name) and "lookup key=[id]" in line
        leaf.keys = KEYS
        check_contract(leaf, want_rows=1)


def test_a_leaf_offers_only_its_own_access_methods_protocol(base, generation):
    tokenizer = tokenizer_for({}, CACHES)
    for leaf in leaves(base, generation, FullText("v", tokenizer, ("id",))):
        with pytest.raises(TypeError, match="not Lookup"):
            leaf.probe(KEYS)
        with pytest.raises(TypeError, match="not Knn"):
            leaf.top(1)
        if not isinstance(leaf, BaseSourceExec):  # the base is scanned by partitions
            with pytest.raises(TypeError, match="not Scan"):
                leaf.read_counted()
        assert [p.keys.num_rows for p in leaf.pieces()] != []


def test_a_newer_sources_scan_counts_its_opens_and_pickles_without_results(generation):
    _, uri, _ = generation
    for leaf in [
        GenerationSourceExec("r", 1, uri, SOURCE, Scan(), caches=CACHES),
        MemTableSourceExec("r", 2, wal_rows([4], "m").to_batches(), SOURCE, Scan(), caches=CACHES),
    ]:
        rows = leaf.read_counted(["id", TOMBSTONE])
        assert rows.column_names == ["id", TOMBSTONE, "_gen", "_rowaddr"]
        assert leaf.opened == 1
        copy = pickle.loads(pickle.dumps(leaf))
        assert copy.read_counted().num_rows == rows.num_rows and copy.opened == 2


def test_a_knn_leafs_schema_is_the_light_candidate_schema(base, generation):
    query = KnnQuery("f", np.zeros(1, np.float32), "l2", None, 2, ("id",))
    for leaf in leaves(base, generation, Knn(query)):
        assert leaf.schema.names == ["id", "_gen", "_rowaddr", "_distance"]


def test_a_large_writes_rows_are_read_from_the_memtable_without_a_copy():
    # The MemTable's rows in the source schema view its batches: a large write's columns are
    # not copied (only _gen and _rowaddr are added); many small batches are joined in one.
    from memwal_sql.formats.source_rows import source_schema
    from memwal_sql.writer.memtable_indexes import RowsIndex

    n = 200_000
    wal = pa.schema([("id", pa.int64()), ("v", pa.string()), ("_tombstone", pa.bool_())])
    small = pa.record_batch({"id": [1], "v": ["x"], "_tombstone": [False]}, schema=wal)
    big = pa.record_batch(
        {"id": range(n), "v": ["abcdef"] * n, "_tombstone": [False] * n}, schema=wal
    )
    rows = RowsIndex(source_schema(wal), 1).update([small, big])
    assert rows.num_rows == n + 1
    assert rows.column("v").chunk(1).buffers()[2].address == big.column("v").buffers()[2].address
    many = RowsIndex(source_schema(wal), 1).update([small] * 300)
    assert many.column("v").num_chunks == 1


def test_key_membership_by_table_or_hash_set_agree() -> None:
    """The base's many-keys read matches keys a batch at a time, by a table over the wanted
    keys' span for integers in a narrow one and by Arrow's hash set otherwise (wide spans,
    strings): the same rows either way, values outside the span included."""
    from exec_nodes.base_source import _Member

    batches = [pa.array([5, 1, 9, -2, -(1 << 62)]), pa.array([7, 5, 100, 101, 1 << 62])]
    wanted = pa.array([5, -2, 8, 100])
    narrow = _Member(wanted, rows=20)
    assert narrow.table is not None
    want = [[True, False, False, True, False], [False, True, True, False, False]]
    assert [narrow(b).tolist() for b in batches] == want
    hashed = _Member(wanted, rows=1)  # a span of 103 values for 1 row: no table
    assert hashed.table is None
    assert [hashed(b).tolist() for b in batches] == want
    wide = _Member(pa.array([1 << 40, -(1 << 40)]), rows=4)
    assert wide.table is None
    assert wide(pa.array([0, 1 << 40, 3, -(1 << 40)])).tolist() == [False, True, False, True]
    words = _Member(pa.array(["c", "a"]), rows=3)
    assert words(pa.array(["a", "b", "c"])).tolist() == [True, False, True]
