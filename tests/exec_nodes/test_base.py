"""The base nodes alone: EmptyExec, FilterExec, TableExec, and conform."""

from __future__ import annotations

import pyarrow as pa
import pytest

from exec_nodes.base import EmptyExec, ExecNode, FilterExec, TableExec
from memwal_sql.expressions.predicate import Compare
from memwal_sql.formats.source_rows import (
    GEN,
    ROWADDR,
    TOMBSTONE,
    conform,
)
from tests.exec_nodes.nodes import BASE, SOURCE, check_contract


def test_conform_casts_fills_and_keeps_the_row_count():
    t = pa.table({"id": pa.array([1, 2], pa.int32()), GEN: pa.array([9, 9], pa.int64())})
    out = conform(t, SOURCE, generation=4)
    assert out.schema.equals(SOURCE)
    assert out.column(GEN).to_pylist() == [4, 4] and out.column(ROWADDR).to_pylist() == [0, 1]
    assert out.column(TOMBSTONE).to_pylist() == [False, False]
    assert out.column("v").null_count == 2
    assert conform(t, SOURCE).column(GEN).to_pylist() == [9, 9]  # kept when not given
    assert conform(t, pa.schema([])).num_rows == 2


def test_empty_exec():
    check_contract(EmptyExec(BASE), want_rows=0)


class TwoParts(ExecNode):
    """Rows of ``id`` in two partitions (what a scan's base parts and newer rows are)."""

    name = "TwoParts"

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([("id", pa.int64()), ("v", pa.string())])

    @property
    def partitions(self) -> int:
        return 2

    def execute(self, partition: int = 0):
        self._check_partition(partition)
        ids = [[1, 2], [3, None]][partition]
        yield pa.record_batch({"id": ids, "v": [f"p{partition}"] * 2}, schema=self.schema)


def test_a_node_runs_by_partition_and_to_table_runs_them_all():
    node = TwoParts()
    assert [b.column(0).to_pylist() for b in node.execute(1)] == [[3, None]]
    assert node.to_table().column("id").to_pylist() == [1, 2, 3, None]
    with pytest.raises(IndexError, match="2 partition"):
        list(node.execute(2))


def test_execute_columns_projects_and_casts_by_default():
    want = pa.schema([("v", pa.large_string())])
    (batch,) = TwoParts().execute_columns(0, want)
    assert batch.schema.equals(want) and batch.column(0).to_pylist() == ["p0", "p0"]


def test_filter_exec_keeps_true_rows_per_partition_and_no_empty_batches():
    node = FilterExec(TwoParts(), Compare("id", ">", pa.scalar(1, pa.int64())))
    assert node.partitions == 2 and node.schema.equals(TwoParts().schema)
    assert [b.num_rows for b in node.execute(0)] == [1]
    assert [b.column(0).to_pylist() for b in node.execute(1)] == [[3]]  # NULL is not TRUE
    none = FilterExec(TwoParts(), Compare("id", ">", pa.scalar(9, pa.int64())))
    assert list(none.execute(0)) == [] and check_contract(none, want_rows=0).num_rows == 0
    assert node.explain().splitlines()[1].strip().startswith("TwoParts")


def test_table_exec_yields_its_rows_as_one_partition():
    rows = pa.table({"id": [4, 5]})
    node = TableExec(rows)
    assert check_contract(node, want_rows=2).equals(rows)
    with pytest.raises(IndexError):
        list(node.execute(1))
