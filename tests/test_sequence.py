"""Tables with a sequence column: each key's row with the highest sequence wins, whatever order
writes arrive in (the later write on a tie), across the MemTable, generations, merges and the
base table; deletes carry the sequence too, and a merged delete still outranks an older upsert.

Checked against a model that applies the same rules, through scans, filters, lookups, SQL and
Lance's own LsmScanner, with hypothesis interleaving writes with flushes, merges, crashes and
reopens."""

from __future__ import annotations

import itertools

import datafusion
import lance
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import InvalidInputError, SchemaMismatchError, TableExistsError
from memwal_sql.formats.debezium import decode_debezium
from memwal_sql.storage import layout
from tests.lsm import apply_changes, apply_op, lance_latest_rows

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("ts", pa.int64()),
        pa.field("x", pa.int64()),
        pa.field("s", pa.string()),
    ]
)
FILTERS = [None, "x > 4", "x IS NULL", "s LIKE 'a%'", "id % 3 = 0 OR x = 1"]


def rows(keys: list[int], ts: list[int] | int, seed: int) -> pa.Table:
    stamps = ts if isinstance(ts, list) else [ts] * len(keys)
    return pa.table(
        {
            "id": keys,
            "ts": stamps,
            "x": [None if (k + seed) % 4 == 0 else (k * 3 + seed) % 9 for k in keys],
            "s": [["a", "ab", "b", None][(k + seed) % 4] for k in keys],
        },
        schema=SCHEMA,
    )


class SequenceModel:
    """Per key: its row (None once deleted) and the highest sequence it has taken."""

    def __init__(self) -> None:
        self.state: dict[int, tuple[dict | None, int]] = {}

    def _newer(self, key: int, ts: int) -> bool:
        return key not in self.state or ts >= self.state[key][1]

    def upsert(self, table: pa.Table) -> None:
        for row in table.to_pylist():
            if self._newer(row["id"], row["ts"]):
                self.state[row["id"]] = (row, row["ts"])

    def delete(self, keys: pa.Table) -> None:
        for row in keys.to_pylist():
            if self._newer(row["id"], row["ts"]):
                self.state[row["id"]] = (None, row["ts"])

    def update(self, partial: pa.Table) -> None:
        for row in partial.to_pylist():
            current = self.live().get(row["id"])
            whole = {**(current or dict.fromkeys(SCHEMA.names)), **row}
            if self._newer(row["id"], whole["ts"]):
                self.state[row["id"]] = (whole, whole["ts"])

    def live(self) -> dict[int, dict]:
        return {k: r for k, (r, _) in self.state.items() if r is not None}

    def table(self) -> pa.Table:
        live = self.live()
        return pa.Table.from_pylist([live[k] for k in sorted(live)], schema=SCHEMA)


def sql(table: pa.Table, query: str) -> pa.Table:
    ctx = datafusion.SessionContext()
    ctx.register_record_batches(
        "t", [table.to_batches() or [pa.RecordBatch.from_pylist([], schema=SCHEMA)]]
    )
    return ctx.sql(query).to_arrow_table()


def by_key(table: pa.Table) -> list[dict]:
    return table.sort_by("id").to_pylist()


def check_reads(tbl: mw.MemWalTable, model: SequenceModel) -> None:
    want = model.table()
    assert by_key(tbl.to_arrow()) == want.to_pylist()
    for f in FILTERS[1:]:
        assert by_key(tbl.to_arrow(filter=f)) == by_key(sql(want, f"SELECT * FROM t WHERE {f}"))
    assert by_key(tbl.lookup(list(range(40)))) == want.to_pylist()
    assert tbl.count_rows() == want.num_rows
    ctx = mw.connect()
    ctx.register("t", tbl)
    query = "SELECT s, count(*) AS n, max(ts) AS ts FROM t GROUP BY s ORDER BY s NULLS FIRST"
    assert ctx.sql(query).to_arrow_table() == sql(want, query)


keys = st.lists(st.integers(0, 30), min_size=1, max_size=8)  # repeats: the highest ts wins
stamps = st.lists(st.integers(0, 12), min_size=8, max_size=8)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), keys, stamps, st.integers(0, 9)),
        st.tuples(st.just("delete"), keys, stamps, st.just(0)),
        st.tuples(st.sampled_from(["update", "update_ts"]), keys, stamps, st.integers(0, 9)),
        st.tuples(st.just("delete_filter"), st.just([]), st.just([]), st.integers(0, 4)),
        st.tuples(
            st.sampled_from(
                ["flush", "merge", "settle", "crash", "reopen", "read", "compact", "snapshot"]
            ),
            st.just([]),
            st.just([]),
            st.just(0),
        ),
    ),
    min_size=1,
    max_size=16,
)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=ops, buckets=st.sampled_from([None, 2]))
def test_every_read_path_equals_the_model(tmp_path_factory, ops, buckets):
    uri = str(tmp_path_factory.mktemp("seq"))
    first = rows(list(range(10)), 5, 0)
    tbl = mw.create_table(
        uri,
        first,
        primary_key="id",
        sequence_column="ts",
        region_spec=mw.RegionSpec.bucket("id", buckets) if buckets else None,
        writer_config=mw.WriterConfig(max_memtable_rows=5),
    )
    model = SequenceModel()
    model.upsert(first)
    taken = []  # (token, the model's state then)
    for op, ks, ts, seed in ops:
        given_ts = ts[: len(ks)]
        if op == "upsert":
            tbl.upsert(rows(ks, given_ts, seed))
            model.upsert(rows(ks, given_ts, seed))
        elif op == "delete":
            gone = rows(ks, given_ts, 0).select(["id", "ts"])
            tbl.delete(gone)
            model.delete(gone)
        elif op == "update_ts":  # a partial row with its own sequence
            part = rows(ks, given_ts, seed).select(["id", "ts", "x"])
            tbl.update(part)
            model.update(part)
        elif op == "update":  # no sequence given: only keys the table holds, which keep theirs
            live = [k for k in dict.fromkeys(ks) if k in model.live()]
            if live:
                part = rows(live, 0, seed).select(["id", "s"])
                tbl.update(part)
                model.update(part)
        elif op == "delete_filter":
            f = FILTERS[1 + seed % (len(FILTERS) - 1)]
            matched = sql(model.table(), f"SELECT id, ts FROM t WHERE {f}")
            assert tbl.delete(filter=f) == matched.num_rows
            model.delete(matched)
        elif op == "read":
            check_reads(tbl, model)
        elif op == "settle":  # everything merged: deletes leave the sources for the tombstones
            tbl.flush()
            tbl.merge()
        elif op == "snapshot":
            taken.append((tbl.snapshot().token, model.table()))
        else:
            tbl = apply_op(tbl, None, op, [], 0, uri, None)  # type: ignore[arg-type]
    check_reads(tbl, model)
    # Snapshots read their state; the changes from each to the next lead from one to the other.
    taken.append((tbl.snapshot().token, model.table()))
    for token, then in taken:
        assert by_key(tbl.to_arrow(as_of=tbl.snapshot(token))) == then.to_pylist()
    for (a, at_a), (b, at_b) in itertools.pairwise(taken):
        for mode in ("net", "all"):
            assert apply_changes(at_a, tbl.changes(a, b, mode=mode), SCHEMA) == at_b
    # Lance's reader sees the same rows: a write older than its key's row never got stored.
    tbl.flush()
    tbl.maintenance.flush_regions()  # what a crash left in the WAL only
    assert lance_latest_rows(uri, ["id"]).to_pylist() == model.table().to_pylist()
    tbl.close()
    reopened = mw.open_table(uri)
    check_reads(reopened, model)
    reopened.close()


@pytest.fixture
def table(tmp_path):
    tbl = mw.create_table(
        str(tmp_path / "t"),
        rows([1, 2, 3], 10, 0),
        primary_key="id",
        sequence_column="ts",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )
    yield tbl
    tbl.close()


def test_a_merged_delete_keeps_older_upserts_out(table):
    table.delete(pa.table({"id": [2, 7], "ts": [20, 20]}))  # 7: a delete before its insert
    table.flush()
    table.merge()
    assert table.lookup([2, 7]).num_rows == 0
    tombstones = lance.dataset(table.store.uri_for(layout.MERGED_TOMBSTONES)).to_table()
    assert sorted(tombstones.column("id").to_pylist()) == [2, 7]
    # Neither the base nor any generation holds keys 2 and 7 now: only the merged tombstones.
    table.upsert(rows([2, 7], [19, 20], 1))
    assert by_key(table.to_arrow()) == [
        *by_key(rows([1, 3], 10, 0)),
        rows([7], 20, 1).to_pylist()[0],
    ]
    # Another process (a fresh table object) decides the same.
    other = mw.open_table(table.uri)
    other.upsert(rows([2], 19, 2))
    assert other.lookup([2]).num_rows == 0
    other.close()


def test_a_delete_older_than_the_row_changes_nothing(table):
    table.delete(pa.table({"id": [1], "ts": [9]}))
    table.delete(pa.table({"id": [2], "ts": [10]}))  # a tie: the later write wins
    assert by_key(table.to_arrow()) == by_key(rows([1, 3], 10, 0))


def test_one_write_keeps_each_keys_highest_sequence(table):
    table.upsert(
        rows([5, 5, 5, 6, 6], [3, 8, 8, 2, 1], 0).set_column(3, "s", pa.array(list("abcde")))
    )
    got = {r["id"]: (r["ts"], r["s"]) for r in table.lookup([5, 6]).to_pylist()}
    assert got == {5: (8, "c"), 6: (2, "d")}


def test_create_keeps_each_keys_highest_sequence(tmp_path):
    data = rows([1, 1, 2], [9, 4, 1], 0)
    tbl = mw.create_table(str(tmp_path / "t"), data, primary_key="id", sequence_column="ts")
    assert by_key(tbl.to_arrow()) == [data.to_pylist()[0], data.to_pylist()[2]]
    assert mw.open_table(tbl.uri).sequence_column == "ts"
    with pytest.raises(TableExistsError):
        mw.create_table(tbl.uri, None, primary_key="id", exist_ok=True)  # no sequence column
    tbl.close()


def test_enabling_memwal_on_a_lance_table_with_a_sequence_column(tmp_path):
    uri = str(tmp_path / "t")
    lance.write_dataset(rows([1, 2], 5, 0), uri)
    tbl = mw.create_table(uri, None, primary_key="id", sequence_column="ts")
    tbl.upsert(rows([1, 2], [4, 6], 1))
    assert [r["ts"] for r in by_key(tbl.to_arrow())] == [5, 6]
    tbl.close()


def test_the_merge_keeps_a_newer_base_row_from_a_writer_that_ignores_the_sequence(table):
    # A region writer's raw append (as Lance's own writers write) bypasses the sequence check:
    # reads then show its row (arrival order), but the merge's condition keeps the base row.
    table.flush()
    rows_ = table._rows.upserts(rows([1, 2], [3, 30], 5))
    writer = table._route(rows_, rows_)
    for w, batch in writer:
        w.wait_durable(w.append_rows(batch, "upserts"))
    table.flush()
    table.merge()
    base = {r["id"]: r["ts"] for r in table.dataset().to_table().to_pylist()}
    assert base == {1: 10, 2: 30, 3: 10}


@pytest.mark.parametrize(
    ("call", "error", "says"),
    [
        (lambda t: t.upsert(rows([1], 0, 0).set_column(1, "ts", pa.nulls(1, pa.int64()))), InvalidInputError, "null"),
        (lambda t: t.delete([1]), InvalidInputError, "a delete carries it"),
        (lambda t: t.delete(pa.table({"id": [1], "ts": [None]}, schema=pa.schema([("id", pa.int64()), ("ts", pa.int64())]))), InvalidInputError, "null"),
        (lambda t: t.update({"id": [99], "x": [1]}), InvalidInputError, "needs its sequence"),
        (lambda t: t.writer(region_values=(0,)).upsert(rows([2], 99, 0)), InvalidInputError, "arrival order"),
    ],
)  # fmt: skip
def test_bad_writes_are_typed_errors_and_write_nothing(table, call, error, says):
    before = table.to_arrow()
    with pytest.raises(error, match=says):
        call(table)
    assert table.to_arrow() == before


@pytest.mark.parametrize(
    ("column", "error"),
    [("v", SchemaMismatchError), ("id", InvalidInputError), ("f", SchemaMismatchError)],
)
def test_a_sequence_column_must_exist_be_no_key_and_be_ordered(tmp_path, column, error):
    schema = pa.schema([pa.field("id", pa.int64(), False), ("f", pa.float64())])
    with pytest.raises(error):
        mw.create_table(str(tmp_path / "t"), schema, primary_key="id", sequence_column=column)
    assert not (tmp_path / "t").exists()  # refused before anything was written
    lance.write_dataset(schema.empty_table(), str(tmp_path / "t"))
    with pytest.raises(error):  # enabling MemWAL on a Lance table: the same checks first
        mw.create_table(str(tmp_path / "t"), None, primary_key="id", sequence_column=column)
    assert mw.create_table(str(tmp_path / "t"), None, primary_key="id").sequence_column is None


def test_sql_dml_keeps_the_sequence(table):
    ctx = mw.connect()
    ctx.register("t", table)
    ctx.sql("INSERT INTO t VALUES (1, 4, 0, 'old'), (4, 4, 0, 'new')").to_pydict()
    ctx.sql("UPDATE t SET s = 'upd' WHERE id = 2").to_pydict()  # keeps its sequence
    ctx.sql("DELETE FROM t WHERE id = 3").to_pydict()  # carries the row's sequence
    table.upsert(rows([3], 9, 0))  # older than the delete
    got = {r["id"]: (r["ts"], r["s"]) for r in table.to_arrow().to_pylist()}
    assert got == {1: (10, "ab"), 2: (10, "upd"), 4: (4, "new")}


PG = {"connector": "postgresql", "db": "shop", "schema": "public", "table": "t"}


def event(op: str, before: dict | None, after: dict | None, lsn: int) -> dict:
    return {"op": op, "before": before, "after": after, "source": {**PG, "lsn": lsn, "ts_ms": 1}}


def test_debezium_events_out_of_order_take_each_keys_newest(table):
    events = [
        event("u", None, {"id": 1, "x": 1, "s": "new"}, 300),
        event("u", None, {"id": 1, "x": 0, "s": "old"}, 200),  # late, older
        event("d", {"id": 4, "x": 0, "s": "z"}, None, 250),
        None,  # Kafka's tombstone
        event("c", None, {"id": 4, "x": 0, "s": "z"}, 240),  # the insert the delete followed
    ]
    changes = decode_debezium(events, ["id"], "ts")
    assert changes.upserts == [{"id": 1, "x": 1, "s": "new", "ts": 300}]
    assert changes.deletes == [{"id": 4, "x": 0, "s": "z", "ts": 250}]
    table.apply_changes(events)
    table.apply_changes([event("u", None, {"id": 1, "x": 2, "s": "older"}, 299)])
    got = {r["id"]: (r["ts"], r["s"]) for r in table.to_arrow().to_pylist()}
    assert got == {1: (300, "new"), 2: (10, "b"), 3: (10, None)}


def test_debezium_takes_the_rows_own_sequence_first():
    events = [
        {"op": "u", "after": {"id": 1, "ts": 7}, "source": {"lsn": 100}},
        {"op": "u", "after": {"id": 1, "ts": 5}, "source": {"lsn": 200}},
        {"op": "r", "after": {"id": 2}, "source": {"ts_ms": 42}},
    ]
    changes = decode_debezium(events, ["id"], "ts")
    assert changes.upserts == [{"id": 1, "ts": 7}, {"id": 2, "ts": 42}]
    with pytest.raises(InvalidInputError, match="no sequence"):
        decode_debezium([{"op": "c", "after": {"id": 1}, "source": {}}], ["id"], "ts")


def test_searches_see_only_each_keys_newest_row(tmp_path):
    """Vector and full-text search read what scans read: the row an older write would have
    replaced is the one they find, through the base's indexes and the unmerged rows."""
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("ts", pa.int64()),
            pa.field("body", pa.string()),
            pa.field("vec", pa.list_(pa.float32(), 2)),
        ]
    )

    def docs(ids, ts, words, x):
        return pa.table(
            {
                "id": ids,
                "ts": [ts] * len(ids),
                "body": [f"{words} doc{i}" for i in ids],
                "vec": [[x, float(i)] for i in ids],
            },
            schema=schema,
        )

    tbl = mw.create_table(str(tmp_path / "t"), docs(range(40), 5, "plain", 0.0),
                          primary_key="id", sequence_column="ts")  # fmt: skip
    tbl.create_index("vec", "IVF_FLAT", num_partitions=2)
    tbl.create_index("body", "INVERTED")
    tbl.upsert(docs([1, 2], 9, "fresh", 100.0))
    tbl.flush()
    tbl.upsert(docs([1, 2, 3], 7, "stale", 50.0))  # older than 1 and 2 (not 3)
    assert sorted(tbl.fts("stale", k=5).column("id").to_pylist()) == [3]
    assert sorted(tbl.fts("fresh", k=5).column("id").to_pylist()) == [1, 2]
    near = tbl.vector_search([50.0, 2.0], column="vec", k=1).to_pylist()[0]
    assert (near["id"], near["ts"]) == (3, 7)  # 2 at (50, 2) was older than its row
    tbl.close()


def test_gc_compacts_the_merged_deletes_and_they_still_hold(table):
    from datetime import timedelta

    for ts in (20, 21, 22):  # three merges with deletes: three appends
        table.delete(pa.table({"id": [ts], "ts": [ts]}))
        table.flush()
        table.merge()
    store = table.store.uri_for(layout.MERGED_TOMBSTONES)
    assert len(lance.dataset(store).get_fragments()) == 3
    result = table.gc(base_versions_older_than=timedelta(0))
    assert result.merged_tombstone_fragments == 2
    assert len(lance.dataset(store).get_fragments()) == 1
    assert len(lance.dataset(store).versions()) == 1  # the superseded ones expired
    table.upsert(rows([20, 21, 22], [19, 21, 30], 0))  # older, a tie, newer
    assert sorted(table.to_arrow().column("id").to_pylist()) == [1, 2, 3, 21, 22]


CHILD = """
import sys
import pyarrow as pa
import memwal_sql as mw
from tests.test_sequence import planned_write

tbl = mw.open_table(sys.argv[1])
for i in range(10_000):
    kind, data = planned_write(i)
    tbl.upsert(data) if kind == "upsert" else tbl.delete(data)
    print(f"ACK {i}", flush=True)
    if i % 10 == 9:
        tbl.flush()
        tbl.merge()
"""


def planned_write(i: int) -> tuple[str, pa.Table]:
    """Write ``i`` of the crash test: upserts and deletes of a few keys, their sequences out
    of order (a stamp goes up and down as ``i`` grows)."""
    ks = [(i * 7 + j * 3) % 25 for j in range(4)]
    stamps = [(i * 37 + j * 11) % 101 for j in range(4)]
    if i % 5 == 4:
        return "delete", pa.table({"id": ks, "ts": stamps})
    return "upsert", rows(ks, stamps, i)


def test_a_killed_writer_keeps_the_sequence_rule_for_every_acknowledged_write(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    uri = str(tmp_path / "t")
    mw.create_table(uri, SCHEMA, primary_key="id", sequence_column="ts",
                    region_spec=mw.RegionSpec.bucket("id", 2)).close()  # fmt: skip
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, uri],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert child.stdout is not None
    acked = -1
    for line in child.stdout:
        acked = int(line.split()[1])
        if acked == 47:  # past several merges of deletes
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    # The child went on writing until the kill: its last acknowledgement is the last line it
    # printed, and the write after that may have landed, whole, or not at all.
    for line in child.stdout.read().splitlines():
        acked = int(line.split()[1])
    models = []
    for last in (acked, acked + 1):
        model = SequenceModel()
        for i in range(last + 1):
            kind, data = planned_write(i)
            model.upsert(data) if kind == "upsert" else model.delete(data)
        models.append(model)
    tbl = mw.open_table(uri)
    assert by_key(tbl.to_arrow()) in [m.table().to_pylist() for m in models]
    model = next(m for m in models if m.table().to_pylist() == by_key(tbl.to_arrow()))
    # After recovery the rule holds against what the dead writer left, merged or not.
    late = rows(list(range(25)), 50, 99)
    tbl.upsert(late)
    model.upsert(late)
    check_reads(tbl, model)
    tbl.close()
