"""MemWAL tables in a Lance directory namespace: created, opened, listed and dropped by id,
joined in SQL without registering them, and read by Lance's own DirectoryNamespace."""

from __future__ import annotations

import lance
import lance_namespace as ln
import pyarrow as pa
import pytest
from lance.namespace import DirectoryNamespace

import memwal_sql as mw
from memwal_sql.errors import (
    InvalidInputError,
    PrimaryKeyError,
    TableExistsError,
    TableNotFoundError,
)
from memwal_sql.namespaces import table_id


@pytest.fixture
def ns(tmp_path):
    ns = mw.namespace(str(tmp_path / "warehouse"))
    orders = ns.create_table(
        "sales.orders",
        pa.table({"id": [1, 2, 3], "cust": [10, 20, 10]}),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )
    items = ns.create_table(
        ["sales", "lineitem"],
        pa.table({"lid": [1, 2, 3, 4], "order_id": [1, 1, 2, 3], "amt": [5, 6, 7, 8]}),
        primary_key="lid",
    )
    top = ns.create_table("top", pa.table({"k": [1, 2]}), primary_key="k")
    orders.upsert({"id": [4], "cust": [30]})  # unmerged: in a MemTable, then the WAL
    items.upsert({"lid": [5], "order_id": [4], "amt": [100]})
    for t in (orders, items, top):
        t.close()
    return ns


def test_tables_are_listed_opened_and_dropped_by_id(ns):
    assert ns.table_names() == ["sales.lineitem", "sales.orders", "top"]
    assert ns.list_tables("sales") == ["lineitem", "orders"]
    assert ns.list_tables() == ["top"]
    assert ns.list_namespaces() == ["sales"]
    orders = ns.open_table("sales.orders")
    assert orders.lookup([4]).to_pylist() == [{"id": 4, "cust": 30}]
    same = mw.open_table(["sales", "orders"], namespace=ns)
    assert same.uri == orders.uri and same.count_rows() == 4
    orders.close()
    same.close()
    ns.drop_table("top")
    assert ns.table_names() == ["sales.lineitem", "sales.orders"]
    with pytest.raises(TableNotFoundError, match="no table top"):
        ns.open_table("top")
    with pytest.raises(TableNotFoundError):
        ns.drop_table("top")


def test_every_feature_works_on_a_namespace_table(ns):
    orders = ns.open_table("sales.orders")
    snap = orders.snapshot()
    with orders.writer(region_values=(0,)) as w:
        w.upsert({"id": [2], "cust": [99]})
    orders.merge()
    orders.compact()
    assert orders.lookup([2]).to_pylist() == [{"id": 2, "cust": 99}]
    assert orders.to_arrow(as_of=snap).sort_by("id").column("cust").to_pylist() == [10, 20, 10, 30]
    kinds = sorted(orders.changes(snap).column("_change_type").to_pylist())
    assert kinds == ["update_postimage", "update_preimage"]
    orders.close()


def test_sql_resolves_the_namespace_without_registering(ns):
    ctx = mw.connect(namespace=ns)
    joined = ctx.sql(
        "SELECT o.cust, sum(l.amt) AS s FROM sales.orders o JOIN sales.lineitem l "
        "ON l.order_id = o.id GROUP BY o.cust ORDER BY o.cust"
    ).to_pydict()
    assert joined == {"cust": [10, 20, 30], "s": [19, 7, 100]}  # unmerged rows included
    assert ctx.sql("SELECT count(*) AS n FROM top").to_pydict() == {"n": [2]}
    assert set(ctx.sql("SHOW TABLES").to_pydict()["table_name"]) >= {"orders", "lineitem", "top"}
    local = mw.connect(namespace=ns, default_schema="sales")
    assert local.sql("SELECT count(*) AS n FROM orders").to_pydict() == {"n": [4]}
    assert local.sql("DELETE FROM orders WHERE cust = 10").to_pydict() == {"count": [2]}
    assert ctx.sql("SELECT id FROM sales.orders ORDER BY id").to_pydict() == {"id": [2, 4]}
    with pytest.raises(mw.errors.SqlError, match="not found"):
        ctx.sql("SELECT * FROM sales.nothing")
    with pytest.raises(InvalidInputError, match="namespace="):
        mw.connect(default_schema="sales")


def test_lance_directory_namespace_lists_and_reads_the_tables(ns):
    orders = ns.open_table("sales.orders")
    orders.flush()
    orders.merge()
    orders.close()
    theirs = DirectoryNamespace(root=ns.root)
    assert sorted(theirs.list_tables(ln.ListTablesRequest(id=["sales"])).tables) == [
        "lineitem",
        "orders",
    ]
    rows = lance.dataset(namespace_client=theirs, table_id=["sales", "orders"]).to_table()
    assert rows.sort_by("id").to_pydict() == {"id": [1, 2, 3, 4], "cust": [10, 20, 10, 30]}


def test_namespace_errors_are_typed(ns):
    with pytest.raises(TableExistsError, match="already exists"):
        ns.create_table("sales.orders", pa.table({"id": [1]}), primary_key="id")
    with pytest.raises(InvalidInputError, match="table id"):
        table_id("sales..orders")
    with pytest.raises(InvalidInputError, match="namespace="):
        mw.open_table(["sales", "orders"])
    with pytest.raises(PrimaryKeyError):  # nothing is left declared
        ns.create_table("sales.bad", pa.table({"id": [1]}), primary_key="nope")
    assert "sales.bad" not in ns.table_names()
