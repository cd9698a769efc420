"""TPC-H over MemWAL tables: data, change rounds, a model of the latest rows, and comparisons.

Shared by ``benchmarks/bench_tpch.py`` (timings against DataFusion over Parquet) and
``tests/test_tpch.py`` (the 22 queries return the same rows at every stage).

* :func:`generate` writes the eight tables as Parquet with ``tpchgen-cli``.
* :func:`build` makes each a MemWAL table (orders and lineitem bucketed into four regions).
* :func:`change_round` applies one round of changes to orders and lineitem (updates, deletes of
  whole orders with their lines, re-inserts of orders deleted earlier) to the tables and to
  :class:`Latest`, a plain pyarrow model of the latest rows, which never reads the tables.
* :func:`run_queries` runs the 22 queries in a session; :func:`same_rows` compares two results.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import memwal_sql as mw

QUERY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tpch_queries")
KEYS = {
    "region": ["r_regionkey"],
    "nation": ["n_nationkey"],
    "supplier": ["s_suppkey"],
    "customer": ["c_custkey"],
    "part": ["p_partkey"],
    "partsupp": ["ps_partkey", "ps_suppkey"],
    "orders": ["o_orderkey"],
    "lineitem": ["l_orderkey", "l_linenumber"],
}
BUCKETED = {"orders": "o_orderkey", "lineitem": "l_orderkey"}


def generate(directory: str, scale: float) -> None:
    """The eight tables as ``{directory}/{table}.parquet`` (``tpchgen-cli``)."""
    cli = os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    subprocess.run(
        [cli, "parquet", "-s", str(scale), f"--output-dir={directory}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def read(directory: str, table: str) -> pa.Table:
    """A generated table, with plain strings (tpchgen writes string_view) and no field ids."""
    t = pq.read_table(f"{directory}/{table}.parquet")
    fields = [
        pa.field(f.name, pa.string() if pa.types.is_string_view(f.type) else f.type, f.nullable)
        for f in t.schema
    ]
    return t.cast(pa.schema(fields))


def queries() -> dict[int, str]:
    """The 22 TPC-H queries (the TPC-H specification's text with its validation parameters)."""
    out = {}
    for n in range(1, 23):
        with open(os.path.join(QUERY_DIR, f"q{n}.sql")) as f:
            out[n] = f.read()
    return out


class Latest:
    """The latest row of every key of each table, kept as plain pyarrow tables."""

    def __init__(self, tables: dict[str, pa.Table]) -> None:
        self.tables = dict(tables)

    def _key(self, name: str, rows: pa.Table) -> pa.Array:
        cols = KEYS[name]
        if len(cols) == 1:
            return rows.column(cols[0]).combine_chunks()
        return pc.add(
            pc.multiply(rows.column(cols[0]).cast(pa.int64()), 1 << 20),
            rows.column(cols[1]).cast(pa.int64()),
        ).combine_chunks()

    def upsert(self, name: str, rows: pa.Table) -> None:
        self.delete(name, rows)
        self.tables[name] = pa.concat_tables(
            [self.tables[name], rows.cast(self.tables[name].schema)]
        )

    def delete(self, name: str, keys: pa.Table) -> None:
        t = self.tables[name]
        gone = pc.is_in(self._key(name, t), value_set=self._key(name, keys))
        self.tables[name] = t.filter(pc.invert(gone))

    def write_parquet(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        for name, t in self.tables.items():
            pq.write_table(t, f"{directory}/{name}.parquet")


def build(
    work: str, data: str, max_memtable_rows: int, data_storage_version: str | None = None
) -> tuple[dict[str, mw.MemWalTable], Latest]:
    """The eight tables as MemWAL tables (base = the generated rows, in Lance file format
    ``data_storage_version``) and their model."""
    tables, model = {}, {}
    for name, keys in KEYS.items():
        rows = read(data, name)
        spec = mw.RegionSpec.bucket(BUCKETED[name], 4) if name in BUCKETED else None
        tables[name] = mw.create_table(
            f"{work}/{name}",
            rows,
            primary_key=keys,
            region_spec=spec,
            writer_config=mw.WriterConfig(durable_write=False, max_memtable_rows=max_memtable_rows),
            data_storage_version=data_storage_version,
        )
        model[name] = rows
    return tables, Latest(model)


def change_round(
    tables: dict[str, mw.MemWalTable],
    latest: Latest,
    rng: np.random.Generator,
    round_no: int,
    deleted: dict[str, list[pa.Table]],
    share: float = 0.02,
) -> None:
    """One round of changes to orders and lineitem, applied to the tables and the model:
    ``share`` of the orders get a new price, priority and comment (and their lines a new
    quantity, discount and ship date, which moves them in and out of the queries' ranges), a
    quarter of that share is deleted with all its lines, and orders deleted in an earlier round
    come back."""
    orders, lines = latest.tables["orders"], latest.tables["lineitem"]
    n = orders.num_rows
    picked = np.unique(rng.choice(n, max(1, int(n * share)), replace=False))
    keys = orders.column("o_orderkey").take(pa.array(picked))
    upd = orders.take(pa.array(picked))
    price = pc.add(
        upd.column("o_totalprice"),
        pa.scalar(Decimal("1.25"), upd.schema.field("o_totalprice").type),
    )
    upd = upd.set_column(upd.schema.get_field_index("o_totalprice"), "o_totalprice", price)
    upd = upd.set_column(
        upd.schema.get_field_index("o_comment"),
        "o_comment",
        pa.array([f"changed in round {round_no}"] * upd.num_rows),
    )
    prio = np.array(["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"])
    upd = upd.set_column(
        upd.schema.get_field_index("o_orderpriority"),
        "o_orderpriority",
        pa.array(prio[rng.integers(0, 5, upd.num_rows)]),
    )
    their_lines = lines.filter(pc.is_in(lines.column("l_orderkey"), value_set=keys))
    qty_type = lines.schema.field("l_quantity").type
    new_qty = pa.array(
        [Decimal(int(q)) for q in rng.integers(1, 51, their_lines.num_rows)], qty_type
    )
    disc = pa.array(
        [Decimal(int(d)) / 100 for d in rng.integers(0, 11, their_lines.num_rows)],
        lines.schema.field("l_discount").type,
    )
    ship = pc.add(
        their_lines.column("l_shipdate").cast(pa.int32()),
        pa.array(rng.integers(-40, 40, their_lines.num_rows).astype(np.int32)),
    )
    line_upd = their_lines
    for col, values in (
        ("l_quantity", new_qty),
        ("l_discount", disc),
        ("l_shipdate", ship.cast(pa.date32())),
    ):
        line_upd = line_upd.set_column(line_upd.schema.get_field_index(col), col, values)
    for name, rows in (("orders", upd), ("lineitem", line_upd)):
        tables[name].upsert(rows)
        latest.upsert(name, rows)
    gone = keys.take(pa.array(rng.choice(len(keys), max(1, len(keys) // 4), replace=False)))
    gone_orders = latest.tables["orders"].filter(
        pc.is_in(latest.tables["orders"].column("o_orderkey"), value_set=gone)
    )
    gone_lines = latest.tables["lineitem"].filter(
        pc.is_in(latest.tables["lineitem"].column("l_orderkey"), value_set=gone)
    )
    tables["orders"].delete(gone_orders.select(KEYS["orders"]))
    tables["lineitem"].delete(gone_lines.select(KEYS["lineitem"]))
    latest.delete("orders", gone_orders)
    latest.delete("lineitem", gone_lines)
    back = deleted.pop("orders", [])
    back_lines = deleted.pop("lineitem", [])
    for name, parts in (("orders", back), ("lineitem", back_lines)):
        for rows in parts:
            tables[name].upsert(rows)
            latest.upsert(name, rows)
    deleted["orders"] = [gone_orders]
    deleted["lineitem"] = [gone_lines]


def run_queries(
    ctx: object,
    only: list[int] | None = None,
    timer: Callable[[Callable[[], pa.Table]], float] | None = None,
) -> dict[int, tuple[pa.Table, float]]:
    """Each query's result (and, with ``timer``, its time in ms) in session ``ctx``."""
    out = {}
    for n, text in queries().items():
        if only and n not in only:
            continue

        def run(t=text):
            return _run(ctx, t)

        result = run()
        out[n] = (result, timer(run) if timer else 0.0)
    return out


def _run(ctx: object, text: str) -> pa.Table:
    result = None
    for statement in [s for s in text.split(";") if s.strip()]:
        table = ctx.sql(statement).to_arrow_table()  # type: ignore[attr-defined]
        if table.num_columns:
            result = table
    assert result is not None
    return result


def same_rows(a: pa.Table, b: pa.Table) -> bool:
    """The same rows (in any order: ORDER BY ties may come back either way), numbers
    compared to 9 significant digits (sums of floats depend on the order of addition)."""
    if a.num_rows != b.num_rows or a.column_names != b.column_names:
        return False
    return sorted(_norm(r) for r in a.to_pylist()) == sorted(_norm(r) for r in b.to_pylist())


def _norm(row: dict) -> tuple:
    out = []
    for v in row.values():
        if isinstance(v, (float, Decimal)):
            out.append(float(f"{float(v):.9g}"))
        else:
            out.append(v)
    return tuple(str(x) for x in out)
