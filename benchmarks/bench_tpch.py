"""TPC-H benchmark: the 22 queries over MemWAL tables against DataFusion over Parquet files of
the same latest rows, at four stages of the LSM tree.

The eight tables are generated with ``tpchgen-cli`` (``--scale``, 0.1 by default) and loaded as
MemWAL tables (orders and lineitem bucketed into four regions). Change rounds on orders and
lineitem (updates that move rows in and out of the queries' ranges, deletes of whole orders,
re-inserts) are spread over the base table (merged by maintenance passes, which compact it once
enough has gathered), flushed generations and live MemTables. At each stage (``live``:
MemTables hold the last round; ``flushed``: everything in generations; ``merged``: everything
in the base table, after a maintenance pass; ``compacted``: then every deletion vector removed
by ``tbl.compact``) every query runs through ``mw.connect(trusted=True)`` (q15 creates a
view) and through a plain DataFusion session over Parquet files of the latest rows (kept by a
pyarrow model that never reads the MemWAL tables); results are compared, each query
is timed (median of ``--runs``), and the total ratio is printed and written as JSON.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
from datafusion import SessionContext

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tpch
from results_file import write_results

import memwal_sql as mw


def median_ms(runs: int):
    def timer(fn) -> float:
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times))

    return timer


def parquet_session(directory: str) -> SessionContext:
    ctx = SessionContext()
    for name in tpch.KEYS:
        ctx.register_parquet(name, f"{directory}/{name}.parquet")
    return ctx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=4, help="change rounds (at least 3)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--stages", default="live,flushed,merged,compacted")
    ap.add_argument(
        "--data-storage-version",
        default=None,
        help="Lance file format of the MemWAL tables (default: Lance's, 2.2)",
    )
    ap.add_argument("--out", default="benchmarks/results/bench_tpch.json")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="memwal-bench-tpch-")
    try:
        tpch.generate(f"{work}/data", args.scale)
        tables, latest = tpch.build(
            f"{work}/mw",
            f"{work}/data",
            max_memtable_rows=1 << 30,
            data_storage_version=args.data_storage_version,
        )
        rng = np.random.default_rng(3)
        deleted: dict = {}
        for i in range(args.rounds):
            tpch.change_round(tables, latest, rng, i, deleted)
            if i < args.rounds - 2:  # the first rounds end up in the base table
                for t in tables.values():
                    t.flush()
                    t.maintain()
            elif i == args.rounds - 2:  # the next stays in generations
                for t in tables.values():
                    t.flush()
            # the last stays in live MemTables
        latest.write_parquet(f"{work}/latest")
        reference = parquet_session(f"{work}/latest")
        stages, all_ok = {}, True
        for stage in args.stages.split(","):
            if stage == "flushed":
                for t in tables.values():
                    t.flush()
            elif stage == "merged":
                for t in tables.values():
                    t.flush()
                    t.maintain()
            elif stage == "compacted":
                for t in tables.values():
                    t.compact(deletion_threshold=0.0)
            ctx = mw.connect(trusted=True)  # q15 creates a view
            for name, t in tables.items():
                ctx.register(name, t)
            ours = tpch.run_queries(ctx, timer=median_ms(args.runs))
            theirs = tpch.run_queries(reference, timer=median_ms(args.runs))
            rows = []
            for n in sorted(ours):
                same = tpch.same_rows(ours[n][0], theirs[n][0])
                all_ok &= same
                rows.append(
                    {
                        "query": n,
                        "memwal_ms": ours[n][1],
                        "parquet_ms": theirs[n][1],
                        "ratio": ours[n][1] / theirs[n][1],
                        "same": same,
                    }
                )
            total_ours = sum(r["memwal_ms"] for r in rows)
            total_theirs = sum(r["parquet_ms"] for r in rows)
            stages[stage] = {
                "queries": rows,
                "memwal_ms": total_ours,
                "parquet_ms": total_theirs,
                "ratio": total_ours / total_theirs,
            }
            print(
                f"\nstage {stage}: {'query':>5}{'memwal ms':>11}{'parquet ms':>12}{'ratio':>8}"
                f"{'same':>6}"
            )
            for r in rows:
                print(
                    f"{'':>13}{r['query']:>5}{r['memwal_ms']:>11.1f}{r['parquet_ms']:>12.1f}"
                    f"{r['ratio']:>8.2f}{'yes' if r['same'] else 'NO':>6}"
                )
            print(
                f"{'':>13}total{total_ours:>11.1f}{total_theirs:>12.1f}"
                f"{total_ours / total_theirs:>8.2f}  (worst query "
                f"{max(r['ratio'] for r in rows):.2f}x)"
            )
        for t in tables.values():
            t.close()
        write_results(
            args.out,
            {
                "scale": args.scale,
                "rounds": args.rounds,
                "data_storage_version": args.data_storage_version or "default",
                "stages": stages,
                "all_results_equal": all_ok,
            },
        )
        print(f"all results equal: {all_ok}")
        if not all_ok:
            sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
