"""The operator's commands: ``inspect``, ``flush``, ``merge``, ``gc``, ``maintain``,
``verify``, ``set-aside`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from typing import Any

from tqdm import tqdm

import memwal_sql as mw
from memwal_sql.cli import storage_options
from memwal_sql.cli.output import size, text_table
from memwal_sql.maintenance.config import RECOVER_REGIONS_IDLE_FOR, MaintenanceConfig


def _open(a: argparse.Namespace) -> mw.MemWalTable:
    return mw.open_table(a.uri, storage_options.from_args(a))


def inspect(a: argparse.Namespace) -> None:
    tbl = _open(a)
    if a.watch is not None:
        _watch(tbl, a)
        return
    regions = tbl.maintenance.status()
    spec = tbl.region_spec.describe() if tbl.region_spec else "manual regions"
    version = tbl.dataset().version
    if a.json:
        doc = {
            "uri": tbl.uri,
            "primary_key": list(tbl.primary_key),
            "region_spec": spec,
            "sequence_column": tbl.sequence_column,
            "base_version": version,
            "regions": [r.to_dict() for r in regions],
        }
        print(json.dumps(doc, indent=2))
        return
    healthy = [r for r in regions if r.problem is None]
    print(f"table {tbl.uri}")
    print(f"  primary key:  {', '.join(tbl.primary_key)}")
    print(f"  region spec:  {spec}")
    if tbl.sequence_column is not None:
        print(f"  sequence:     {tbl.sequence_column} (each key's highest wins)")
    print(f"  base version: {version}")
    print(
        f"  regions:      {len(regions)}, "
        f"{sum(r.unmerged_generations for r in healthy)} unmerged generation(s), "
        f"{sum(r.unmerged_rows for r in healthy):,} unmerged row(s), "
        f"{sum(r.unflushed_rows for r in healthy):,} unflushed WAL row(s), "
        f"{size(sum(sum(r.storage_bytes.values()) for r in healthy))} in _mem_wal/"
    )
    if not regions:
        return
    header = (
        "region", "epoch", "gens", "merged", "unmerged", "unmerged rows", "merge lag",
        "WAL", "unflushed", "idle", "storage", "index catch-up",
    )  # fmt: skip
    lines = [
        [
            r.region_id,
            r.writer_epoch,
            len(r.flushed_generations),
            r.merged_generation,
            r.unmerged_generations,
            r.unmerged_rows,
            _duration(r.merge_lag_seconds),
            r.wal_entries,
            f"{r.unflushed_rows} rows/{r.unflushed_wal_entries} entries",
            _duration(r.idle_seconds),
            size(sum(r.storage_bytes.values())),
            _catchup(r.index_catchup, r.merged_generation),
        ]
        for r in healthy
    ]
    print()
    print(text_table(header, lines))
    for r in regions:
        if r.problem is not None:
            print(f"region {r.region_id} DAMAGED: {r.problem}")
    if any(r.unflushed_rows for r in healthy):
        print(
            "\nunflushed WAL rows are in no generation yet: their writer flushes them, "
            "`memwal maintain` does once the region is idle for "
            f"{_duration(RECOVER_REGIONS_IDLE_FOR.total_seconds())}, "
            "`memwal flush URI` does now (fencing a live writer of the region)"
        )


def _watch(tbl: mw.MemWalTable, a: argparse.Namespace) -> None:
    """``inspect --watch``: the table's metrics every ``a.watch`` seconds, the screen redrawn
    on a terminal, one block (or JSON line) after another otherwise."""
    redraw = sys.stdout.isatty() and not a.json
    before: mw.TableMetrics | None = None
    shown = 0
    try:
        while True:
            m = tbl.metrics()
            if a.json:
                print(json.dumps(m.to_dict()), flush=True)
            else:
                text = _metrics_text(m, before)
                # Home and clear, then the new view: the terminal shows only the latest.
                gap = "\x1b[H\x1b[2J" if redraw else "\n" if shown else ""
                print(gap + text, flush=True)
            before, shown = m, shown + 1
            if a.iterations and shown >= a.iterations:
                return
            time.sleep(a.watch)
    except KeyboardInterrupt:
        print(f"stopped after {shown} refresh(es)")


def _metrics_text(m: mw.TableMetrics, before: mw.TableMetrics | None) -> str:
    """One view of ``m``; WAL entries per second since ``before`` (every writer's)."""
    elapsed = m.taken_at - before.taken_at if before is not None else 0.0
    earlier = {r.region_id: r.wal_position for r in before.regions} if before else {}
    c = m.cache
    lines = [
        [
            r.region_id,
            r.wal_position,
            f"{(r.wal_position - earlier[r.region_id]) / elapsed:.1f}"
            if elapsed > 0 and r.region_id in earlier
            else "-",
            f"{r.unflushed_rows} rows/{r.unflushed_wal_entries} entries",
            _duration(r.idle_seconds),
            r.generations,
            r.unmerged_generations,
            r.unmerged_rows,
            _duration(r.merge_lag_seconds),
        ]
        for r in m.regions
        if r.problem is None
    ]
    header = (
        "region", "WAL position", "entries/s", "unflushed", "idle", "gens", "unmerged",
        "unmerged rows", "merge lag",
    )  # fmt: skip
    return "\n".join(
        [
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(m.taken_at))} {m.uri}",
            f"cache: {c.hits:,} hits, {c.misses:,} misses, {c.evictions:,} evictions, "
            f"{size(c.nbytes)} of {size(c.max_bytes)}" + (" (shared)" if c.shared else ""),
            "",
            text_table(header, lines),
            *(f"region {r.region_id} DAMAGED: {r.problem}" for r in m.regions if r.problem),
        ]
    )


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _catchup(indexes: dict[str, int | None], merged: int) -> str:
    parts = []
    for name, gen in indexes.items():
        if gen is None:
            parts.append(f"{name}@?")
        else:
            parts.append(f"{name}@{gen}" + (" (behind)" if gen < merged else ""))
    return ", ".join(parts) or "-"


def flush(a: argparse.Namespace) -> None:
    r = _open(a).maintenance.flush_regions(a.regions)
    for rid, rows in r.recovered.items():
        print(f"region {rid}: flushed {rows:,} WAL row(s) into a generation")
    if not r.recovered:
        print("no region has unflushed WAL rows")


def merge(a: argparse.Namespace) -> None:
    r = _open(a).maintenance.merge(regions=a.regions)
    gens = sum(len(g) for g in r.merged.values())
    print(
        f"merged {gens} generation(s) from {len(r.merged)} region(s): {r.rows_upserted:,} rows "
        f"upserted, {r.rows_deleted:,} deleted, {r.conflicts} conflict(s), {r.seconds:.2f} s"
    )


def _config(a: argparse.Namespace) -> MaintenanceConfig:
    """The maintenance settings the command's arguments give (the others left as default)."""
    older = getattr(a, "base_versions_older_than", None)
    idle = getattr(a, "recover_regions_idle_for", None)
    return MaintenanceConfig().updated(
        keep_manifest_versions=getattr(a, "keep_manifest_versions", None),
        base_versions_older_than=None if older is None else timedelta(seconds=older),
        recover_regions_idle_for=None if idle is None else timedelta(seconds=idle),
        target_rows_per_fragment=getattr(a, "target_rows_per_fragment", None),
        deletion_threshold=getattr(a, "deletion_threshold", None),
    )


def gc(a: argparse.Namespace) -> None:
    r = _open(a).maintenance.gc(_config(a))
    print(r.summary())


def compact(a: argparse.Namespace) -> None:
    tbl = _open(a)
    r = tbl.maintenance.compact(_config(a))
    if r.fragments_removed:
        print(
            f"compacted {r.fragments_removed} fragment(s) into {r.fragments_added} "
            f"(base table version {r.base_version}, {r.seconds:.1f} s)"
        )
    else:
        print("nothing to compact")


def maintain(a: argparse.Namespace) -> None:
    tbl, config = _open(a), _config(a)
    passes = 0
    repeat = a.watch is not None or a.iterations > 1
    try:
        while True:
            r = tbl.maintenance.run(config)
            passes += 1
            stamp = time.strftime("%Y-%m-%d %H:%M:%S ") if a.watch is not None else ""
            print(f"{stamp}pass {passes}: {_pass_summary(r)}", flush=True)
            for failure in r.failures:  # the next pass runs the step again
                print(f"  {failure}", flush=True)
            for name, why in r.skipped.items():
                print(f"  {name} skipped: {why}", flush=True)
            if not repeat or (a.iterations and passes >= a.iterations):
                break
            time.sleep(a.watch or 0)
    except KeyboardInterrupt:
        if a.watch is None:
            raise
        print(f"stopped after {passes} pass(es)")
        return
    if r.failures:
        raise SystemExit(1)  # the last pass left a step failed: say so to a script


def _pass_summary(r: Any) -> str:
    return (
        f"flushed {sum(r.recovery.recovered.values()):,} WAL row(s) of "
        f"{len(r.recovery.recovered)} idle region(s), "
        f"merged {sum(len(g) for g in r.merge.merged.values())} generation(s) "
        f"({r.merge.rows_upserted:,} rows upserted, {r.merge.rows_deleted:,} deleted), "
        f"optimized {len(r.indexes.optimized)} index(es), "
        f"compacted {r.compaction.fragments_removed} fragment(s) into "
        f"{r.compaction.fragments_added}, "
        f"snapshotted {r.snapshots.regions} region(s), deleted {r.gc.objects} object(s)"
    )


def verify(a: argparse.Namespace) -> None:
    tbl = _open(a)
    with tqdm(desc="verifying", unit=" objects", disable=True if a.json else None) as bar:
        report = tbl.maintenance.verify(bar.update)
    if a.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
    if not report.ok:
        sys.stdout.flush()
        raise SystemExit(1)


def set_aside(a: argparse.Namespace) -> None:
    from memwal_sql.formats.wal import set_aside_damaged_entry

    tbl = _open(a)
    to = set_aside_damaged_entry(tbl.store, a.region_id, a.position)
    print(
        f"moved the damaged WAL entry at position {a.position} of region {a.region_id} to "
        f"{tbl.store.uri_for(to)}; its rows are given up, and the next writer of the region "
        "takes its position"
    )


def demo(a: argparse.Namespace) -> None:
    from memwal_sql.cli.demo import run_demo, run_spark_demo

    if a.spark:
        if not run_spark_demo(rows=min(a.rows, 200_000), regions=a.regions, uri=a.uri):
            raise SystemExit("spark demo check FAILED")
        return
    result = run_demo(rows=a.rows, regions=a.regions, uri=a.uri, durable=not a.no_durable)
    if not result.matches:
        raise SystemExit("demo check FAILED: stored rows differ from what was written")
