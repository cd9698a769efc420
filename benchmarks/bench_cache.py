"""Cache benchmark: lookups over a working set bigger than the cache budget, one run.

Layout: a small base and ``--generations`` flushed generations of ``--rows`` rows each (one
region). A round looks up a batch of keys in every generation, one generation after another,
as a service answering requests over the whole table does. Measured: the time of a round once
warm, and the loads (cache misses) per round,

* with a budget that holds the working set (what a round's lookups keep: generations' rows,
  key indexes, bloom filters), the anchor;
* with a budget of the working set divided by ``--over`` (1.5 by default): a plain LRU cache
  reloads every generation on every round there (each is evicted just before its turn); a
  scan-resistant one keeps most of them.

``ratio`` = over-budget round time / in-budget round time. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

import memwal_sql as mw

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])


def rows(keys: np.ndarray, tag: str) -> pa.Table:
    return pa.table({"k": keys, "v": [f"{tag}{k}" for k in keys.tolist()]}, schema=SCHEMA)


def rounds(uri: str, budget: int, generations: int, per: int, n: int) -> dict[str, float]:
    """Median round time (after the first round) and mean loads per round, at ``budget``."""
    reader = mw.open_table(uri, cache=budget)
    times, loads = [], []
    for _ in range(n):
        misses = reader.caches.stats().misses
        t0 = time.perf_counter()
        for g in range(generations):
            start = 1_000_000 + g * per
            reader.lookup(np.arange(start, start + per, max(1, per // 50)))
        times.append((time.perf_counter() - t0) * 1e3)
        loads.append(reader.caches.stats().misses - misses)
    working_set = reader.caches.nbytes
    reader.close()
    return {
        "round_ms": statistics.median(times[1:]),
        "loads_per_round": statistics.mean(loads[1:]),
        "cached_bytes": working_set,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--generations", type=int, default=20)
    ap.add_argument("--rows", type=int, default=5_000, help="rows per generation")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--over", type=float, default=1.5, help="working set / budget")
    ap.add_argument("--out", default="benchmarks/results/bench_cache.json")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="memwal-bench-cache-")
    try:
        tbl = mw.create_table(work, rows(np.arange(100), "b"), primary_key="k")
        for g in range(args.generations):
            start = 1_000_000 + g * args.rows
            tbl.upsert(rows(np.arange(start, start + args.rows), f"g{g}-"))
            tbl.flush()
        tbl.close()
        fits = rounds(work, 1 << 30, args.generations, args.rows, args.rounds)
        budget = int(fits["cached_bytes"] / args.over)
        over = rounds(work, budget, args.generations, args.rows, args.rounds)
        ratio = over["round_ms"] / fits["round_ms"]
        print(f"{'budget':<14}{'bytes':>14}{'round ms':>10}{'loads/round':>13}")
        for name, r, b in (("holds it", fits, fits["cached_bytes"]), ("1/over", over, budget)):
            print(f"{name:<14}{b:>14,}{r['round_ms']:>10.1f}{r['loads_per_round']:>13.1f}")
        print(f"over-budget round / in-budget round: {ratio:.2f}")
        write_results(
            args.out,
            {
                "ratios": {"over_budget_vs_in_budget_round": ratio},
                "in_budget": fits,
                "over_budget": {**over, "budget_bytes": budget},
                "layout": {"generations": args.generations, "rows": args.rows, "over": args.over},
            },
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
