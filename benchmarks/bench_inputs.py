"""Input-size benchmark: what the bounds on hostile inputs leave, and that it grows linearly.

* **Full-text query length**: ``tbl.fts`` with queries of 16 KiB to the 1 MiB bound
  (``MAX_FTS_QUERY_BYTES``) of distinct random words, over 20,000 documents in the base table
  and a MemTable. The anchor is the 16 KiB query: linear handling keeps the time per KiB flat.
  Before: 1 MiB took 10 s and 4 MiB 194 s (a count of each term over the whole query).
* **Filter size**: ``tbl.to_arrow(filter=...)`` with chains of ``(v = i AND s = 'i')`` pairs,
  which DataFusion cannot merge into an ``IN`` list, up to the 1,024-operator bound
  (``MAX_SQL_OPERATORS``: 255 pairs), on 20,000 rows. Before: 14 pairs took 1.3 s and 18 took
  29 s (pyarrow's Substrait of the pushed filter doubled with each level of nesting).
* **Vector checks at write**: ``RowCoercer.upserts`` of a 10,000-row batch of 128-dimension
  float32 vectors, against the same batch without its vector column checked (its share of an
  upsert's validation).

Prints tables and writes JSON (``--out``).

Usage: ``python benchmarks/bench_inputs.py [--out benchmarks/results/bench_inputs.json]``
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from results_file import write_results

import memwal_sql as mw
from memwal_sql.compat.datafusion import MAX_SQL_OPERATORS, sql_operators
from memwal_sql.search import MAX_FTS_QUERY_BYTES
from memwal_sql.writer.rows import RowCoercer


def best_of(fn: Callable[[], object], runs: int = 3) -> float:
    """The fastest of ``runs`` calls, in seconds."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def words(rng: np.random.Generator, size: int) -> str:
    """Distinct-ish random words, ``size`` bytes of them."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    n = size // 7 + 1
    picks = rng.integers(0, 26, size=(n, 6))
    return " ".join("".join(w) for w in letters[picks])[:size]


def fts_lengths(work: str, rng: np.random.Generator) -> list[dict]:
    n = 20_000
    docs = pa.table(
        {"id": pa.array(range(n), pa.int64()), "text": [words(rng, 120) for _ in range(n)]}
    )
    tbl = mw.create_table(f"{work}/fts", docs, primary_key="id")
    tbl.create_index("text", "INVERTED")
    tbl.upsert(docs.slice(0, 2_000))  # a MemTable beside the base
    tbl.fts("warm", k=10)
    out = []
    for kib in (16, 64, 256, 1024):
        query = words(rng, min(kib << 10, MAX_FTS_QUERY_BYTES))
        seconds = best_of(lambda q=query: tbl.fts(q, k=10), runs=2)
        out.append({"query_kib": kib, "seconds": seconds, "ms_per_kib": 1000 * seconds / kib})
    tbl.close()
    return out


def filter_sizes(work: str) -> list[dict]:
    n = 20_000
    rows = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "v": pa.array(range(n), pa.int64()),
            "s": [str(i) for i in range(n)],
        }
    )
    tbl = mw.create_table(f"{work}/filters", rows, primary_key="id")
    tbl.upsert(rows.slice(0, 1_000))
    out = []
    for pairs in (16, 64, 128, 255):
        text = " OR ".join(f"(v = {i} AND s = '{i}')" for i in range(0, 2 * pairs, 2))
        assert sql_operators(text) <= MAX_SQL_OPERATORS
        seconds = best_of(lambda t=text: tbl.to_arrow(filter=t))
        out.append(
            {
                "pairs": pairs,
                "operators": sql_operators(text),
                "seconds": seconds,
                "ms_per_pair": 1000 * seconds / pairs,
            }
        )
    tbl.close()
    return out


def vector_checks(rng: np.random.Generator) -> dict:
    n, dim = 10_000, 128
    vec_type = pa.list_(pa.float32(), dim)
    schema = pa.schema([pa.field("id", pa.int64(), False), ("vec", vec_type)])
    values = pa.array(rng.normal(size=n * dim).astype(np.float32))
    batch = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(values, dim),
        },
        schema=schema,
    )
    rows = RowCoercer(schema, ["id"])
    checked = best_of(lambda: rows.upserts(batch), runs=20)
    rows._vectors = []  # the same upsert without the vector check
    unchecked = best_of(lambda: rows.upserts(batch), runs=20)
    return {
        "rows": n,
        "dimensions": dim,
        "upsert_ms": 1000 * checked,
        "without_check_ms": 1000 * unchecked,
        "check_ms": 1000 * (checked - unchecked),
    }


def print_scaling(title: str, rows: list[dict], size: str, unit: str, per: str) -> None:
    """Each row's time, and its time per unit of size against the first row's (the anchor):
    handling linear in the size keeps the ratio at 1 or below."""
    anchor = rows[0][per]
    print(f"\n{title:<20}{'seconds':>10}{per:>14}{'/ anchor':>10}")
    for r in rows:
        print(
            f"{r[size]:>9} {unit:<10}{r['seconds']:>10.3f}{r[per]:>14.3f}{r[per] / anchor:>10.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/bench_inputs.json")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="memwal-bench-inputs-")
    rng = np.random.default_rng(3)
    try:
        fts = fts_lengths(work, rng)
        filters = filter_sizes(work)
        vectors = vector_checks(rng)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_scaling("full-text query", fts, "query_kib", "KiB", "ms_per_kib")
    print_scaling("filter", filters, "pairs", "pairs", "ms_per_pair")
    print(
        f"\nvector check at write: {vectors['rows']:,} x {vectors['dimensions']} float32 upsert "
        f"{vectors['upsert_ms']:.2f} ms, of which the check {vectors['check_ms']:.2f} ms"
    )
    write_results(args.out, {"fts_query_length": fts, "filter_size": filters, "vectors": vectors})


if __name__ == "__main__":
    main()
