"""Debezium change events, in the shapes Debezium's documentation shows for PostgreSQL and
MySQL, applied to a MemWAL table (``tbl.apply_changes``) and checked against a model."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import InvalidInputError
from memwal_sql.formats.debezium import decode_debezium

# The customers table of Debezium's tutorials; `since` a DATE (days since the epoch in
# Debezium's JSON), `seen` a TIMESTAMP (microseconds: io.debezium.time.MicroTimestamp).
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int32(), False),
        pa.field("first_name", pa.string()),
        pa.field("last_name", pa.string()),
        pa.field("email", pa.string()),
        pa.field("since", pa.date32()),
        pa.field("seen", pa.timestamp("us")),
    ]
)
PG_SCHEMA = {  # what the JSON converter sends with schemas.enable=true (abridged, as in the docs)
    "type": "struct",
    "fields": [
        {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}],
         "optional": True, "name": "PostgreSQL_server.inventory.customers.Value", "field": "before"},
        {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}],
         "optional": True, "name": "PostgreSQL_server.inventory.customers.Value", "field": "after"},
        {"type": "string", "optional": False, "field": "op"},
    ],
    "optional": False,
    "name": "PostgreSQL_server.inventory.customers.Envelope",
}  # fmt: skip


def customer(i: int, email: str) -> dict:
    return {
        "id": i,
        "first_name": f"first{i}",
        "last_name": "Kretchmar",
        "email": email,
        "since": 18_000 + i,  # days
        "seen": 1_559_033_904_863_000 + i,  # microseconds
    }


def pg_event(op: str, before: dict | None, after: dict | None, lsn: int) -> str:
    """A PostgreSQL connector's message value, as JSON text with its schema."""
    payload = {
        "before": before,
        "after": after,
        "source": {
            "version": "2.5.4.Final", "connector": "postgresql", "name": "PostgreSQL_server",
            "ts_ms": 1559033904863, "snapshot": "true" if op == "r" else "false",
            "db": "postgres", "sequence": f'["{lsn - 9}","{lsn}"]', "schema": "public",
            "table": "customers", "txId": 555, "lsn": lsn, "xmin": None,
        },
        "op": op,
        "ts_ms": 1559033904863,
        "transaction": None,
    }  # fmt: skip
    return json.dumps({"schema": PG_SCHEMA, "payload": payload})


def mysql_event(op: str, before: dict | None, after: dict | None, pos: int) -> dict:
    """A MySQL connector's envelope (schemas.enable=false: the bare payload)."""
    return {
        "before": before,
        "after": after,
        "source": {
            "version": "2.5.4.Final", "connector": "mysql", "name": "mysql-server-1",
            "ts_ms": 1465581029100, "snapshot": "false", "db": "inventory",
            "table": "customers", "server_id": 223344, "gtid": None,
            "file": "mysql-bin.000003", "pos": pos, "row": 0, "thread": 7, "query": None,
        },
        "op": op,
        "ts_ms": 1465581029523,
    }  # fmt: skip


def as_arrow(row: dict) -> dict:
    """``row`` as the table reads it: Debezium's day and microsecond counts as Arrow's."""
    return {
        **row,
        "since": pa.scalar(row["since"], pa.date32()).as_py(),
        "seen": pa.scalar(row["seen"], pa.timestamp("us")).as_py(),
    }


@pytest.fixture
def table(tmp_path):
    tbl = mw.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id",
                          region_spec=mw.RegionSpec.bucket("id", 2))  # fmt: skip
    yield tbl
    tbl.close()


def test_postgresql_snapshot_create_update_delete_and_tombstone(table):
    events = [
        pg_event("r", None, customer(1, "annek@noanswer.org"), 24023128),  # snapshot read
        pg_event("r", None, customer(2, "bob@example.org"), 24023129),
        pg_event("c", None, customer(3, "carl@example.org"), 24023200),
        # REPLICA IDENTITY DEFAULT: an update's before is null
        pg_event("u", None, customer(1, "noreply@example.org"), 24023300),
        # ... and a delete's before holds the key only
        pg_event(
            "d",
            {
                "id": 2,
                "first_name": None,
                "last_name": None,
                "email": None,
                "since": None,
                "seen": None,
            },
            None,
            24023400,
        ),
        None,  # the tombstone Kafka gets after a delete
        pg_event("c", None, customer(4, "dora@example.org"), 24023500),
        pg_event("d", {"id": 4}, None, 24023600),
        None,
    ]
    changes = table.apply_changes(events, format="debezium")
    assert (len(changes.upserts), len(changes.deletes), changes.tombstones) == (2, 2, 2)
    want = [as_arrow(customer(1, "noreply@example.org")), as_arrow(customer(3, "carl@example.org"))]
    assert table.to_arrow().sort_by("id").to_pylist() == want
    table.flush()
    table.merge()
    assert table.to_arrow().sort_by("id").to_pylist() == want


def test_mysql_envelopes_as_dicts_and_as_bytes(table):
    first = [mysql_event("c", None, customer(i, f"{i}@x.org"), 100 + i) for i in range(5)]
    table.apply_changes(first)
    table.apply_changes(
        json.dumps(e).encode()
        for e in [
            mysql_event("u", customer(2, "2@x.org"), customer(2, "two@x.org"), 200),
            mysql_event("d", customer(3, "3@x.org"), None, 201),
        ]
    )
    got = {r["id"]: r["email"] for r in table.to_arrow().to_pylist()}
    assert got == {0: "0@x.org", 1: "1@x.org", 2: "two@x.org", 4: "4@x.org"}


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([{"op": "x", "after": {"id": 1}}], "op 'x'"),
        ([{"op": "t", "before": None, "after": None}], "truncate"),
        ([{"op": "c", "before": None, "after": None}], "no 'after' row"),
        ([{"op": "d", "before": None, "after": None}], "REPLICA IDENTITY"),
        (["{not json"], "not JSON"),
        ([[1, 2]], "not a Debezium envelope"),
        ([{"op": "c", "after": {"first_name": "no key"}}], "key column"),
    ],
)
def test_bad_events_are_typed_errors_and_write_nothing(table, events, message):
    good = mysql_event("c", None, customer(9, "9@x.org"), 1)
    with pytest.raises(InvalidInputError, match=message):
        table.apply_changes([good, *events])
    assert table.count_rows() == 0


def test_deletes_reach_regions_split_by_a_non_key_column(tmp_path):
    tbl = mw.create_table(
        str(tmp_path / "t"), SCHEMA, primary_key="id",
        region_spec=mw.RegionSpec.identity("last_name"), allow_non_key_region_spec=True,
    )  # fmt: skip
    tbl.apply_changes([mysql_event("c", None, customer(i, "e"), i) for i in range(3)])
    with pytest.raises(InvalidInputError, match="REPLICA IDENTITY FULL"):
        tbl.apply_changes([mysql_event("d", {"id": 1}, None, 10)])
    tbl.apply_changes([mysql_event("d", customer(1, "e"), None, 10)])  # whole before row
    assert sorted(tbl.to_arrow()["id"].to_pylist()) == [0, 2]
    tbl.close()


ops = st.lists(
    st.tuples(st.sampled_from(["c", "u", "d", "r", "tombstone"]), st.integers(0, 6), st.integers(0, 9)),
    max_size=30,
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(steps=ops)
def test_a_batch_decodes_to_what_applying_each_event_in_order_leaves(steps):
    """Each key's last event decides: the same state as applying the events one by one."""
    model: dict[int, dict] = {}
    events = []
    for op, key, seed in steps:
        if op == "tombstone":
            events.append(None)
            continue
        row = {"id": key, "v": seed}
        if op == "d":
            events.append({"op": "d", "before": row, "after": None})
            model.pop(key, None)
        else:
            events.append({"op": op, "before": None, "after": row})
            model[key] = row
    changes = decode_debezium(events, ["id"])
    upserted = {r["id"]: r for r in changes.upserts}
    deleted = {r["id"] for r in changes.deletes}
    assert upserted == model
    assert not deleted & set(upserted)
    assert changes.events == len(steps)
