"""The library logs its lifecycle on the ``memwal_sql`` logger and prints nothing."""

from __future__ import annotations

import logging
from datetime import timedelta

import pyarrow as pa

import memwal_sql as mw

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def test_claims_flushes_merges_and_gc_are_logged_and_nothing_is_printed(tmp_path, caplog, capfd):
    caplog.set_level(logging.INFO, logger="memwal_sql")
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    tbl.upsert(pa.table({"id": [1, 2], "v": ["a", "b"]}, schema=SCHEMA))
    tbl.flush()
    tbl.merge()
    tbl.catch_up_indexes()
    tbl.gc(base_versions_older_than=timedelta(0))
    tbl.close()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("memwal_sql")]
    for expected in ("claimed region", "flushed generation 1 (2 rows)", "merge of", "gc of"):
        assert any(expected in m for m in messages), (expected, messages)
    assert "deleted 1 generation(s)" in next(m for m in messages if "gc of" in m)
    out = capfd.readouterr().out
    assert out == ""
