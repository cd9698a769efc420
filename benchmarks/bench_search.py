"""Vector-search benchmark: memwal-sql's search over live data against Lance 14, one run.

Layout: a base table of ``--base-rows`` 32-dimensional vectors with an IVF_PQ index (16
sub-vectors: its plain recall is low without refinement); then ``--upserts`` rows (a third of
them updates that move existing keys' vectors, 1% deletes) streamed into 4 regions; the first
half is flushed and put in the base by a maintenance pass (merge, index catch-up, compaction),
the rest stays as flushed generations, and a live MemTable holds the last ``--memtable-rows``.

Measured over ``--queries`` random queries, k = 10:

* memwal-sql ``tbl.vector_search`` (base ANN with its default refine, generations and the
  MemTable exactly, stale rows dropped): p50/p99 latency, recall@10 against brute force over the
  latest rows;
* Lance 14's ``LsmVectorSearchPlanner`` on the same files (it sees base + generations, not our
  live MemTable: its recall is against brute force over what it sees);
* plain Lance ANN with ``refine_factor=5`` on a fully merged copy of the latest rows, same index
  parameters.

Full text: the ten `QUERIES` over English sentences, memwal-sql `tbl.fts` (BM25 over the latest
corpus) against Lance FTS on the merged copy: p50/p99 latency, and whether ids and scores agree.

Prints tables and writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa
from lance.mem_wal import LsmVectorSearchPlanner
from results_file import write_results

import memwal_sql as mw
from memwal_sql.interop import lance_shard_snapshots
from memwal_sql.structures.vectors import distances, vectors_of

DIM = 32
INDEX = {"num_partitions": 64, "num_sub_vectors": 16}


def sentences() -> list[str]:
    import pydoc_data.topics as topics  # English prose that ships with Python

    text = " ".join(topics.topics.values())
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 20 < len(s.strip()) < 400]


SENTENCES = sentences()
QUERIES = [
    "function return value",
    "class attribute",
    "exception raised",
    "loop iterator",
    "string format",
    "the method is called",
    "module import",
    "default argument",
    "keyword only parameters",
    "integer division",
]


def rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    vecs = rng.normal(size=(len(ids), DIM)).astype(np.float32)
    pick = rng.integers(0, len(SENTENCES), (len(ids), 2))
    text = [f"{SENTENCES[a]} {SENTENCES[b]}" for a, b in pick]
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "tenant": (ids % 4).astype(np.int32),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), DIM),
            "text": text,
        }
    )


def build(uri: str, base_rows: int, upserts: int, memtable_rows: int) -> mw.MemWalTable:
    rng = np.random.default_rng(1)
    tbl = mw.create_table(
        uri,
        rows(np.arange(base_rows), rng),
        primary_key="id",
        region_spec=mw.RegionSpec.identity("tenant"),
        allow_non_key_region_spec=True,  # a key's tenant never changes: it is id % 4
        writer_config=mw.WriterConfig(durable_write=False, max_memtable_rows=memtable_rows),
    )
    tbl.create_index("vec", "IVF_PQ", **INDEX)
    tbl.create_index("text", "INVERTED")
    next_id, done = base_rows, 0
    while done < upserts:
        n = min(10_000, upserts - done)
        ids = np.unique(
            np.concatenate(
                [np.arange(next_id, next_id + n - n // 3), rng.integers(0, next_id, n // 3)]
            )
        )
        next_id += n - n // 3
        tbl.upsert(rows(ids, rng))
        dels = np.unique(rng.integers(0, next_id, n // 100)).astype(np.int64)
        tbl.delete(pa.table({"id": dels, "tenant": (dels % 4).astype(np.int32)}))
        done += n
        if done == upserts // 2:
            tbl.flush()
            # What a maintenance pass does: merge, index catch-up, and (a base fragment now
            # has over 5% of its rows deleted) compaction, which Lance's ANN search needs: it
            # searched a base with a deletion vector 2x slower.
            tbl.maintain()
    return tbl


def truth(latest: pa.Table, q: np.ndarray, k: int) -> set[int]:
    m, _ = vectors_of(latest.column("vec"))
    d = distances(m, q, "l2")
    return set(latest.column("id").to_numpy()[np.argpartition(d, k)[:k]].tolist())


def same_ranking(ours: pa.Table, theirs: pa.Table) -> bool:
    """The same scores in the same order (relative error below 1e-4) and the same ids. Equal
    scores tie, and a tie is ordered by key here, by row address in Lance: a tie group is
    compared as a set, and the last one, which ``k`` cuts, only by its size."""
    a, b = ours.column("_score").to_numpy(), theirs.column("_score").to_numpy()
    if len(a) != len(b) or not np.all(np.abs(a - b) <= 1e-4 * np.abs(b)):
        return False
    ids_a, ids_b = ours.column("id").to_pylist(), theirs.column("id").to_pylist()
    start = 0
    for end in range(1, len(b) + 1):
        if end == len(b) or abs(b[end] - b[start]) > 1e-5 * abs(b[start]):
            if end < len(b) and set(ids_a[start:end]) != set(ids_b[start:end]):
                return False
            start = end
    return True


def timed(fn, queries) -> tuple[np.ndarray, list[set[int]]]:
    times, found = [], []
    for q in queries:
        t0 = time.perf_counter()
        out = fn(q)
        times.append((time.perf_counter() - t0) * 1e3)
        found.append(set(out.column("id").to_pylist()))
    return np.array(times), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base-rows", type=int, default=200_000)
    ap.add_argument("--upserts", type=int, default=80_000)
    ap.add_argument("--memtable-rows", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/bench_search.json")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="memwal-bench-search-")
    k = args.k
    try:
        tbl = build(f"{work}/t", args.base_rows, args.upserts, args.memtable_rows)
        rng = np.random.default_rng(7)
        queries = [rng.normal(size=DIM).astype(np.float32) for _ in range(args.queries)]
        latest = tbl.to_arrow(["id", "vec"])
        flushed = tbl.to_arrow(["id", "vec"], consistency="eventual")  # what Lance can see
        want = [truth(latest, q, k) for q in queries]
        want_flushed = [truth(flushed, q, k) for q in queries]

        for q in queries[:3]:
            tbl.vector_search(q, k=k)  # warm caches
        ours_t, ours_found = timed(lambda q: tbl.vector_search(q, k=k), queries)

        planner = LsmVectorSearchPlanner(
            tbl.dataset(), lance_shard_snapshots(tbl), "vec", pk_columns=["id"]
        )

        def lance_lsm(q: np.ndarray) -> pa.Table:
            return planner.plan_search(pa.array(q), k=k, columns=["id"]).to_table()

        for q in queries[:3]:
            lance_lsm(q)
        lsm_t, lsm_found = timed(lance_lsm, queries)

        merged = lance.write_dataset(tbl.to_arrow(), f"{work}/merged")
        merged.create_index("vec", "IVF_PQ", **INDEX)
        merged.create_scalar_index("text", "INVERTED")

        def plain(q: np.ndarray) -> pa.Table:
            return merged.to_table(
                columns=["id"], nearest={"column": "vec", "q": q, "k": k, "refine_factor": 5}
            )

        for q in queries[:3]:
            plain(q)
        plain_t, plain_found = timed(plain, queries)

        def recall(found: list[set[int]], ref: list[set[int]]) -> float:
            return float(np.mean([len(f & w) / k for f, w in zip(found, ref)]))

        results = [
            {
                "system": "memwal-sql vector_search",
                "p50_ms": float(np.median(ours_t)),
                "p99_ms": float(np.percentile(ours_t, 99)),
                "recall": recall(ours_found, want),
            },
            {
                "system": "Lance LsmVectorSearchPlanner",
                "p50_ms": float(np.median(lsm_t)),
                "p99_ms": float(np.percentile(lsm_t, 99)),
                "recall": recall(lsm_found, want_flushed),
            },
            {
                "system": "Lance ANN, merged copy, refine 5",
                "p50_ms": float(np.median(plain_t)),
                "p99_ms": float(np.percentile(plain_t, 99)),
                "recall": recall(plain_found, want),
            },
        ]
        print(
            f"\n{'system':<36}{'p50 ms':>9}{'p99 ms':>9}{'recall@' + str(k):>11}{'p50 / ours':>12}"
        )
        for r in results:
            print(
                f"{r['system']:<36}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['recall']:>11.3f}"
                f"{r['p50_ms'] / results[0]['p50_ms']:>12.2f}"
            )
        print("\n" + tbl.explain_search(queries[0], k=k))

        for q in QUERIES[:3]:  # warm: tokenizes each source once, as a long-running reader would
            tbl.fts(q, k=k)
            merged.to_table(full_text_query=q, limit=k)
        fts_t, _ = timed(lambda q: tbl.fts(q, k=k, column="text"), QUERIES * 5)
        lance_fts_t, _ = timed(
            lambda q: merged.to_table(full_text_query=q, limit=k, columns=["id"]), QUERIES * 5
        )
        agree, worst = 0, 0.0
        for q in QUERIES:
            ours, theirs = tbl.fts(q, k=k), merged.to_table(full_text_query=q, limit=k)
            a, b = ours.column("_score").to_numpy(), theirs.column("_score").to_numpy()
            agree += int(same_ranking(ours, theirs))
            if len(a) == len(b):
                worst = max(worst, float(np.max(np.abs(a - b) / b)))
        fts = [
            {
                "system": "memwal-sql fts",
                "p50_ms": float(np.median(fts_t)),
                "p99_ms": float(np.percentile(fts_t, 99)),
            },
            {
                "system": "Lance FTS, merged copy",
                "p50_ms": float(np.median(lance_fts_t)),
                "p99_ms": float(np.percentile(lance_fts_t, 99)),
            },
        ]
        print(f"\n{'full-text search':<36}{'p50 ms':>9}{'p99 ms':>9}")
        for r in fts:
            print(f"{r['system']:<36}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}")
        print(
            f"top-{k} ids and scores equal (a tie in either order) for {agree}/{len(QUERIES)} "
            f"queries; worst relative score error {worst:.2e}"
        )
        print("\n" + tbl.explain_search(QUERIES[0], k=k))
        tbl.close()
        write_results(
            args.out,
            {
                "layout": vars(args),
                "index": INDEX,
                "vector": results,
                "fts": fts,
                "fts_score_agreement": {
                    "queries": len(QUERIES),
                    "same_ids": agree,
                    "worst_relative_error": worst,
                },
            },
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
