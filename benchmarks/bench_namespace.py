"""Namespace batch commit benchmark: publishing K tables' new versions in one
``batch_commit_tables`` against K single-table commits (``create_table_version``, one batch of
one each), for K = 2, 8 and 32, on local disk.

Each round stages one new version (an append of 100 rows) of each of the K tables, untimed,
then times the publish: the ``__manifest`` commits and the promotions into ``_versions/``. The
batch costs one ``__manifest`` rewrite for all K tables; K single commits cost K rewrites (and
are not atomic together). Prints a table and writes JSON (``--out``).

Usage: ``python benchmarks/bench_namespace.py [--rounds 5] [--out benchmarks/results/bench_namespace.json]``
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import lance
import lance_namespace as ln
import numpy as np
import pyarrow as pa
from results_file import write_results

from memwal_sql.namespace_client import MemWalDirectoryNamespace, StagedVersion

SCHEMA = pa.schema([("id", pa.int64())])


def stage_all(
    ns: MemWalDirectoryNamespace, tables: list[list[str]], round_: int
) -> list[StagedVersion]:
    """One staged append of 100 rows per table (untimed)."""
    staged = []
    for tid in tables:
        location = ns.describe_table(ln.DescribeTableRequest(id=tid)).location
        data = pa.table({"id": np.arange(100, dtype=np.int64) + 100 * round_})
        fragments = lance.fragment.write_fragments(data, location, schema=SCHEMA)
        staged.append(ns.stage_version(tid, lance.LanceOperation.Append(fragments)))
    return staged


def measure(k: int, rounds: int, workdir: str) -> dict[str, float]:
    ns = MemWalDirectoryNamespace(f"{workdir}/k{k}")
    tables = [[f"t{i}"] for i in range(k)]
    ns.batch_commit_tables(
        ln.BatchCommitTablesRequest(
            operations=[
                ln.CommitTableOperation(declare_table=ln.DeclareTableRequest(id=t)) for t in tables
            ]
        )
    )
    first = [ns.stage_version(t, lance.LanceOperation.Overwrite(SCHEMA, [])) for t in tables]
    ns.batch_commit_tables(ln.BatchCommitTablesRequest(operations=[s.operation for s in first]))
    batch, single = [], []
    for r in range(rounds):
        staged = stage_all(ns, tables, 2 * r)
        start = time.perf_counter()
        ns.batch_commit_tables(
            ln.BatchCommitTablesRequest(operations=[s.operation for s in staged])
        )
        batch.append(time.perf_counter() - start)
        staged = stage_all(ns, tables, 2 * r + 1)
        start = time.perf_counter()
        for s in staged:
            ns.create_table_version(s.operation.create_table_version.model_dump())
        single.append(time.perf_counter() - start)
    assert ns.published_version(tables[0]) == 1 + 2 * rounds
    return {
        "tables": k,
        "batch_ms": float(np.median(batch) * 1e3),
        "singles_ms": float(np.median(single) * 1e3),
        "singles_over_batch": float(np.median(single) / np.median(batch)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="timed publishes per K and way")
    ap.add_argument("--out", default="benchmarks/results/bench_namespace.json")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="memwal-bench-ns-")
    try:
        results = [measure(k, args.rounds, workdir) for k in (2, 8, 32)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'tables':>7}{'1 batch ms':>12}{'K singles ms':>14}{'singles/batch':>15}")
    for r in results:
        print(
            f"{r['tables']:>7}{r['batch_ms']:>12.1f}{r['singles_ms']:>14.1f}"
            f"{r['singles_over_batch']:>15.2f}"
        )
    write_results(args.out, {"rounds": args.rounds, "results": results})


if __name__ == "__main__":
    main()
