"""Compare benchmarks between two checkouts: each run with its own .venv, taken in turn (ABAB).

Each checkout runs its own copy of ``benchmarks/<name>.py`` with its own ``.venv/bin/python``
(an editable install of that checkout) and its own directory as the working directory, so
"before" measures the old code and "after" the new. Per round, every benchmark runs once
before, then once after; rounds repeat that (``--rounds``). Each run writes its JSON (the
benchmark's ``--out``) to a temporary directory; the metrics are read from it, the median of the
rounds is taken per side, and one table is printed: per benchmark and metric, before, after,
after/before, and whether that is better or worse (``better`` says which way a metric is good).
Absolute times and rates are compared, and so are the ratios each benchmark takes against its
anchors in the same process (Lance's own readers and writers, merge_insert, the fsync floor,
DataFusion over Parquet). The load average is recorded before and after each run: the machine
is shared. The comparison is written as JSON (``--out``) after every run, so an interrupted
comparison still leaves its rounds so far.

Usage::

    .venv/bin/python benchmarks/compare.py --before ../wt-before --after . \\
        [--rounds 2] [--bench bench_read bench_lookup ...] [--opts bench_tpch="--scale 0.1"] \\
        [--detail] [--out benchmarks/results/compare.json]
    .venv/bin/python benchmarks/compare.py --show benchmarks/results/compare.json [--detail]

Give the same directory as ``--before`` and ``--after`` to measure the noise (an A/A run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Options per benchmark, the same on both sides, chosen so that each run stays under about 3
# minutes on the project's 2-core machine while other work runs on it. Most of the time goes to
# the anchors: bench_read's Lance scans (bench_read at its defaults took 177 s at a load of 6-9),
# Lance's point-lookup planner in bench_lookup (one plan per key), and Lance's durable writer in
# bench_write (about 100 ms a batch in its --quick run, so its full run would take over 5
# minutes). Read and lookup keep the layout of their defaults (8 flushed generations, 2 per
# region, plus live MemTables) with 60% of the rows; --quick writes 20,000 rows per
# configuration and drops the 7,500-upsert claim.
_LAYOUT = ["--base-rows", "300000", "--upserts", "300000", "--memtable-rows", "24000"]
OPTIONS: dict[str, list[str]] = {
    "bench_read": [*_LAYOUT, "--repeats", "5"],
    "bench_lookup": _LAYOUT,
    "bench_search": ["--base-rows", "100000", "--upserts", "40000", "--memtable-rows", "5000"],
    "bench_write": ["--quick", "--repeats", "5", "--claims", "5"],
    "bench_tpch": ["--scale", "0.05", "--runs", "3"],
}
SIDES = ("before", "after")
ANCHOR = "(anchor)"  # in a metric's name: measured on code other than memwal-sql's


@dataclass(frozen=True)
class Metric:
    """One number a benchmark reported: ``better`` is "higher", "lower" or "same" (a count that
    must not change); a ``detail`` metric is printed only with ``--detail`` (it is always in the
    JSON)."""

    name: str
    value: float
    unit: str
    better: str
    detail: bool = False


def _speedup(name: str, anchor_ms: float, memwal_ms: float) -> Metric:
    """The anchor's time over memwal-sql's (> 1: memwal-sql faster)."""
    return Metric(name, anchor_ms / memwal_ms, "x", "higher")


def _read(data: dict[str, Any]) -> list[Metric]:
    out = []
    for r in data["results"]:
        q = r["query"]
        out += [
            Metric(f"{q}: memwal ms", r["memwal_s"] * 1e3, "ms", "lower"),
            Metric(f"{q}: lance ms (anchor)", r["lance_s"] * 1e3, "ms", "lower", True),
            Metric(f"{q}: ratio lance/memwal", r["ratio"], "x", "higher"),
            Metric(f"{q}: rows returned", r["memwal_rows"], "", "same", True),
        ]
    return out


def _lookup(data: dict[str, Any]) -> list[Metric]:
    out = []
    for r in data["single"]:
        k = r["kind"]
        out += [
            Metric(f"single {k}: memwal p50 ms", r["memwal_p50_ms"], "ms", "lower"),
            Metric(f"single {k}: memwal p99 ms", r["memwal_p99_ms"], "ms", "lower", True),
            Metric(f"single {k}: lance p50 ms (anchor)", r["lance_p50_ms"], "ms", "lower", True),
            _speedup(f"single {k}: ratio lance/memwal p50", r["lance_p50_ms"], r["memwal_p50_ms"]),
        ]
    b, s = data["batched_keys_per_s"], data["sql_in_1000"]
    return [
        *out,
        Metric("batched 1,000 keys: memwal keys/s (best)", b["memwal"], "/s", "higher"),
        Metric("batched 1,000 keys: memwal keys/s (median)", b["memwal_median"], "/s", "higher"),
        Metric("batched: lance keys/s (anchor)", b["lance"], "/s", "higher", True),
        Metric("batched: ratio memwal/lance", b["memwal"] / b["lance"], "x", "higher"),
        Metric("first lookup (cold cache) ms", b["memwal_first_lookup_ms"], "ms", "lower"),
        Metric("SQL id IN (1,000): lookup plan ms", s["lookup_ms"], "ms", "lower"),
        Metric("SQL id+0 IN (1,000): memwal scan ms", s["scan_ms"], "ms", "lower", True),
        Metric("SQL IN: ratio scan/lookup", s["scan_ms"] / s["lookup_ms"], "x", "higher"),
    ]


def _search(data: dict[str, Any]) -> list[Metric]:
    ours, *anchors = data["vector"]
    out = [
        Metric("vector: memwal p50 ms", ours["p50_ms"], "ms", "lower"),
        Metric("vector: memwal p99 ms", ours["p99_ms"], "ms", "lower", True),
        Metric("vector: memwal recall@k", ours["recall"], "", "higher"),
    ]
    for a in anchors:
        out += [
            Metric(f"vector: {a['system']} p50 ms (anchor)", a["p50_ms"], "ms", "lower", True),
            _speedup(f"vector: ratio {a['system']}/memwal p50", a["p50_ms"], ours["p50_ms"]),
        ]
    fts, lance_fts = data["fts"]
    agree = data["fts_score_agreement"]
    return [
        *out,
        Metric("fts: memwal p50 ms", fts["p50_ms"], "ms", "lower"),
        Metric("fts: memwal p99 ms", fts["p99_ms"], "ms", "lower", True),
        Metric("fts: Lance FTS p50 ms (anchor)", lance_fts["p50_ms"], "ms", "lower", True),
        _speedup("fts: ratio Lance/memwal p50", lance_fts["p50_ms"], fts["p50_ms"]),
        Metric("fts: queries with the same top-k as Lance", agree["same_ids"], "", "higher"),
    ]


def _write(data: dict[str, Any]) -> list[Metric]:
    out = []
    for r in data["results"]:
        key = f"{r['batch_rows']:>6} rows {r['config']}"
        ours = r["config"].startswith("memwal")
        out.append(
            Metric(
                f"{key}: put rows/s" + ("" if ours else " (anchor)"),
                r["put_rows_per_s"],
                "/s",
                "higher",
                not ours,
            )
        )
        if ours:
            out += [
                Metric(f"{key}: incl. close rows/s", r["total_rows_per_s"], "/s", "higher", True),
                Metric(f"{key}: put p50 ms", r["p50_ms"], "ms", "lower", True),
                Metric(f"{key}: put p99 ms", r["p99_ms"], "ms", "lower", True),
            ]
    for br, ratios in data["ratios"].items():
        for name, v in ratios.items():
            out.append(Metric(f"{int(br):>6} rows ratio {name}", v, "x", "higher"))
    for c in data["claims"]:
        key = f"claim, {c['load']}, after {c['acked']} upserts"
        out += [
            Metric(f"{key}: median s", c["median_s"], "s", "lower"),
            Metric(f"{key}: max s", c["max_s"], "s", "lower", True),
        ]
    return out


def _tpch(data: dict[str, Any]) -> list[Metric]:
    out = [Metric("all 22 results equal Parquet's", float(data["all_results_equal"]), "", "higher")]
    for stage, s in data["stages"].items():
        out += [
            Metric(f"{stage}: memwal total ms", s["memwal_ms"], "ms", "lower"),
            Metric(f"{stage}: parquet total ms (anchor)", s["parquet_ms"], "ms", "lower", True),
            Metric(f"{stage}: ratio memwal/parquet", s["ratio"], "x", "lower"),
            Metric(
                f"{stage}: worst query ratio memwal/parquet",
                max(q["ratio"] for q in s["queries"]),
                "x",
                "lower",
                True,
            ),
        ]
        out += [
            Metric(f"{stage}: q{q['query']} memwal ms", q["memwal_ms"], "ms", "lower", True)
            for q in s["queries"]
        ]
    return out


METRICS: dict[str, Callable[[dict[str, Any]], list[Metric]]] = {
    "bench_read": _read,
    "bench_lookup": _lookup,
    "bench_search": _search,
    "bench_write": _write,
    "bench_tpch": _tpch,
}


def checkout(directory: str) -> dict[str, Any]:
    """The checkout's commit, whether it has uncommitted changes, and where its Python imports
    memwal_sql from (which must be the checkout itself: an editable install)."""
    directory = os.path.abspath(directory)
    python = os.path.join(directory, ".venv", "bin", "python")
    if not os.path.exists(python):
        sys.exit(f"{python} is missing: run `make lint` in {directory} first (it creates .venv)")
    imported = subprocess.run(
        [python, "-c", "import memwal_sql; print(memwal_sql.__file__)"],
        cwd=directory,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not imported.startswith(directory + os.sep):
        sys.exit(f"{python} imports memwal_sql from {imported}, not from {directory}")

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", "-C", directory, *a], capture_output=True, text=True, check=True
        ).stdout.strip()

    return {
        "dir": directory,
        "python": python,
        "memwal_sql": imported,
        "commit": git("rev-parse", "HEAD"),
        "subject": git("log", "-1", "--format=%s")[:100],
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONHASHSEED"] = "0"
    return env


def run_one(side: dict[str, Any], bench: str, opts: list[str], out: str, timeout: float) -> dict:
    """Run one benchmark in one checkout; its metrics, or why there are none."""
    log = out[: -len(".json")] + ".log"
    cmd = [side["python"], f"benchmarks/{bench}.py", *opts, "--out", out]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    try:
        with open(log, "w") as f:
            rc = subprocess.run(
                cmd,
                cwd=side["dir"],
                env=_env(),
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            ).returncode
    except subprocess.TimeoutExpired:
        rc = -1
    wall = time.perf_counter() - t0
    run: dict[str, Any] = {
        "rc": rc,
        "wall_s": wall,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "log": log,
    }
    try:
        with open(out) as f:
            run["metrics"] = {m.name: m.value for m in METRICS[bench](json.load(f))}
    except (OSError, ValueError, KeyError) as e:
        run["error"] = f"{type(e).__name__}: {e} (rc {rc}; see {log})"
    return run


def summarize(bench: str, runs: dict[str, list[dict]]) -> list[dict[str, Any]]:
    """Per metric: the medians of the rounds per side, their ratio, and each side's spread
    (max - min over median, with 2+ rounds): how far two runs of the same code differ."""
    good = {s: [r["metrics"] for r in runs[s] if "metrics" in r] for s in SIDES}
    if not good["before"] or not good["after"]:
        return []
    first = next(r for r in runs["before"] if "metrics" in r)
    with open(first["out"]) as f:  # each metric's unit, direction and detail flag
        kinds = {m.name: m for m in METRICS[bench](json.load(f))}
    rows = []
    for name, m in kinds.items():
        row: dict[str, Any] = {"metric": name, "unit": m.unit, "better": m.better}
        row["detail"] = m.detail
        for s in SIDES:
            vals = [g[name] for g in good[s] if name in g]
            row[s] = statistics.median(vals) if vals else None
            row[f"{s}_rounds"] = vals
            med = row[s]
            row[f"{s}_spread"] = (
                (max(vals) - min(vals)) / abs(med) if len(vals) > 1 and med else None
            )
        b, a = row["before"], row["after"]
        row["after_over_before"] = a / b if a is not None and b else None
        if row["after_over_before"] is not None:
            r = row["after_over_before"]
            # Positive: after is better; negative: after is worse (by that fraction).
            if m.better == "same":  # a count both sides must agree on, not a speed
                row["change"] = None
            else:
                row["change"] = (r - 1) if m.better == "higher" else (1 / r - 1 if r else None)
        else:
            row["change"] = None
        rows.append(row)
    return rows


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "/s":
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def print_table(report: dict[str, Any], detail: bool) -> None:
    rounds = report["rounds"]
    print(
        f"\nbefore: {report['before']['commit'][:7]} {report['before']['dir']}"
        f"\nafter:  {report['after']['commit'][:7]} {report['after']['dir']}"
        f"{' (uncommitted changes)' if report['after']['dirty'] else ''}"
        f"\nrounds: {rounds}; values are medians of the rounds; change > 0: after is better"
    )
    for bench, b in report["benchmarks"].items():
        print(f"options: {bench} {b['options'] or '(defaults)'}")
    print()
    spread = rounds > 1
    head = "| benchmark | metric | better | before | after | after/before | change |"
    head += " spread before | spread after |" if spread else ""
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for bench, b in report["benchmarks"].items():
        if not b["metrics"]:
            print(f"| {bench} | no result: {b.get('error', 'see the logs')} |")
            continue
        for row in b["metrics"]:
            if row["detail"] and not detail:
                continue
            r, c = row["after_over_before"], row["change"]
            line = (
                f"| {bench} | {row['metric']} | {row['better']} | {_fmt(row['before'], row['unit'])}"
                f" | {_fmt(row['after'], row['unit'])} | {'-' if r is None else f'{r:.3f}'}"
                f" | {'-' if c is None else f'{c:+.1%}'} |"
            )
            if spread:
                for s in SIDES:
                    v = row[f"{s}_spread"]
                    line += f" {'-' if v is None else f'{v:.1%}'} |"
            print(line)
    drift = sorted(
        (abs(math.log(row["after_over_before"])), row["metric"], bench)
        for bench, b in report["benchmarks"].items()
        for row in b["metrics"]
        if ANCHOR in row["metric"] and row["after_over_before"]
    )
    if drift:
        # The anchors run code that is the same on both sides: how far they moved is noise.
        mid, (top, metric, bench) = drift[len(drift) // 2][0], drift[-1]
        print(
            f"\nnoise: the {len(drift)} anchors (Lance, DataFusion over Parquet, the fsync floor: "
            f"the same code on both sides) moved by a median of {math.exp(mid) - 1:.0%}, "
            f"at most {math.exp(top) - 1:.0%} ({bench} {metric})"
        )
    print("\nruns (wall s; 1-minute load average before -> after):")
    for bench, b in report["benchmarks"].items():
        for s in SIDES:
            for i, r in enumerate(b["runs"][s]):
                flag = "" if "metrics" in r else f"  FAILED: {r.get('error')}"
                print(
                    f"  {bench:<13} {s:<6} round {i + 1}: {r['wall_s']:6.1f} s, load "
                    f"{r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}{flag}"
                )
    print(f"total wall time: {report['wall_s']:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--before", help="checkout of the old code (with its .venv)")
    ap.add_argument("--after", help="checkout of the new code (with its .venv)")
    ap.add_argument("--show", metavar="JSON", help="only print the table of an earlier comparison")
    ap.add_argument("--bench", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    ap.add_argument("--rounds", type=int, default=2, help="runs per side (median)")
    ap.add_argument(
        "--opts",
        action="append",
        default=[],
        metavar='NAME="OPTIONS"',
        help='replace a benchmark\'s options (both sides), e.g. bench_tpch="--scale 0.1"',
    )
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--detail", action="store_true", help="also print anchors and per-query rows")
    ap.add_argument("--out", default="benchmarks/results/compare.json")
    args = ap.parse_args()
    if args.show:
        with open(args.show) as f:
            print_table(json.load(f), args.detail)
        return
    if not args.before or not args.after:
        ap.error("--before and --after are required (or --show an earlier comparison)")
    options = {b: list(OPTIONS[b]) for b in args.bench}
    for o in args.opts:
        name, _, value = o.partition("=")
        if name not in OPTIONS:
            ap.error(f"--opts {o}: no benchmark {name!r}; one of {', '.join(OPTIONS)}")
        options[name] = shlex.split(value)
    sides = {"before": checkout(args.before), "after": checkout(args.after)}
    tmp = tempfile.mkdtemp(prefix="memwal-compare-")
    print(f"runs' JSON and logs: {tmp}")
    report: dict[str, Any] = {
        **sides,
        "rounds": args.rounds,
        "order": "per round, each benchmark before then after",
        "options": {b: " ".join(o) for b, o in options.items()},
        "benchmarks": {
            b: {"options": " ".join(options[b]), "runs": {s: [] for s in SIDES}, "metrics": []}
            for b in options
        },
    }
    t0 = time.perf_counter()
    for i in range(args.rounds):
        for bench, opts in options.items():
            b = report["benchmarks"][bench]
            for s in SIDES:
                out = os.path.join(tmp, f"{bench}-{s}-{i + 1}.json")
                run = run_one(sides[s], bench, opts, out, args.timeout)
                run["out"] = out
                b["runs"][s].append(run)
                state = "ok" if "metrics" in run else run["error"]
                print(
                    f"round {i + 1} {bench} {s}: {run['wall_s']:.0f} s, load "
                    f"{run['load_before'][0]:.2f} -> {run['load_after'][0]:.2f}: {state}",
                    flush=True,
                )
            b["metrics"] = summarize(bench, b["runs"])
            report["wall_s"] = time.perf_counter() - t0
            os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=2)
    print_table(report, args.detail)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
