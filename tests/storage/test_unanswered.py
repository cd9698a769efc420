"""An open table whose S3 endpoint stops answering: every operation fails typed, and soon."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import StorageUnavailableError
from tests.conftest import S3_BUCKET
from tests.faults import Tarpit

BOUND = 30.0  # seconds: the promise (the defaults give about 20 s)


def _rows(tenant: str, ids: list[int]) -> pa.Table:
    vectors = np.random.default_rng(len(ids)).random((len(ids), 4), dtype=np.float32)
    return pa.table(
        {
            "tenant": [tenant] * len(ids),
            "id": pa.array(ids, pa.int64()),
            "text": [f"word{i} common" for i in ids],
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 4),
        }
    )


def _run_all(ops: dict[str, Callable[[], Any]], wait: float) -> dict[str, tuple[float, Any]]:
    """Run every op on its own thread at once; each one's seconds and exception (or result)."""
    out: dict[str, tuple[float, Any]] = {}

    def run(name: str, op: Callable[[], Any]) -> None:
        t0 = time.monotonic()
        try:
            result: Any = op()
        except Exception as e:
            result = e
        out[name] = (time.monotonic() - t0, result)

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in ops.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + wait
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return out


@pytest.mark.slow
@pytest.mark.s3
def test_every_operation_of_an_open_table_fails_typed_when_the_endpoint_stops_answering(
    s3_server,
):
    pit = Tarpit(s3_server["aws_endpoint"])
    opts = {**s3_server, "aws_endpoint": pit.endpoint}
    uri = f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/t"
    try:
        base = mw.create_table(
            uri,
            _rows("base", list(range(64))),
            primary_key=["tenant", "id"],
            region_spec=mw.RegionSpec.identity("tenant"),
            storage_options=opts,
        )
        base.create_index("vec", "IVF_FLAT", num_partitions=1)
        base.create_index("text", "INVERTED")
        base.upsert(_rows("flushed", [1, 2]))
        base.flush()  # a generation for merge and maintenance to find
        base.close()
        # One table object per writer, each with a region of its own and a live writer
        # holding unflushed rows, so that no operation finds another's writer closed.
        writers = {}
        for tenant in ("upsert", "delete", "flush", "close", "claim"):
            writers[tenant] = mw.open_table(uri, opts)
            if tenant != "claim":
                writers[tenant].upsert(_rows(tenant, [1, 2]))
        reader = mw.open_table(uri, opts)
        assert reader.count_rows() == 64 + 2 + 4 * 2
        ctx = mw.connect()
        ctx.register("t", reader)
        query = np.zeros(4, np.float32)
        ops: dict[str, Callable[[], Any]] = {
            "to_arrow": reader.to_arrow,
            "scan": lambda: reader.scan().read_all(),
            "count_rows": reader.count_rows,
            "sql": lambda: ctx.sql("SELECT count(*) FROM t").to_arrow_table(),
            "lookup": lambda: reader.lookup(pa.table({"tenant": ["base"], "id": [1]})),
            "vector_search": lambda: reader.vector_search(query, k=3),
            "fts": lambda: reader.fts("common", k=3),
            "open_table": lambda: mw.open_table(uri, opts),
            "create_index": lambda: reader.create_index("id", "BTREE"),
            "upsert": lambda: writers["upsert"].upsert(_rows("upsert", [3])),
            "upsert claiming a region": lambda: writers["claim"].upsert(_rows("claim", [1])),
            "delete": lambda: writers["delete"].delete(pa.table({"tenant": ["delete"], "id": [1]})),
            "flush": writers["flush"].flush,
            "close": writers["close"].close,
            "merge": reader.merge,
            "catch_up_indexes": reader.catch_up_indexes,
            "compact": reader.compact,
            "build_region_snapshots": reader.build_region_snapshots,
            "gc": reader.gc,
            "maintain": reader.maintain,
            "verify": reader.verify,
        }
        pit.stop_answering()
        results = _run_all(ops, wait=BOUND + 15)
    finally:
        pit.close()  # whatever still waits on the endpoint fails at once
    unfinished = sorted(set(ops) - set(results))
    assert not unfinished, f"still running after {BOUND + 15:.0f} s: {unfinished}"
    for name, (seconds, outcome) in sorted(results.items()):
        assert isinstance(outcome, StorageUnavailableError), (name, repr(outcome))
        assert "answer" in str(outcome), (name, str(outcome))
        assert seconds < BOUND, (name, seconds)
