"""WAL tail benchmark: a reader's lookup cost as another writer's unflushed WAL grows, one run.

A writer (one table object) appends ``N`` single-row WAL entries to a region and never
flushes; a reader (a second table object, no writer of its own: it replays the region's WAL
tail) looks one key up ``--lookups`` times, the writer appending one more entry before each
lookup when ``interleaved``. The reader keeps what it replayed and reads only the entries put
since, so its cost should stay flat in ``N``: the anchor is its own cost at the smallest ``N``
(``ratio`` = median per lookup at ``N`` / at the smallest ``N``). The first lookup replays the
whole tail and is shown apart.

Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

import memwal_sql as mw

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def run(n: int, lookups: int, interleaved: bool) -> dict[str, float]:
    """First and median per-lookup ms of a reader over a tail of ``n`` entries."""
    work = tempfile.mkdtemp(prefix="memwal-bench-tail-")
    try:
        base = pa.table({"id": list(range(1000)), "v": ["b"] * 1000}, schema=SCHEMA)
        tbl = mw.create_table(work, base, primary_key="id")
        writer = tbl.writer()
        for i in range(n):
            writer.upsert(pa.table({"id": [i % 2000], "v": [f"w{i}"]}, schema=SCHEMA))
        reader = mw.open_table(work)
        t0 = time.perf_counter()
        got = reader.lookup([7]).column("v").to_pylist()
        first_ms = (time.perf_counter() - t0) * 1e3
        assert got == [f"w{max(i for i in range(n) if i % 2000 == 7)}"], got
        times = []
        for j in range(lookups):
            if interleaved:
                writer.upsert(pa.table({"id": [1999], "v": [f"x{j}"]}, schema=SCHEMA))
            t0 = time.perf_counter()
            reader.lookup([7])
            times.append((time.perf_counter() - t0) * 1e3)
        writer.release()
        reader.close()
        tbl.close()
        return {"first_ms": first_ms, "median_ms": statistics.median(times)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--entries", type=int, nargs="*", default=[100, 1000, 4000])
    ap.add_argument("--lookups", type=int, default=50)
    ap.add_argument("--out", default="benchmarks/results/bench_wal_tail.json")
    args = ap.parse_args()
    rows = []
    print(f"{'entries':>8}{'mode':>13}{'first ms':>10}{'median ms':>11}{'ratio':>7}")
    for interleaved in (False, True):
        mode = "interleaved" if interleaved else "still"
        anchor = None
        for n in args.entries:
            r = run(n, args.lookups, interleaved)
            anchor = anchor or r["median_ms"]
            row = {"entries": n, "mode": mode, **r, "ratio": r["median_ms"] / anchor}
            rows.append(row)
            print(
                f"{n:>8,}{mode:>13}{r['first_ms']:>10.1f}{r['median_ms']:>11.2f}"
                f"{row['ratio']:>7.2f}"
            )
    write_results(args.out, {"results": rows})


if __name__ == "__main__":
    main()
