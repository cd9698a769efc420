"""Model test over a faulty object store: whatever fails, nothing acknowledged is lost.

Every ObjectStore call may be slow, fail, lose its reply after landing, or list only part of
what is there. An operation that raises leaves its keys uncertain (old or new value, since a
lost reply means the write may have landed); one that returns is in the model for good. After
the sequence, faults stop, every region is claimed (replaying its WAL) and every read path must
agree with the model.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from memwal_sql.errors import MemWalError
from tests.faults import FaultyStore, InjectedFault

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.int64())])

keys = st.lists(st.integers(0, 15), min_size=1, max_size=6, unique=True)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), keys, st.integers(0, 1000)),
        st.tuples(st.just("delete"), keys, st.just(0)),
        st.tuples(
            st.sampled_from(["flush", "merge", "maintain", "read", "lookup", "reopen"]),
            st.just([]),
            st.just(0),
        ),
    ),
    min_size=1,
    max_size=20,
)


class UncertainModel:
    """Per key, the values it may have: one once a write of it was acknowledged, more after a
    write that failed (None: absent)."""

    def __init__(self) -> None:
        self.values: dict[int, set[int | None]] = {}

    def write(self, rows: dict[int, int | None], acknowledged: bool) -> None:
        for k, v in rows.items():
            self.values[k] = {v} if acknowledged else self.values.get(k, {None}) | {v}

    def check(self, table: pa.Table, keys: list[int] | None = None) -> None:
        got = dict(zip(table.column("id").to_pylist(), table.column("v").to_pylist()))
        assert len(got) == table.num_rows, "a key appears twice"
        for k in keys if keys is not None else set(self.values) | set(got):
            assert got.get(k) in self.values.get(k, {None}), (k, got.get(k), self.values.get(k))


def run_sequence(
    uri: str, sequence: list[tuple[str, list[int], int]], seed: int, bucketed: bool
) -> dict[str, int]:
    spec = mw.RegionSpec.bucket("id", 2) if bucketed else None
    tbl = mw.create_table(
        uri,
        SCHEMA,
        primary_key="id",
        region_spec=spec,
        writer_config=mw.WriterConfig(max_memtable_rows=5),
    )
    model = UncertainModel()
    with FaultyStore(seed, error=0.03, lost_reply=0.03, partial_list=0.1, latency=0.002) as faults:
        for op, ks, n in sequence:
            try:
                if op == "upsert":
                    rows = {k: n * 100 + k for k in ks}
                    try:
                        tbl.upsert(pa.table({"id": ks, "v": [rows[k] for k in ks]}, schema=SCHEMA))
                    except MemWalError:
                        model.write(rows, acknowledged=False)
                        raise
                    model.write(rows, acknowledged=True)
                elif op == "delete":
                    try:
                        tbl.delete(ks)
                    except MemWalError:
                        model.write(dict.fromkeys(ks), acknowledged=False)
                        raise
                    model.write(dict.fromkeys(ks), acknowledged=True)
                elif op == "flush":
                    tbl.flush()
                elif op == "merge":
                    tbl.merge()
                elif op == "maintain":
                    tbl.maintain()
                elif op == "read":
                    model.check(tbl.to_arrow())
                elif op == "lookup":
                    model.check(tbl.lookup(list(range(16))), list(range(16)))
                elif op == "reopen":
                    tbl.close()
                    tbl = mw.open_table(uri, writer_config=tbl.writer_config)
            except MemWalError:
                # A writer that failed stays failed: recover as a restarted process would.
                faults.enabled = False
                tbl = recovered(tbl, uri)
                faults.enabled = True
        faults.enabled = False
        tbl = recovered(tbl, uri)
        model.check(tbl.to_arrow())
        model.check(tbl.lookup(list(range(16))), list(range(16)))
        ctx = mw.connect()
        ctx.register("t", tbl)
        model.check(ctx.sql("SELECT * FROM t").to_arrow_table())
        tbl.merge()
        model.check(mw.open_table(uri).to_arrow())
        tbl.close()
        return faults.injected


def recovered(tbl: Any, uri: str) -> Any:
    """Crash the table's writers (what is not stored is gone, as with ``kill -9``: only the
    WAL holds acknowledged writes) and claim every region again, which replays the WAL."""
    for w in tbl.live_writers().values():
        with w._wal._mutex:
            w._wal._pending.clear()
            w._wal.error = w._wal.error or InjectedFault("crashed")  # stores nothing more
        w.release()
    tbl._writers.clear()
    fresh = mw.open_table(uri, writer_config=tbl.writer_config)
    for rid in fresh.regions():
        fresh.writer(region_id=rid).close()
    return fresh


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=ops, seed=st.integers(0, 2**32 - 1), bucketed=st.booleans())
# A claim's leap: a partial listing makes it leap over position 3, and the reply of its sentinel's
# put at 4 is lost. It used to fail there, leaving 3 empty below 4, and every later claim of the
# region refused ("an entry was lost").
@example(
    sequence=[
        ("upsert", [0], 0),
        ("upsert", [0], 0),
        ("read", [], 0),
        ("delete", [3], 0),
        ("delete", [0], 0),
        ("upsert", [3], 0),
    ],
    seed=1000001,
    bucketed=True,
)
def test_nothing_acknowledged_is_lost_over_a_faulty_store(sequence, seed, bucketed):
    with tempfile.TemporaryDirectory() as d:
        run_sequence(d, sequence, seed, bucketed)


def test_the_faulty_store_does_inject_every_kind_of_fault():
    sequence = [("upsert", [i % 16, (i + 5) % 16], i) for i in range(60)] + [("read", [], 0)]
    with tempfile.TemporaryDirectory() as d:
        injected = run_sequence(d, sequence, 7, True)
    assert all(n > 0 for n in injected.values()), injected
