"""Property test: any sequence of writes, flushes, closes, crashes and reopenings leaves exactly
the model's latest rows (read back through Lance 14's LsmScanner)."""

from __future__ import annotations

import tempfile
import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memwal_sql as mw
from tests.conftest import S3_BUCKET
from tests.lsm import Model, apply_op, lance_latest_rows

SCHEMA = pa.schema(
    [pa.field("k", pa.string(), False), pa.field("n", pa.int32(), False), pa.field("v", pa.int64())]
)

keys = st.lists(st.sampled_from([f"k{i}" for i in range(12)]), min_size=1, max_size=8)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), keys, st.integers(0, 1000)),
        st.tuples(st.just("delete"), keys, st.just(0)),
        st.tuples(st.sampled_from(["flush", "close", "crash", "reopen"]), st.just([]), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


def batch(ks, seed):
    return pa.table(
        {
            "k": ks,
            "n": [len(k) for k in ks],
            "v": [None if (seed + i) % 4 == 0 else seed * 100 + i for i in range(len(ks))],
        },
        schema=SCHEMA,
    )


def check_sequence(uri, options, ops, bucketed, durable):
    spec = mw.RegionSpec.bucket("k", 3) if bucketed else None
    tbl = mw.create_table(
        uri,
        SCHEMA,
        primary_key="k",
        region_spec=spec,
        storage_options=options,
        writer_config=mw.WriterConfig(durable_write=durable, max_memtable_rows=7),
    )
    model = Model(["k"])
    for op, ks, seed in ops:
        tbl = apply_op(tbl, model, op, ks, seed, uri, batch)
    tbl.close()
    # Writers abandoned by "crash" left WAL tails: a new writer per region replays them.
    for rid in tbl.regions():
        tbl.writer(region_id=rid).close()
    assert lance_latest_rows(uri, ["k"], options) == model.table(SCHEMA)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, bucketed=st.booleans(), durable=st.booleans())
def test_random_sequences_match_the_model(ops, bucketed, durable):
    with tempfile.TemporaryDirectory() as d:
        check_sequence(d, None, ops, bucketed, durable)


@pytest.mark.s3
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=ops, bucketed=st.booleans(), durable=st.booleans())
def test_random_sequences_match_the_model_on_s3(s3_server, ops, bucketed, durable):
    check_sequence(f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/t", s3_server, ops, bucketed, durable)
