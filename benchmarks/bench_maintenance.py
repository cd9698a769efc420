"""Maintenance benchmark: merge throughput and what maintenance does to read latency.

On the layout of ``bench_read.py`` (flushed generations in every region, MemTables closed so
everything is flushed), in one run:

* merge throughput: ``tbl.merge()`` (one merge-insert commit per generation, tombstones
  included, progress recorded atomically) in rows/s, against plain Lance ``merge_insert`` of the
  same live rows in the same number of commits (no deletes, no progress);
* the conditional merge of a table with a sequence column (the same writes, ``ts`` the
  sequence): ``tbl.merge()`` there updates a base row only if the new one's sequence is not
  older, and records merged deletes first; against the plain merge, and Lance's
  ``merge_insert`` with and without ``when_matched_update_all(condition=...)``;
* read latency on the table with many generations, after the merge while the base table's key
  index still lags (reads of a key filter take the indexed read plan through the merged
  generations), and after index catch-up, region snapshots and GC: a full scan, a filtered
  scan, a key-range scan and a point lookup. The index catch-up is timed too.

Prints a table and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta

import lance
import pyarrow.compute as pc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_read import SCHEMA, build
from results_file import write_results

from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.storage import layout


def timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def small_cache(tbl, fn, max_bytes: int = 16 << 20):
    saved = tbl.caches.max_bytes
    tbl.caches.max_bytes = max_bytes
    try:
        return fn()
    finally:
        tbl.caches.max_bytes = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base-rows", type=int, default=300_000)
    ap.add_argument("--upserts", type=int, default=300_000)
    ap.add_argument("--memtable-rows", type=int, default=20_000)
    ap.add_argument("--out", default="benchmarks/results/bench_maintenance.json")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="memwal-bench-maint-")
    try:
        tbl = build(f"{work}/t", args.base_rows, args.upserts, args.memtable_rows)
        tbl.close()
        gens = []
        for rid in tbl.regions():
            for g in RegionManifestStore(tbl.store, rid).latest().flushed_generations:
                gens.append(tbl.store.uri_for(f"{layout.region_dir(rid)}/{g.path}"))
        live_batches = []
        for uri in gens:
            t = lance.dataset(uri).to_table()
            live_batches.append(
                t.filter(pc.invert(t.column("_tombstone"))).select(SCHEMA.names).cast(SCHEMA)
            )
        merged_rows = sum(lance.dataset(u).count_rows() for u in gens)
        key = int(live_batches[-1].column("id")[0].as_py())
        many = list(range(0, 2 * args.base_rows, max(1, 2 * args.base_rows // 1000)))

        reads = {
            "full scan": lambda: tbl.to_arrow(),
            "filtered scan": lambda: tbl.to_arrow(filter="score > 0.99"),
            "key-range scan": lambda: tbl.to_arrow(filter=f"id >= {key} AND id < {key + 500}"),
            "point lookup": lambda: tbl.lookup([key]),
            "1,000 lookups": lambda: tbl.lookup(many),
            # A lookup cache too small for the base key index: lookups probe the btree, and
            # while it lags, the merged generations (the indexed read plan).
            "1,000 lookups, btree": lambda: small_cache(tbl, lambda: tbl.lookup(many)),
        }
        before = {name: timed(fn) for name, fn in reads.items()}

        # The anchor: plain merge_insert of the same live rows, one commit per generation.
        plain_uri = f"{work}/plain"
        lance.write_dataset(lance.dataset(tbl.uri).to_table(columns=SCHEMA.names), plain_uri)
        t0 = time.perf_counter()
        for b in live_batches:
            (
                lance.dataset(plain_uri)
                .merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(b)
            )
        plain_s = time.perf_counter() - t0
        lance.write_dataset(
            lance.dataset(tbl.uri).to_table(columns=SCHEMA.names), plain_uri, mode="overwrite"
        )
        t0 = time.perf_counter()
        for b in live_batches:
            (
                lance.dataset(plain_uri)
                .merge_insert("id")
                .when_matched_update_all("source.ts >= target.ts")
                .when_not_matched_insert_all()
                .execute(b)
            )
        plain_conditional_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        result = tbl.merge()
        merge_s = time.perf_counter() - t0
        sequenced = build(
            f"{work}/seq", args.base_rows, args.upserts, args.memtable_rows, sequence_column="ts"
        )
        sequenced.close()
        t0 = time.perf_counter()
        sequenced.merge()
        sequenced_merge_s = time.perf_counter() - t0
        lagging = {name: timed(fn) for name, fn in reads.items()}
        t0 = time.perf_counter()
        tbl.catch_up_indexes()
        index_s = time.perf_counter() - t0
        tbl.build_region_snapshots()
        gc = tbl.gc(base_versions_older_than=timedelta(0))
        after = {name: timed(fn) for name, fn in reads.items()}

        print(
            f"\n{len(gens)} generations, {merged_rows:,} generation rows "
            f"({result.rows_deleted:,} tombstones)"
        )
        print(f"{'merge':<28}{'seconds':>10}{'rows/s':>14}")
        print(f"{'memwal merge (atomic)':<28}{merge_s:>10.2f}{merged_rows / merge_s:>14,.0f}")
        print(f"{'plain lance merge_insert':<28}{plain_s:>10.2f}{merged_rows / plain_s:>14,.0f}")
        print(f"ratio (plain time / memwal time): {plain_s / merge_s:.2f}")
        print(
            f"{'memwal merge, sequence col':<28}{sequenced_merge_s:>10.2f}"
            f"{merged_rows / sequenced_merge_s:>14,.0f}"
        )
        print(
            f"{'lance merge_insert, cond.':<28}{plain_conditional_s:>10.2f}"
            f"{merged_rows / plain_conditional_s:>14,.0f}"
        )
        print(
            f"conditional / plain time: memwal {sequenced_merge_s / merge_s:.2f}, "
            f"lance merge_insert {plain_conditional_s / plain_s:.2f}"
        )
        print(f"index catch-up (optimize_indices): {index_s:.2f} s")
        print(f"gc deleted {gc.objects} objects")
        print(f"\n{'read':<22}{'before ms':>12}{'index lags':>12}{'after ms':>12}{'speed-up':>10}")
        for name in reads:
            print(
                f"{name:<22}{before[name] * 1e3:>12.1f}{lagging[name] * 1e3:>12.1f}"
                f"{after[name] * 1e3:>12.1f}{before[name] / after[name]:>10.2f}"
            )
        write_results(
            args.out,
            {
                "generations": len(gens),
                "rows": merged_rows,
                "merge_s": merge_s,
                "plain_merge_insert_s": plain_s,
                "sequenced_merge_s": sequenced_merge_s,
                "plain_conditional_merge_insert_s": plain_conditional_s,
                "index_catch_up_s": index_s,
                "read_before_s": before,
                "read_index_lagging_s": lagging,
                "read_after_s": after,
            },
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
