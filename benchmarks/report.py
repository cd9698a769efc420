"""Render docs/performance.md from the JSON the benchmarks wrote to ``benchmarks/results/``.

Each benchmark gets a section: what it measures (its docstring), when and on
what it ran (the ``machine`` record of :mod:`results_file`), then one table per result: its
``ratios`` first, then the rest in the order the benchmark wrote them. The page also lists the
benchmarks with no JSON yet and the command that produces it. Nothing is measured here.

Usage: ``python benchmarks/report.py [RESULTS_DIR] [OUT]`` (``make perf-docs``).

Example:
    ``render({"bench_x": {"machine": {"cpus": 2}, "ratios": {"scan": 1.5}}}, {"bench_x": "X."})``
    is the page's Markdown with one section, ``bench_x``, and its ratios as a table.
"""

from __future__ import annotations

import ast
import datetime
import glob
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

# Results that describe the run rather than measure it: shown after the measurements.
SETUP_KEYS = ("args", "layout")


def fmt(value: Any) -> str:
    """One cell: floats to three significant digits at most, thousands separated."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        size = abs(value)
        if size >= 100:
            return f"{value:,.0f}"
        if size >= 10:
            return f"{value:.1f}"
        if size >= 0.01 or size == 0:
            return f"{value:.3g}" if size < 1 else f"{value:.2f}"
        return f"{value:.2e}"
    if isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
        return ", ".join(fmt(v) for v in value)
    return str(value).replace("|", "\\|")


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level, their keys joined with ``.`` (``{"a": {"b": 1}}`` -> a.b)."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table; numbers are right-aligned."""
    numeric = [
        all(
            isinstance(r[i], (int, float)) and not isinstance(r[i], bool)
            for r in rows
            if i < len(r)
        )
        for i in range(len(header))
    ]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return lines


def result_tables(name: str, value: Any) -> list[str]:
    """The tables of one result: a record per row where the value holds records."""
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        records = [flatten(v) for v in value]
        columns = list(dict.fromkeys(k for r in records for k in r))
        return table(columns, [[r.get(c, "") for c in columns] for r in records])
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        records = {k: flatten(v) for k, v in value.items()}
        columns = list(dict.fromkeys(k for r in records.values() for k in r))
        return table(
            [name, *columns], [[k, *(r.get(c, "") for c in columns)] for k, r in records.items()]
        )
    if isinstance(value, dict):
        return table([name, "value"], [[k, v] for k, v in flatten(value).items()])
    return table([name], [[value]])


def when_and_where(result: dict[str, Any], path: str | None) -> str:
    """The line saying when the benchmark ran and on what."""
    machine = result.get("machine", {})
    when = machine.get("measured_at")
    if when is None and path is not None:
        mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
        when = f"{mtime:%Y-%m-%d %H:%M} UTC (the file's time; this JSON predates measured_at)"
    what = ", ".join(
        f"{key} {machine[key]}"
        for key in ("cpus", "platform", "python", "lance", "datafusion", "pyarrow")
        if key in machine
    )
    return f"Measured {when or 'at an unknown time'} on {what or 'an unrecorded machine'}."


def section(name: str, result: dict[str, Any], about: str, path: str | None = None) -> list[str]:
    """One benchmark's section: what it measures, when and where, then its tables."""
    lines = [f"## {name}", "", about, "", when_and_where(result, path), ""]
    scalars = {k: v for k, v in result.items() if not isinstance(v, (dict, list))}
    nested = [k for k in result if k != "machine" and k not in scalars]
    order = [k for k in nested if k == "ratios"]
    order += [k for k in nested if k not in ("ratios", *SETUP_KEYS)]
    order += [k for k in nested if k in SETUP_KEYS]
    for key in order:
        lines += [f"**{key}**", "", *result_tables(key, result[key]), ""]
    if scalars:
        lines += ["**run**", "", *table(["", "value"], [[k, v] for k, v in scalars.items()]), ""]
    return lines


def render(
    results: dict[str, dict[str, Any]],
    about: dict[str, str],
    paths: dict[str, str] | None = None,
) -> str:
    """The page: a section per benchmark in ``results``, and the benchmarks of ``about``
    that have no results, with the command that measures them."""
    lines = [
        "<!-- Generated by benchmarks/report.py from benchmarks/results/*.json by make perf-docs;"
        " edit the generator, not this file. -->",
        "",
        "# Performance",
        "",
        "Every benchmark measures memwal-sql against its anchors (Lance 14's own MemWAL, plain "
        "Lance `merge_insert`, the storage floor, DataFusion over Parquet) in the same run on the "
        "same files, and writes its results as JSON to `benchmarks/results/`. This page is "
        "rendered from those files by `make perf-docs` (`make bench` runs every benchmark, then "
        "it). Each benchmark's description says what it measures and what its ratios divide. "
        "Numbers from one machine compare with each other, not with another machine's.",
        "",
    ]
    missing = sorted(name for name in about if not any(_of(r, about) == name for r in results))
    if missing:
        lines += [
            "## Not measured yet",
            "",
            "No results are in `benchmarks/results/` for these; each command writes them "
            "(add `--help` for its sizes), then `make perf-docs` renders this page again:",
            "",
        ]
        lines += [
            f"- `{name}`: `python benchmarks/{name}.py --out benchmarks/results/{name}.json`"
            for name in missing
        ]
        lines.append("")
    for name in sorted(results):
        text = about.get(_of(name, about) or "", "")
        lines += section(name, results[name], text, (paths or {}).get(name))
    return "\n".join(lines).rstrip() + "\n"


def _of(result: str, about: dict[str, str]) -> str | None:
    """The benchmark a result file comes from: its name, or the longest benchmark name it
    starts with (``bench_scale_10m`` is one of ``bench_scale``'s sizes)."""
    if result in about:
        return result
    named = [b for b in about if result.startswith(f"{b}_")]
    return max(named, key=len) if named else None


def describe(script: str) -> str:
    """A benchmark script's docstring as Markdown, without its usage line."""
    with open(script) as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    paragraphs = [p for p in doc.split("\n\n") if not p.startswith("Usage:")]
    return "\n\n".join(paragraphs).replace("``", "`")


def main(argv: list[str]) -> None:
    results_dir = argv[0] if argv else os.path.join(HERE, "results")
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "..", "docs", "performance.md")
    about = {
        os.path.basename(p)[: -len(".py")]: describe(p)
        for p in sorted(glob.glob(os.path.join(HERE, "bench_*.py")))
    }
    results, paths = {}, {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        name = os.path.basename(path)[: -len(".json")]
        with open(path) as f:
            results[name] = json.load(f)
        paths[name] = path
    with open(out, "w") as f:
        f.write(render(results, about, paths))
    missing = [b for b in about if not any(_of(r, about) == b for r in results)]
    print(f"wrote {out}: {len(results)} results, {len(missing)} benchmarks missing")


if __name__ == "__main__":
    main(sys.argv[1:])
