"""Memory benchmark: peak RSS of a full scan of a big MemWAL table, streamed.

Builds a table of ``--base-rows`` rows (10M by default: an id, a tenant, a name, a score and a
timestamp) and ``--upserts`` upserts (a third of them updates) flushed into generations over 4
regions, then, in a fresh process for each, streams every latest row through ``tbl.scan()`` and
through SQL (``SELECT tenant, count(*), sum(score) ... GROUP BY tenant``) and reports the peak
resident set size (``VmHWM``) against the same process's peak before the scan, and rows/s.

Then, in a fresh process for each of two region specs (a bucket of the key, and an identity
of a non-key column, whose writes check that no key changes region), one upsert of
``--one-upsert`` rows (5M by default, about 150 MB of Arrow) into an empty table: the peak
resident set it adds (``VmHWM``, reset before the call) against the rows' Arrow size, and the
first ``count_rows`` after it, live, against the same on the rows once flushed (a fresh open;
the read modules are imported before the upsert, so neither read pays the import).

Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
from results_file import write_results

SCAN = r"""
import sys, time, json
import memwal_sql as mw


def peak_kib():  # VmHWM: this process's peak RSS (ru_maxrss would carry the parent's over)
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1])


imported = peak_kib()
tbl = mw.open_table(sys.argv[1])
before = peak_kib()
t0 = time.perf_counter()
if sys.argv[2] == "scan":
    rows = sum(b.num_rows for b in tbl.scan())
else:
    ctx = mw.connect(); ctx.register("t", tbl)
    rows = sum(ctx.sql("SELECT tenant, count(*) AS n, sum(score) AS s FROM t GROUP BY tenant")
               .to_arrow_table().column("n").to_pylist())
seconds = time.perf_counter() - t0
peak = peak_kib()
print(json.dumps({"rows": rows, "seconds": seconds, "rss_imported_kib": imported,
                  "rss_before_kib": before,
                  "peak_rss_kib": peak}))
"""


UPSERT = r"""
import json, sys, time
import numpy as np
import pyarrow as pa
import memwal_sql as mw
import memwal_sql.reads  # imported before the timed first read: not the read's work
import memwal_sql.table  # imported before the peak is read: not the upsert's memory


def peak_kib():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1])


def reset_peak():  # VmHWM starts again from the current RSS
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


n, spec = int(sys.argv[2]), sys.argv[3]
schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("tenant", pa.int32(), False),
                    pa.field("name", pa.string()), pa.field("score", pa.float64()),
                    pa.field("ts", pa.int64())])
kw = (dict(region_spec=mw.RegionSpec.bucket("id", 4)) if spec == "bucket" else
      dict(region_spec=mw.RegionSpec.identity("tenant"), allow_non_key_region_spec=True))
tbl = mw.create_table(sys.argv[1], schema, primary_key="id", **kw)
ids = np.arange(n, dtype=np.int64)
data = pa.table({"id": ids, "tenant": (ids % 4).astype(np.int32),
                 "name": pa.array(np.char.add("name-", (ids % 5000).astype(str))),
                 "score": np.random.default_rng(1).random(n), "ts": np.zeros(n, np.int64)},
                schema=schema)
tbl.upsert(data.slice(0, 10))
reset_peak()
before = peak_kib()
t0 = time.perf_counter()
tbl.upsert(data)
seconds = time.perf_counter() - t0
peak = peak_kib()
t0 = time.perf_counter()
assert tbl.count_rows() == n
count_live = time.perf_counter() - t0
tbl.flush()
tbl.close()
tbl = mw.open_table(sys.argv[1])
t0 = time.perf_counter()
assert tbl.count_rows() == n
count_flushed = time.perf_counter() - t0
print(json.dumps({"rows": n, "arrow_bytes": data.nbytes, "seconds": seconds,
                  "rss_before_kib": before, "peak_rss_kib": peak,
                  "peak_over_arrow": (peak - before) * 1024 / data.nbytes,
                  "first_count_live_s": count_live, "first_count_flushed_s": count_flushed}))
"""


def build(uri: str, base_rows: int, upserts: int) -> None:
    import lance

    import memwal_sql as mw

    rng = np.random.default_rng(1)
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("tenant", pa.int32(), False),
            pa.field("name", pa.string()),
            pa.field("score", pa.float64()),
            pa.field("ts", pa.int64()),
        ]
    )

    def rows(ids: np.ndarray, version: int) -> pa.Table:
        return pa.table(
            {
                "id": ids,
                "tenant": (ids % 4).astype(np.int32),
                "name": pa.array(np.char.add("name-", (ids % 5000).astype(str))),
                "score": rng.random(len(ids)),
                "ts": np.full(len(ids), version, dtype=np.int64),
            },
            schema=schema,
        )

    def batches():  # the base is written as a stream: it never sits in memory whole
        for start in range(0, base_rows, 1_000_000):
            yield from rows(
                np.arange(start, min(base_rows, start + 1_000_000), dtype=np.int64), 0
            ).to_batches()

    lance.write_dataset(
        pa.RecordBatchReader.from_batches(schema, batches()), uri, max_rows_per_file=2_000_000
    )
    tbl = mw.create_table(
        uri,
        None,
        primary_key="id",  # MemWAL on the Lance table just written
        region_spec=mw.RegionSpec.identity("tenant"),
        allow_non_key_region_spec=True,  # a key's tenant never changes: it is id % 4
        writer_config=mw.WriterConfig(durable_write=False, max_memtable_rows=200_000),
    )
    done, version = 0, 1
    while done < upserts:
        n = min(100_000, upserts - done)
        ids = np.unique(
            np.concatenate(
                [
                    rng.integers(0, base_rows, n // 3),
                    np.arange(base_rows + done, base_rows + done + n - n // 3),
                ]
            )
        ).astype(np.int64)
        tbl.upsert(rows(ids, version))
        done += n
        version += 1
    tbl.close()  # everything in generations: the scan merges base + generations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base-rows", type=int, default=10_000_000)
    ap.add_argument("--upserts", type=int, default=1_000_000)
    ap.add_argument(
        "--one-upsert", type=int, default=5_000_000, help="rows of the single upsert measured"
    )
    ap.add_argument("--only-upsert", action="store_true", help="measure the one upsert only")
    ap.add_argument("--out", default="benchmarks/results/bench_memory.json")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="memwal-bench-memory-")
    try:
        results = []
        if not args.only_upsert:
            t0 = time.perf_counter()
            build(f"{work}/t", args.base_rows, args.upserts)
            print(
                f"built {args.base_rows:,} base rows + {args.upserts:,} upserts in "
                f"{time.perf_counter() - t0:.0f} s"
            )
        for kind in () if args.only_upsert else ("scan", "sql"):
            out = (
                subprocess.run(
                    [sys.executable, "-c", SCAN, f"{work}/t", kind],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            r = json.loads(out)
            r["kind"] = kind
            results.append(r)
        if results:
            print(f"\n{'read':<28}{'rows':>13}{'rows/s':>14}{'RSS before':>12}{'peak RSS':>11}")
        for r in results:
            print(
                f"{'tbl.scan() streamed' if r['kind'] == 'scan' else 'SQL GROUP BY':<28}"
                f"{r['rows']:>13,}{r['rows'] / r['seconds']:>14,.0f}"
                f"{r['rss_before_kib'] / 1024:>10.0f}MB{r['peak_rss_kib'] / 1024:>9.0f}MB"
            )
        upserts = []
        for spec in ("bucket", "identity"):  # a key-routed spec, and one on a non-key column
            out = subprocess.run(
                [sys.executable, "-c", UPSERT, f"{work}/u_{spec}", str(args.one_upsert), spec],
                check=True,
                capture_output=True,
                text=True,
            )
            r = {"region_spec": spec, **json.loads(out.stdout.strip().splitlines()[-1])}
            upserts.append(r)
        print(
            f"\n{'one upsert of':<16}{'rows':>11}{'Arrow MB':>10}{'peak - before':>15}"
            f"{'x Arrow':>9}{'count live':>12}{'flushed':>9}"
        )
        for r in upserts:
            print(
                f"{r['region_spec'] + ' spec':<16}{r['rows']:>11,}{r['arrow_bytes'] / 2**20:>10.0f}"
                f"{(r['peak_rss_kib'] - r['rss_before_kib']) / 1024:>13.0f}MB"
                f"{r['peak_over_arrow']:>9.2f}{r['first_count_live_s']:>11.2f}s"
                f"{r['first_count_flushed_s']:>8.2f}s"
            )
        write_results(
            args.out,
            {
                "base_rows": args.base_rows,
                "upserts": args.upserts,
                "results": results,
                "one_upsert": upserts,
            },
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
