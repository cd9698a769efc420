"""Write benchmark: memwal-sql's RegionWriter against Lance 14 and the storage floor, one run.

For batch sizes of 100, 1,000 and 10,000 rows, the same batches (70% new keys, 30% updates) go to:

* ``memwal durable`` / ``memwal non-durable``: ``RegionWriter.upsert``;
* ``lance durable`` / ``lance non-durable``: Lance 14's native ``ShardWriter.put``;
* ``lance merge_insert``: a plain Lance ``merge_insert`` commit per batch;
* ``memwal routed upsert`` / ``memwal partial update``: ``tbl.upsert`` of the batches against
  ``tbl.update`` of their key and ``score`` columns (each key's latest row read first), durable;
* ``memwal sequenced upsert``: ``tbl.upsert`` into a table with a sequence column (``ts``, the
  batch's number: every write is newer), whose write reads each key's current sequence first;
* ``floor ipc+fsync``: one Arrow IPC stream file per batch, written and fsynced (the least a
  durable per-batch WAL can do); ``floor ipc+fsync+dirsync`` also fsyncs the directory, which
  POSIX needs for a new file's name to survive a power loss (on ext4, XFS and btrfs the file's
  own fsync writes it too, and memwal-sql relies on that there).

memwal durable and the two floors run in lockstep, taking turns of 10 batches, so that the drift
of the disk's fsync latency hits all three alike; the other configurations run one at a time. Each repeat goes
round all of them and the repeats are pooled.

Reported per configuration: rows/s over the put phase (the sum of put latencies), rows/s
including the final close (which flushes the MemTable to a generation), and put latency p50/p99.
Ratios are against the anchors in the same run. Prints a table and writes JSON (``--out``).

Claims: another process upserts one row at a time, durably, as fast as it can; once it has
had 1,000 or 7,500 upserts acknowledged, this process claims the region
(``tbl.writer(region_id=...)``), which fences it and replays what it wrote (7,500 is about the
longest WAL tail of the default ``max_memtable_batches=8000``, after which the writer flushes a
generation). Reported per tail, idle and beside two busy processes (2 cores): the median and
the longest of several claims, the WAL entries replayed, and where the time went
(``stats()["claim_seconds"]``: manifest commit, fence sentinel, replay, sync, last_seen commit,
the rest).

Usage: ``python benchmarks/bench_write.py [--quick] [--claims-only]
[--out benchmarks/results/bench_write.json]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
from results_file import write_results

import memwal_sql as mw

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False, metadata={"lance-schema:unenforced-primary-key": "true"}),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("ts", pa.int64()),
    ]
)


def make_batches(batch_rows: int, count: int, seed: int = 0) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    out, next_id = [], 0
    for b in range(count):
        n_upd = int(batch_rows * 0.3) if next_id else 0
        # Keys are unique within a batch: merge_insert refuses ambiguous batches.
        updates = rng.choice(next_id, size=min(n_upd, next_id), replace=False) if next_id else []
        ids = np.concatenate([np.arange(next_id, next_id + batch_rows - n_upd), updates]).astype(
            np.int64
        )
        next_id += batch_rows - n_upd
        out.append(
            pa.table(
                {
                    "id": ids,
                    "name": pa.array([f"name-{i % 1000}" for i in ids]),
                    "score": rng.random(len(ids)),
                    "ts": np.full(len(ids), b, dtype=np.int64),
                },
                schema=SCHEMA,
            )
        )
    return out


@dataclass
class Session:
    """One configuration under test: ``put`` one batch, then ``close`` (timed separately)."""

    put: Callable[[pa.Table], None]
    close: Callable[[], None] = lambda: None


def open_memwal(root: str, durable: bool) -> Session:
    tbl = mw.create_table(f"{root}/t", SCHEMA, primary_key="id")
    w = tbl.writer(durable_write=durable)
    return Session(w.upsert, w.close)


def open_memwal_routed(root: str, partial: bool) -> Session:
    """``tbl.upsert`` (whole rows) or ``tbl.update`` of the batch's key and ``score`` only (a
    partial update: each key's latest row is read, then written whole), durable."""
    tbl = mw.create_table(f"{root}/t", SCHEMA, primary_key="id")
    if partial:
        return Session(lambda b: tbl.update(b.select(["id", "score"])), tbl.close)
    return Session(tbl.upsert, tbl.close)


def open_memwal_sequenced(root: str, _: bool) -> Session:
    tbl = mw.create_table(f"{root}/t", SCHEMA, primary_key="id", sequence_column="ts")
    return Session(tbl.upsert, tbl.close)


def open_lance_shard(root: str, durable: bool) -> Session:
    ds = lance.write_dataset(SCHEMA.empty_table(), f"{root}/t")
    ds.initialize_mem_wal()
    w = lance.dataset(f"{root}/t").mem_wal_writer(str(uuid.uuid4()), durable_write=durable)
    return Session(w.put, w.close)


def open_merge_insert(root: str, _: bool) -> Session:
    uri = f"{root}/t"
    lance.write_dataset(SCHEMA.empty_table(), uri)

    def put(b: pa.Table) -> None:
        (
            lance.dataset(uri)
            .merge_insert("id")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute(b)
        )

    return Session(put)


def open_floor(root: str, dirsync: bool) -> Session:
    os.makedirs(f"{root}/wal")
    counter = iter(range(1 << 62))

    def put(b: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, b.schema) as wr:
            wr.write_table(b)
        path = f"{root}/wal/{next(counter)}.arrow"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, sink.getvalue())
        os.fsync(fd)
        os.close(fd)
        if dirsync:
            dfd = os.open(f"{root}/wal", os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)

    return Session(put)


# name, opener, flag, lockstep. The durable configurations that are compared with the floor run
# in lockstep (see run_sessions), so this disk's fsync latency, which drifts by 2x within a
# minute, hits them alike.
CONFIGS: list[tuple[str, Callable[[str, bool], Session], bool, bool]] = [
    ("memwal durable", open_memwal, True, True),
    ("floor ipc+fsync", open_floor, False, True),
    ("floor ipc+fsync+dirsync", open_floor, True, True),
    ("memwal non-durable", open_memwal, False, False),
    ("lance durable", open_lance_shard, True, False),
    ("lance non-durable", open_lance_shard, False, False),
    ("lance merge_insert", open_merge_insert, False, False),
    ("memwal routed upsert", open_memwal_routed, False, False),
    ("memwal partial update", open_memwal_routed, True, False),
    ("memwal sequenced upsert", open_memwal_sequenced, False, False),
]


def run_sessions(
    names: list[str], batches: list[pa.Table], workdir: str, turn: int = 10
) -> dict[str, dict]:
    """Put ``batches`` into each named configuration, taking turns of ``turn`` consecutive
    batches (the configuration going first rotates); then close each. Returns per configuration
    the put latencies and the close time.

    Turns of several batches keep what a configuration does in the background between its own
    consecutive puts (memwal-sql prepares its next WAL file) inside its own turn, while still
    sampling the disk's drifting fsync latency for every configuration alike.
    """
    openers = {name: (fn, flag) for name, fn, flag, _ in CONFIGS}
    sessions = {
        n: openers[n][0](tempfile.mkdtemp(prefix="memwal-bench-", dir=workdir), openers[n][1])
        for n in names
    }
    lat: dict[str, list[float]] = {n: [] for n in names}
    order = list(names)
    for start in range(0, len(batches), turn):
        for n in order:
            for b in batches[start : start + turn]:
                t0 = time.perf_counter()
                sessions[n].put(b)
                lat[n].append(time.perf_counter() - t0)
        order = order[1:] + order[:1]
    out = {}
    for n in names:
        t0 = time.perf_counter()
        sessions[n].close()
        out[n] = {"lat": lat[n], "close_s": time.perf_counter() - t0}
    return out


def measure(batch_rows: int, args: argparse.Namespace, workdir: str) -> list[dict]:
    """Every configuration at one batch size; one result row per configuration."""
    rows_per_config = 20_000 if args.quick else 200_000
    count = max(rows_per_config // batch_rows, 10)
    if batch_rows == 100:
        count = min(count, 300 if not args.quick else 50)
    batches = make_batches(batch_rows, count)
    pooled: dict[str, dict] = {}
    lockstep = [name for name, _, _, together in CONFIGS if together]
    groups = [lockstep] + [[name] for name, _, _, together in CONFIGS if not together]
    # Repeats go round all groups, so a slow spell of the disk is spread over all of them;
    # the repeats are pooled (a longer run), not the best picked.
    for _ in range(args.repeats):
        for group in groups:
            n = (
                count
                if group != ["lance merge_insert"]
                else min(count, 100 if not args.quick else 20)
            )
            for name, r in run_sessions(group, batches[:n], workdir).items():
                p = pooled.setdefault(name, {"lat": [], "close_s": 0.0, "rows": 0, "n": n})
                p["lat"] += r["lat"]
                p["close_s"] += r["close_s"]
                p["rows"] += sum(b.num_rows for b in batches[:n])
    results = []
    for name, _, _, _ in CONFIGS:
        r = pooled[name]
        put_s = float(np.sum(r["lat"]))
        lat_ms = np.array(r["lat"]) * 1e3
        results.append(
            {
                "config": name,
                "batch_rows": batch_rows,
                "batches": r["n"],
                "repeats": args.repeats,
                "rows": r["rows"],
                "put_rows_per_s": r["rows"] / put_s,
                "total_rows_per_s": r["rows"] / (put_s + r["close_s"]),
                "p50_ms": float(np.percentile(lat_ms, 50)),
                "p99_ms": float(np.percentile(lat_ms, 99)),
            }
        )
        print(f"  {batch_rows:>6} {name:<26} {r['rows'] / put_s:>12,.0f} rows/s", flush=True)
    return results


# Single-row durable upserts as fast as they go; each id is printed once acknowledged.
_APPENDER = """
import sys
import memwal_sql as mw
from memwal_sql.errors import WriterFencedError
w = mw.open_table(sys.argv[1]).writer(region_id=sys.argv[2], durable_write=True)
i = 0
try:
    while True:
        w.upsert({"id": [i], "name": ["a"], "score": [0.0], "ts": [i]})
        print(i, flush=True)
        i += 1
except WriterFencedError:
    print("FENCED", flush=True)
"""
CLAIM_PHASES = ("manifest", "fence", "replay", "sync", "commit")


def one_claim(root: str, acked: int) -> dict:
    """Claim a region from a writer process appending flat out, once it had ``acked`` upserts
    acknowledged."""
    tbl = mw.create_table(f"{root}/t", SCHEMA, primary_key="id")
    with tbl.writer() as w:
        w.upsert(make_batches(1, 1)[0])
        rid = w.region_id
    child = subprocess.Popen(
        [sys.executable, "-c", _APPENDER, f"{root}/t", rid], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    try:
        child.stdout.readline()
        t0 = time.perf_counter()
        for _ in range(acked - 1):
            child.stdout.readline()
        rate = acked / (time.perf_counter() - t0)
        claimer_table = mw.open_table(f"{root}/t")
        t1 = time.perf_counter()
        claimer = claimer_table.writer(region_id=rid)
        seconds = time.perf_counter() - t1
        out, _ = child.communicate(timeout=60)
        assert out.split()[-1] == "FENCED", "the appending writer was not fenced"
    finally:
        child.kill()
    stats = claimer.stats()
    claimer.close()
    phases = {k: stats["claim_seconds"].get(k, 0.0) for k in CLAIM_PHASES}
    phases["other"] = seconds - sum(phases.values())
    return {
        "seconds": seconds,
        "phases": phases,
        "replayed": stats["replayed_entries"],
        "synced": stats["claim_synced_entries"],
        "rate": rate,
    }


def measure_claims(args: argparse.Namespace, workdir: str) -> list[dict]:
    """Claims idle and beside two busy processes, per warm-up: median of several."""
    results = []
    for load in (0, 2):
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
        try:
            for acked in (1_000,) if args.quick else (1_000, 7_500):
                runs = [
                    one_claim(tempfile.mkdtemp(prefix="memwal-claim-", dir=workdir), acked)
                    for _ in range(args.claims)
                ]
                seconds = [r["seconds"] for r in runs]
                row = {
                    "load": f"{load} busy processes" if load else "idle",
                    "acked": acked,
                    "claims": len(runs),
                    "median_s": float(np.median(seconds)),
                    "max_s": max(seconds),
                    "replayed_median": float(np.median([r["replayed"] for r in runs])),
                    "synced_median": float(np.median([r["synced"] for r in runs])),
                    "appender_puts_per_s": float(np.median([r["rate"] for r in runs])),
                    "phases_median_ms": {
                        k: 1e3 * float(np.median([r["phases"][k] for r in runs]))
                        for k in (*CLAIM_PHASES, "other")
                    },
                    "runs": runs,
                }
                results.append(row)
                print(
                    f"  claim {row['load']:<18} after {acked:>5} upserts: "
                    f"{row['median_s']:.3f} s (max {row['max_s']:.3f})",
                    flush=True,
                )
        finally:
            for p in busy:
                p.kill()
                p.wait()
    return results


def print_claims(claims: list[dict]) -> None:
    print(
        "\nclaims against a flat-out single-row durable writer in another process "
        "(median; breakdown in ms)"
    )
    print(
        f"{'load':<18}{'acked':>7}{'tail':>7}{'claim s':>9}{'max s':>7}"
        + "".join(f"{k:>9}" for k in (*CLAIM_PHASES, "other"))
        + f"{'fsyncs':>7}{'puts/s':>8}"
    )
    for c in claims:
        print(
            f"{c['load']:<18}{c['acked']:>7}{c['replayed_median']:>7.0f}"
            f"{c['median_s']:>9.3f}{c['max_s']:>7.3f}"
            + "".join(f"{v:>9.1f}" for v in c["phases_median_ms"].values())
            + f"{c['synced_median']:>7.0f}{c['appender_puts_per_s']:>8.0f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer batches (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration (pooled)")
    ap.add_argument("--claims", type=int, default=5, help="claims per claim line (median)")
    ap.add_argument("--claims-only", action="store_true", help="only the claim lines")
    ap.add_argument("--out", default="benchmarks/results/bench_write.json")
    args = ap.parse_args()
    results: list[dict] = []
    # Everything written stays until the end: on ext4 without a journal (this project's CI
    # disks), creating a file slows down while many inodes were deleted in the last 30 s, which
    # would make each configuration pay for the clean-up of the one before it.
    workdir = tempfile.mkdtemp(prefix="memwal-bench-write-")
    try:
        claims = measure_claims(args, workdir)
        for batch_rows in () if args.claims_only else (100, 1_000, 10_000):
            results += measure(batch_rows, args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_claims(claims)
    if args.claims_only:
        write_results(args.out, {"claims": claims})
        return

    def get(cfg: str, br: int) -> dict:
        return next(r for r in results if r["config"] == cfg and r["batch_rows"] == br)

    ratios = {}
    print(
        f"\n{'batch':>6} {'config':<26}{'put rows/s':>13}{'incl. close':>13}{'p50 ms':>9}{'p99 ms':>9}"
    )
    for r in results:
        print(
            f"{r['batch_rows']:>6} {r['config']:<26}{r['put_rows_per_s']:>13,.0f}"
            f"{r['total_rows_per_s']:>13,.0f}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
        )
    print("\nratios (same run; > 1 means memwal-sql is faster)")
    for br in (100, 1_000, 10_000):
        md, mn = get("memwal durable", br), get("memwal non-durable", br)
        ratios[br] = {
            "nondurable_vs_lance_nondurable_put": mn["put_rows_per_s"]
            / get("lance non-durable", br)["put_rows_per_s"],
            "nondurable_vs_lance_nondurable_total": mn["total_rows_per_s"]
            / get("lance non-durable", br)["total_rows_per_s"],
            "durable_vs_lance_durable": md["put_rows_per_s"]
            / get("lance durable", br)["put_rows_per_s"],
            "durable_vs_floor_fsync": md["put_rows_per_s"]
            / get("floor ipc+fsync", br)["put_rows_per_s"],
            "durable_vs_floor_fsync_dirsync": md["put_rows_per_s"]
            / get("floor ipc+fsync+dirsync", br)["put_rows_per_s"],
            "durable_vs_merge_insert": md["put_rows_per_s"]
            / get("lance merge_insert", br)["put_rows_per_s"],
            "nondurable_vs_merge_insert": mn["put_rows_per_s"]
            / get("lance merge_insert", br)["put_rows_per_s"],
            # what a partial update's read of its keys costs against a whole-row upsert
            "partial_update_vs_upsert": get("memwal partial update", br)["put_rows_per_s"]
            / get("memwal routed upsert", br)["put_rows_per_s"],
            # what reading each key's current sequence costs against a plain upsert
            "sequenced_vs_upsert": get("memwal sequenced upsert", br)["put_rows_per_s"]
            / get("memwal routed upsert", br)["put_rows_per_s"],
            "sequenced_vs_merge_insert": get("memwal sequenced upsert", br)["put_rows_per_s"]
            / get("lance merge_insert", br)["put_rows_per_s"],
        }
        for k, v in ratios[br].items():
            print(f"{br:>6} {k:<42}{v:>8.2f}")
    write_results(
        args.out,
        {
            "results": results,
            "ratios": ratios,
            "claims": claims,
        },
    )


if __name__ == "__main__":
    main()
