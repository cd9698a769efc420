"""Cold full-text search: the first ``tbl.fts`` top-10 in a fresh process, against Lance's own
full-text search over the base (which has no LSM to correct for).

The table: ``ROWS`` base rows of Zipf-distributed words (an INVERTED index on ``text``), then
2% of the keys updated and 1% deleted and merged, another 1% flushed as a generation and a
few hundred rows left in the MemTable, so every correction of the statistics is exercised.

    python benchmarks/bench_fts_cold.py build /tmp/fts200k 200000
    python benchmarks/bench_fts_cold.py query /tmp/fts200k      # one fresh process per run

Run ``query`` from a checkout of another commit (``PYTHONPATH=...``) to compare.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pyarrow as pa

QUERY = "w5 w500 w9999"
VOCABULARY = 20_000


def documents(keys: np.ndarray, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCABULARY + 1) ** 1.1
    lengths = rng.integers(3, 40, len(keys))
    words = rng.choice(VOCABULARY, size=int(lengths.sum()), p=p / p.sum())
    vocabulary = np.array([f"w{i}" for i in range(VOCABULARY)])
    ends = np.cumsum(lengths)
    text = [" ".join(vocabulary[words[e - n : e]]) for n, e in zip(lengths, ends)]
    return pa.table({"id": pa.array(keys, pa.int64()), "text": text})


def build(uri: str, rows: int) -> None:
    import memwal_sql as mw

    tbl = mw.create_table(
        uri,
        documents(np.arange(rows), 0),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )
    tbl.create_index("text", "INVERTED", with_position=False)
    rng = np.random.default_rng(1)
    for step, share in enumerate([0.02, 0.01, 0.001]):
        keys = rng.choice(rows, int(rows * share), replace=False)
        tbl.upsert(documents(keys, 10 + step))
        tbl.delete(pa.table({"id": pa.array(rng.choice(rows, len(keys) // 2), pa.int64())}))
        if step == 0:
            tbl.flush()
            tbl.merge()
        elif step == 1:
            tbl.flush()
    tbl.close()


def query(uri: str) -> None:
    start = time.perf_counter()
    import lance

    import memwal_sql as mw

    imported = time.perf_counter()
    tbl = mw.open_table(uri)
    opened = time.perf_counter()
    tbl.fts(QUERY, k=10)
    cold = time.perf_counter()
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        tbl.fts(QUERY, k=10)
        warm.append(time.perf_counter() - t)
    ds = tbl.dataset()
    t = time.perf_counter()
    ds.to_table(full_text_query=QUERY, limit=10, columns=["id"])
    lance_cold = time.perf_counter() - t
    print(
        f"import {imported - start:.2f}s open {opened - imported:.3f}s "
        f"fts cold {1000 * (cold - opened):.0f} ms warm {1000 * float(np.median(warm)):.1f} ms "
        f"(Lance base-only FTS, same process after ours: {1000 * lance_cold:.1f} ms) "
        f"lance {lance.__version__}"
    )
    tbl.close()


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], int(sys.argv[3]))
    else:
        query(sys.argv[2])
