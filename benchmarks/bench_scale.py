"""Reads at scale, cold and warm: memwal-sql against Lance 14's own readers, one run.

Layout (``--scale 2m`` or ``10m`` base rows; ``--base-rows`` for a quick run): a base table with a
btree on ``id``, IVF_PQ on a 32-d ``vec`` and INVERTED on ``text``; two flushed generations of
30k rows each (a third of them updates of base keys, 1% deletes); and a WAL tail of
``--tail-rows`` rows that no live writer holds (each reader replays it from the WAL).

Each read kind runs in a fresh process per system: "cold" is opening the table plus the first
query (what a CLI call or a Spark task pays; imports excluded), "warm" the median of the next
five. Peak RSS is the process's. The readers compared:

| read | memwal-sql | Lance 14 |
|---|---|---|
| filtered scan ``x = 7 AND text LIKE '%return%'`` | ``tbl.to_arrow(filter=...)`` | ``LsmScanner`` |
| one-key lookup | ``tbl.lookup([k])`` | ``LsmPointLookupPlanner`` |
| vector top-10 | ``tbl.vector_search(q, k=10)`` | ``LsmVectorSearchPlanner`` |
| full-text top-10 | ``tbl.fts(q, k=10)`` | Lance FTS over the base alone (no LSM FTS) |

Lance's LSM readers see the base and the flushed generations, not the WAL tail; memwal-sql reads
all three. Prints a table (ratio = memwal / lance time: < 1 is faster) and writes JSON.

    python benchmarks/bench_scale.py --scale 2m
    python benchmarks/bench_scale.py --base-rows 200000 --keep /tmp/scale200k   # build once
    python benchmarks/bench_scale.py --base-rows 200000 --reuse /tmp/scale200k  # measure again
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import write_results

DIM = 32
SCALES = {"2m": 2_000_000, "10m": 10_000_000}
KINDS = ("scan", "lookup", "vector", "fts")
FILTER = "x = 7 AND text LIKE '%return%'"
TEXT_QUERY = "function return value"
WARM_RUNS = 5
LANCE_DEFAULT_NPROBES = 20  # LsmVectorSearchPlanner.plan_search's default
RECALL_QUERIES = 20  # vectors whose recall@10 each system's search reports (not timed)
GENERATION_ROWS = 30_000


def sentences() -> list[str]:
    import pydoc_data.topics as topics  # English prose that ships with Python

    text = " ".join(topics.topics.values())
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 20 < len(s.strip()) < 400]


def rows(ids: np.ndarray, rng: np.random.Generator, words: list[str]) -> pa.Table:
    vecs = rng.normal(size=(len(ids), DIM)).astype(np.float32)
    text = np.asarray(words, dtype=object)[rng.integers(0, len(words), len(ids))]
    return pa.table(
        {
            "id": ids.astype(np.int64),
            "x": rng.integers(0, 100, len(ids)).astype(np.int32),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), DIM),
            "text": pa.array(text, pa.string()),
        }
    )


def build(uri: str, base_rows: int, tail_rows: int) -> None:
    """Write the layout at ``uri``: base with its three indexes, two generations, a WAL tail."""
    import memwal_sql as mw

    rng = np.random.default_rng(1)
    words = sentences()
    schema = rows(np.arange(1), rng, words).schema

    def pieces():  # the base, streamed in pieces
        for start in range(0, base_rows, 500_000):
            part = rows(np.arange(start, min(base_rows, start + 500_000)), rng, words)
            yield from part.to_batches()

    tbl = mw.create_table(
        uri,
        pa.RecordBatchReader.from_batches(schema, pieces()),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
        writer_config=mw.WriterConfig(max_memtable_rows=10 * GENERATION_ROWS),
    )
    tbl.close()
    tbl = mw.open_table(uri)
    tbl.create_index("id", "BTREE")
    tbl.create_index(
        "vec", "IVF_PQ", num_partitions=max(16, int(np.sqrt(base_rows) / 4)), num_sub_vectors=16
    )
    tbl.create_index("text", "INVERTED")
    next_id = base_rows
    for _ in range(2):  # two flushed generations per region
        n_new = GENERATION_ROWS * 2 // 3
        ids = np.unique(
            np.concatenate(
                [
                    np.arange(next_id, next_id + n_new),
                    rng.integers(0, base_rows, GENERATION_ROWS - n_new),
                ]
            )
        )
        next_id += n_new
        tbl.upsert(rows(ids, rng, words))
        dels = np.unique(rng.integers(0, next_id, GENERATION_ROWS // 100)).astype(np.int64)
        tbl.delete(pa.array(dels))
        tbl.flush()
    tail = np.unique(
        np.concatenate(
            [
                np.arange(next_id, next_id + tail_rows // 2),
                rng.integers(0, base_rows, tail_rows // 2),
            ]
        )
    )
    for chunk in np.array_split(tail, max(1, len(tail) // 500)):  # many small WAL entries
        tbl.upsert(rows(chunk, rng, words))
    for w in tbl.live_writers().values():
        w.release()  # the tail stays in the WAL: every reader replays it
    tbl.close()


def _query_vector() -> np.ndarray:
    return np.random.default_rng(7).normal(size=DIM).astype(np.float32)


def _recall_vectors() -> np.ndarray:
    return np.random.default_rng(11).normal(size=(RECALL_QUERIES, DIM)).astype(np.float32)


def _our_nprobes(tbl: Any) -> int:
    """The partitions memwal-sql probes by default in the base's vector index."""
    from planner.search import vector_index

    index = vector_index(tbl.dataset(), "vec", tbl.caches)
    assert index is not None, "the layout has no vector index on vec"
    return index.default_nprobes()


def true_neighbours(uri: str) -> list[list[int]]:
    """Each recall vector's 10 nearest latest rows by exact L2 (brute force over every row)."""
    import memwal_sql as mw

    latest = mw.open_table(uri).to_arrow(columns=["id", "vec"])
    ids = latest["id"].to_numpy()
    vecs = latest["vec"].combine_chunks().values.to_numpy().reshape(len(ids), DIM)
    del latest
    norms = np.einsum("ij,ij->i", vecs, vecs)
    out = []
    for q in _recall_vectors():
        d = norms - 2 * (vecs @ q)
        out.append(ids[np.argpartition(d, 10)[:10]].tolist())
    return out


def _lookup_key(base_rows: int) -> int:
    return int(np.random.default_rng(7).integers(0, base_rows))


def ours(kind: str, uri: str, base_rows: int) -> tuple[Callable[[], Any], Callable[[Any], int]]:
    """(open, query) for memwal-sql: ``query(opened)`` returns the rows it found."""
    import memwal_sql as mw

    # Imports are not the query's cost (Lance's are made before its clock starts too): the
    # modules a read loads on first use are loaded here.
    for module in ("table", "reads", "search", "session"):
        importlib.import_module(f"memwal_sql.{module}")

    key, q = _lookup_key(base_rows), _query_vector()
    queries: dict[str, Callable[[Any], int]] = {
        "scan": lambda t: t.to_arrow(filter=FILTER).num_rows,
        "lookup": lambda t: t.lookup([key]).num_rows,
        "vector": lambda t: t.vector_search(q, "vec", k=10).num_rows,
        "fts": lambda t: t.fts(TEXT_QUERY, "text", k=10).num_rows,
    }
    return (lambda: mw.open_table(uri)), queries[kind]


def neighbours(system: str, opened: Any) -> list[list[int]]:
    """The ids each system's search returns for the recall vectors (after the timed runs)."""
    if system == "memwal":
        search = lambda q: opened.vector_search(q, "vec", k=10)  # noqa: E731
    else:
        search = lambda q: opened(q)  # noqa: E731
    return [search(q)["id"].to_pylist() for q in _recall_vectors()]


def lance(
    kind: str, uri: str, base_rows: int, system: str = "lance"
) -> tuple[Callable[[], Any], Callable[[Any], int]]:
    """(open, query) for Lance's own reader of the same read (the snapshots of the regions'
    generations are read from their manifests, as Lance's LSM readers take them)."""
    import lance as lance_module
    from lance.mem_wal import LsmPointLookupPlanner, LsmScanner, LsmVectorSearchPlanner

    import memwal_sql as mw
    from memwal_sql.interop import lance_shard_snapshots

    key, q = _lookup_key(base_rows), _query_vector()
    if kind == "fts":
        return (
            lambda: lance_module.dataset(uri),
            lambda ds: ds.to_table(full_text_query=TEXT_QUERY, limit=10).num_rows,
        )

    def open_() -> Any:
        tbl = mw.open_table(uri)
        ds, snaps = tbl.dataset(), lance_shard_snapshots(tbl)
        if kind == "scan":
            return lambda: LsmScanner.from_snapshots(ds, snaps).filter(FILTER).to_table()
        if kind == "lookup":
            planner = LsmPointLookupPlanner(ds, snaps)
            return lambda: planner.plan_lookup(pa.array([key], pa.int64())).to_table()
        search = LsmVectorSearchPlanner(ds, snaps, "vec", pk_columns=["id"])
        # Lance's planner probes 20 partitions unless told; "lance_probes" gives it ours.
        nprobes = _our_nprobes(tbl) if system == "lance_probes" else LANCE_DEFAULT_NPROBES
        return lambda v=q: search.plan_search(
            pa.array(v), k=10, nprobes=nprobes, columns=["id"]
        ).to_table()

    return open_, lambda run: run().num_rows


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``: ``ru_maxrss`` would carry the parent's over)."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024


def child(system: str, kind: str, uri: str, base_rows: int) -> dict[str, Any]:
    """One fresh process's measurement: open + first query (cold), then warm runs."""
    if system == "memwal":
        open_, query = ours(kind, uri, base_rows)
    else:
        open_, query = lance(kind, uri, base_rows, system)
    t0 = time.perf_counter()
    opened = open_()
    n = query(opened)
    cold_ms = (time.perf_counter() - t0) * 1e3
    warm = []
    for _ in range(WARM_RUNS):
        t0 = time.perf_counter()
        query(opened)
        warm.append((time.perf_counter() - t0) * 1e3)
    return {
        "cold_ms": cold_ms,
        "warm_ms": float(np.median(warm)),
        "rows": n,
        "peak_rss_mb": peak_rss_mb(),
        **({"neighbours": neighbours(system, opened)} if kind == "vector" else {}),
    }


def measure(system: str, kind: str, uri: str, base_rows: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", system, kind, uri, "--base-rows", str(base_rows)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def with_recall(m: dict[str, Any], truth: list[list[int]]) -> dict[str, Any]:
    """``m`` with its search's recall@10 against ``truth`` in place of the ids it found."""
    if "neighbours" in m:
        found = zip(m.pop("neighbours"), truth, strict=True)
        m["recall_at_10"] = float(np.mean([len(set(f) & set(t)) / 10 for f, t in found]))
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scale", choices=sorted(SCALES), default="2m")
    ap.add_argument("--base-rows", type=int, default=None, help="overrides --scale")
    ap.add_argument("--tail-rows", type=int, default=20_000)
    ap.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KINDS)
    ap.add_argument("--keep", default=None, help="build the layout here and keep it")
    ap.add_argument("--reuse", default=None, help="measure a layout built with --keep")
    ap.add_argument("--child", nargs=3, metavar=("SYSTEM", "KIND", "URI"), help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    base_rows = args.base_rows or SCALES[args.scale]
    if args.child:
        system, kind, uri = args.child
        print(json.dumps(child(system, kind, uri, base_rows)))
        return
    work = None
    if args.reuse:
        uri = args.reuse
    else:
        uri = args.keep or f"{(work := tempfile.mkdtemp(prefix='memwal-bench-scale-'))}/t"
        t0 = time.perf_counter()
        build(uri, base_rows, args.tail_rows)
        print(
            f"built {base_rows:,} base rows + 2 generations + WAL tail in "
            f"{time.perf_counter() - t0:.0f} s"
        )
    try:
        results = []
        print(
            f"\n{'read':<24}{'ours cold':>11}{'lance cold':>12}{'ratio':>7}"
            f"{'ours warm':>11}{'lance warm':>12}{'ratio':>7}{'ours RSS':>10}{'lance RSS':>11}"
        )
        truth = true_neighbours(uri) if "vector" in args.kinds else []
        for kind in args.kinds:
            a = with_recall(measure("memwal", kind, uri, base_rows), truth)
            # Lance's vector planner at its default (20 probes) and at memwal-sql's probes:
            # an ANN search is compared at its recall, so both are reported.
            anchors = ["lance", "lance_probes"] if kind == "vector" else ["lance"]
            for anchor in anchors:
                b = with_recall(measure(anchor, kind, uri, base_rows), truth)
                read = kind if anchor == "lance" else f"{kind}, Lance our probes"
                r = {
                    "read": read,
                    "memwal": a,
                    "lance": b,
                    "cold_ratio": a["cold_ms"] / b["cold_ms"],
                    "warm_ratio": a["warm_ms"] / b["warm_ms"],
                }
                results.append(r)
                recall = (
                    f"  recall@10 {a['recall_at_10']:.3f} vs {b['recall_at_10']:.3f}"
                    if "recall_at_10" in b
                    else ""
                )
                print(
                    f"{read:<24}{a['cold_ms']:>9.1f}ms{b['cold_ms']:>10.1f}ms{r['cold_ratio']:>7.2f}"
                    f"{a['warm_ms']:>9.1f}ms{b['warm_ms']:>10.1f}ms{r['warm_ratio']:>7.2f}"
                    f"{a['peak_rss_mb']:>8.0f}MB{b['peak_rss_mb']:>9.0f}MB{recall}"
                )
        size = args.scale if args.base_rows is None else f"{base_rows}rows"
        out = args.out or f"benchmarks/results/bench_scale_{size}.json"
        write_results(
            out, {"base_rows": base_rows, "tail_rows": args.tail_rows, "results": results}
        )
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
