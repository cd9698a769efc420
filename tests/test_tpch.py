"""The 22 TPC-H queries over MemWAL tables return the rows DataFusion returns over Parquet files
of the same latest rows (kept by a pyarrow model), with changes in live MemTables, after they
are flushed, and after they are merged."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import memwal_sql as mw

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
)
import tpch
from bench_tpch import parquet_session


@pytest.mark.slow
def test_tpch_queries_equal_parquet_at_every_stage(tmp_path):
    tpch.generate(str(tmp_path / "data"), 0.01)
    tables, latest = tpch.build(
        str(tmp_path / "mw"), str(tmp_path / "data"), max_memtable_rows=1 << 30
    )
    rng = np.random.default_rng(5)
    deleted: dict = {}
    for i in range(4):  # two rounds merged into the base, one in generations, one live
        tpch.change_round(tables, latest, rng, i, deleted, share=0.05)
        if i < 2:
            for t in tables.values():
                t.flush()
                t.maintain()  # merged and compacted
        elif i == 2:
            for t in tables.values():
                t.flush()
    latest.write_parquet(str(tmp_path / "latest"))
    want = tpch.run_queries(parquet_session(str(tmp_path / "latest")))
    for stage in ("live", "flushed", "merged"):
        if stage != "live":
            for t in tables.values():
                t.flush()
                if stage == "merged":
                    t.maintain()
        ctx = mw.connect(trusted=True)  # q15 creates a view
        for name, t in tables.items():
            ctx.register(name, t)
        got = tpch.run_queries(ctx)
        wrong = [n for n in want if not tpch.same_rows(got[n][0], want[n][0])]
        assert wrong == [], f"stage {stage}: queries {wrong} differ"
    for t in tables.values():
        t.close()
