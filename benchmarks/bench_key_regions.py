"""What keeping one region per key costs a table whose region spec reads a non-key column.

A region spec on key columns keeps each key in one region for free. A table created with
``allow_non_key_region_spec=True`` (here ``identity(tenant)``, the tenant a function of the id)
pays for two checks instead: a routed write probes every region for its keys first (MemTables,
WAL tails, generations behind their bloom filters), and a scan checks every region's unmerged
keys (kept while nothing changes; after a write, the MemTables' keys are checked again). Lookups
and searches check the keys they probe, at no measurable cost.

The anchor is the same table, the same rows, split into as many regions by ``bucket(id, 4)``,
a spec on the key. Both tables: ``--base-rows`` rows, then ``--upserts`` upserts (30% updates)
in batches of 10,000, MemTables of ``--memtable-rows`` rows, so that each region has flushed
generations and a live MemTable. Measured: a durable one-row upsert, a 10,000-row upsert, a full
scan, the first scan after a one-row write, and a one-key lookup (median of ``--repeats``).
Prints a table and writes JSON (``--out``).

Usage: ``python benchmarks/bench_key_regions.py [--base-rows 500000] [--upserts 200000]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from results_file import write_results

import memwal_sql as mw

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("tenant", pa.int32(), False),
        pa.field("score", pa.float64()),
    ]
)


def rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    return pa.table(
        {"id": ids, "tenant": (ids % 4).astype(np.int32), "score": rng.random(len(ids))},
        schema=SCHEMA,
    )


def build(uri: str, spec: mw.RegionSpec, base_rows: int, upserts: int, memtable_rows: int):
    rng = np.random.default_rng(7)
    tbl = mw.create_table(
        uri,
        rows(np.arange(base_rows, dtype=np.int64), rng),
        primary_key="id",
        region_spec=spec,
        allow_non_key_region_spec=True,
        writer_config=mw.WriterConfig(max_memtable_rows=memtable_rows),
    )
    next_id = base_rows
    for done in range(0, upserts, 10_000):
        n = min(10_000, upserts - done)
        fresh = np.arange(next_id, next_id + n - n * 3 // 10, dtype=np.int64)
        ids = np.unique(np.concatenate([fresh, rng.integers(0, next_id, n * 3 // 10)]))
        next_id += len(fresh)
        tbl.upsert(rows(ids, rng))
    return tbl


def median_ms(fn: Callable[[], object], repeats: int, before: Callable[[], object] | None = None):
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(tbl: mw.MemWalTable, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(3)
    one = rows(np.array([5], dtype=np.int64), rng)
    many = rows(np.arange(0, 30_000, 3, dtype=np.int64), rng)
    return {
        "upsert 1 row (durable)": median_ms(lambda: tbl.upsert(one), repeats),
        "upsert 10,000 rows": median_ms(lambda: tbl.upsert(many), repeats),
        "full scan": median_ms(lambda: tbl.to_arrow(["id"]), repeats),
        "full scan after a write": median_ms(
            lambda: tbl.to_arrow(["id"]), repeats, before=lambda: tbl.upsert(one)
        ),
        "lookup 1 key": median_ms(lambda: tbl.lookup([12_345]), repeats),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base-rows", type=int, default=500_000)
    ap.add_argument("--upserts", type=int, default=200_000)
    ap.add_argument("--memtable-rows", type=int, default=40_000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="benchmarks/results/bench_key_regions.json")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="memwal-bench-key-regions-")
    try:
        results = {}
        for name, spec in (
            ("identity(tenant), checked", mw.RegionSpec.identity("tenant")),
            ("bucket(id, 4), the anchor", mw.RegionSpec.bucket("id", 4)),
        ):
            tbl = build(
                f"{work}/{len(results)}", spec, args.base_rows, args.upserts, args.memtable_rows
            )
            results[name] = measure(tbl, args.repeats)
            tbl.close()
        checked, anchor = results.values()
        print(
            f"{args.base_rows:,} base rows + {args.upserts:,} upserts, 4 regions, MemTables of "
            f"{args.memtable_rows:,} rows; median of {args.repeats}\n"
        )
        print(f"{'operation':<26} {'checked':>10} {'anchor':>10} {'ratio':>7}")
        for op in checked:
            print(
                f"{op:<26} {checked[op]:>8.2f}ms {anchor[op]:>8.2f}ms "
                f"{checked[op] / anchor[op]:>6.2f}x"
            )
        write_results(
            args.out,
            {
                "args": vars(args),
                "ms": results,
                "ratios": {op: checked[op] / anchor[op] for op in checked},
            },
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
