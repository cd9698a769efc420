"""WAL put benchmark: what one durable WAL entry costs on local disk, step by step.

``bench_write`` compares whole upserts with the floor of one Arrow IPC file + fsync per batch.
This one takes the Python out and compares the file-system work alone, on the same bytes (one
1,000-row WAL entry, about 37 KB, and a 10,000-row one), in lockstep turns of 10 puts:

* ``floor``: create the file by name, write, fsync (what bench_write's floor does);
* ``floor + dir fsync``: the same, then fsync the directory (what POSIX needs for the name);
* ``WAL put, no spare file``: ``ObjectStore.put_if_not_exists(checksummed=True)`` as a region
  writer puts a WAL entry (temporary file, write, rename to its name without replacing, one fsync
  that writes the data and the name on ext4/XFS/btrfs), creating the temporary file on the spot;
* ``WAL put, spare files``: the same with the temporary files created ahead of time by a
  background thread (``keep_spare_files``), as a region writer's WAL does;
* ``ordered put, spare files``: a put of data without a checksum (manifests): write, fsync,
  rename, fsync the directory, so that a name never reaches the disk before its data.

Each runs in two regimes: ``fresh`` (no file deleted lately) and ``after deletions`` (20,000 files
created and deleted just before, the steady state of a writer whose old WAL entries are
garbage-collected; on ext4 without a journal, creating a file skips every inode deleted in the last
30 s). Prints a table and writes JSON (``--out``).

The files go to the system's temporary directory: set ``TMPDIR`` to measure another file system.

Usage: ``python benchmarks/bench_wal_put.py [--puts 600] [--out benchmarks/results/bench_wal_put.json]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
from results_file import write_results

from memwal_sql.storage import ObjectStore


def floor_put(directory: str, dirsync: bool) -> Callable[[int, bytes], None]:
    def put(i: int, data: bytes) -> None:
        fd = os.open(f"{directory}/{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        if dirsync:
            dfd = os.open(directory, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)

    return put


def store_put(root: str, spares: bool, checksummed: bool) -> Callable[[int, bytes], None]:
    store = ObjectStore(root)
    if spares:
        store.keep_spare_files("wal")
    return lambda i, data: store.put_if_not_exists(f"wal/{i}.arrow", data, checksummed=checksummed)


def churn(workdir: str, n: int = 20_000) -> None:
    scratch = tempfile.mkdtemp(prefix="churn-", dir=workdir)
    for i in range(n):
        os.close(os.open(f"{scratch}/{i}", os.O_WRONLY | os.O_CREAT, 0o644))
    shutil.rmtree(scratch)


def run(workdir: str, size: int, puts: int, turn: int = 10) -> dict[str, list[float]]:
    data = os.urandom(size)
    configs = {
        "floor": floor_put(tempfile.mkdtemp(dir=workdir), False),
        "floor + dir fsync": floor_put(tempfile.mkdtemp(dir=workdir), True),
        "WAL put, no spare file": store_put(tempfile.mkdtemp(dir=workdir), False, True),
        "WAL put, spare files": store_put(tempfile.mkdtemp(dir=workdir), True, True),
        "ordered put, spare files": store_put(tempfile.mkdtemp(dir=workdir), True, False),
    }
    time.sleep(0.05)  # the first spare files
    lat: dict[str, list[float]] = {k: [] for k in configs}
    order = list(configs)
    for start in range(0, puts, turn):
        for name in order:
            for i in range(start, start + turn):
                t0 = time.perf_counter()
                configs[name](i, data)
                lat[name].append(time.perf_counter() - t0)
        order = order[1:] + order[:1]
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--puts", type=int, default=600, help="puts per configuration and regime")
    ap.add_argument("--out", default="benchmarks/results/bench_wal_put.json")
    args = ap.parse_args()
    results = []
    workdir = tempfile.mkdtemp(prefix="memwal-bench-put-")
    try:
        for regime in ("fresh", "after deletions"):
            for label, size in (("1,000 rows", 37_000), ("10,000 rows", 370_000)):
                if regime == "after deletions":
                    churn(workdir)
                lat = run(workdir, size, args.puts if size < 100_000 else args.puts // 3)
                floor = float(np.mean(lat["floor"]))
                for name, v in lat.items():
                    ms = np.array(v) * 1e3
                    results.append(
                        {
                            "regime": regime,
                            "entry": label,
                            "bytes": size,
                            "config": name,
                            "mean_ms": float(ms.mean()),
                            "p50_ms": float(np.median(ms)),
                            "p99_ms": float(np.percentile(ms, 99)),
                            "floor_over_this": floor / ms.mean() * 1e3,
                        }
                    )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"{'regime':<16}{'entry':<13}{'config':<26}{'mean ms':>9}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'floor/this':>12}"
    )
    for r in results:
        print(
            f"{r['regime']:<16}{r['entry']:<13}{r['config']:<26}{r['mean_ms']:>9.3f}"
            f"{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['floor_over_this']:>12.2f}"
        )
    write_results(
        args.out,
        {
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
