"""The ``memwal`` command line: create, ingest, inspect, merge, gc, maintain, verify, set-aside,
demo."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.dataset as pads
from tqdm import tqdm

import memwal_sql as mw
from memwal_sql.errors import MemWalError


def _spec(text: str | None) -> mw.RegionSpec | None:
    """Parse ``bucket:col:N``, ``identity:col`` or ``unsharded``."""
    if text is None:
        return None
    kind, *args = text.split(":")
    if kind == "bucket" and len(args) == 2:
        return mw.RegionSpec.bucket(args[0], int(args[1]))
    if kind == "identity" and len(args) == 1:
        return mw.RegionSpec.identity(args[0])
    if kind == "unsharded" and not args:
        return mw.RegionSpec.unsharded()
    raise SystemExit(f"bad --region-spec {text!r}: use bucket:COL:N, identity:COL or unsharded")


def cmd_create(a: argparse.Namespace) -> None:
    spec = _spec(a.region_spec)
    if not a.source:
        raise SystemExit("create needs --from FILE (parquet/arrow/csv) to take the schema from")
    data = pads.dataset(a.source)
    tbl = mw.create_table(
        a.uri,
        data.to_table() if a.with_data else data.schema,
        primary_key=a.primary_key.split(","),
        region_spec=spec,
    )
    print(
        f"created {tbl.uri}: primary key {list(tbl.primary_key)}, "
        f"regions {tbl.region_spec.describe() if tbl.region_spec else 'manual'}"
    )


def cmd_ingest(a: argparse.Namespace) -> None:
    tbl = mw.open_table(a.uri)
    tbl.writer_config = tbl.writer_config.with_overrides(durable=not a.no_durable)
    source = pads.dataset(a.source, format=a.format)
    total = source.count_rows()
    with tqdm(total=total, unit="row", unit_scale=True, desc="ingesting") as bar:
        for batch in source.to_batches(batch_size=a.batch_rows):
            tbl.upsert(pa.Table.from_batches([batch]))
            bar.update(batch.num_rows)
    tbl.close()
    print(f"ingested {total:,} rows into {len(tbl.regions())} region(s)")


def cmd_inspect(a: argparse.Namespace) -> None:
    from memwal_sql.maintenance.status import region_status

    tbl = mw.open_table(a.uri)
    regions = region_status(tbl)
    if a.json:
        print(json.dumps([r.to_dict() for r in regions], indent=2))
        return
    print(f"{a.uri}: primary key {list(tbl.primary_key)}, base version {tbl.dataset().version}")
    print(
        f"{'region':<38}{'epoch':>6}{'gens':>6}{'merged':>7}{'unmerged':>9}{'rows':>10}"
        f"{'lag s':>8}{'WAL':>6}{'storage':>10}  index catch-up"
    )
    for r in regions:
        if r.problem is not None:
            print(f"{r.region_id:<38}DAMAGED: {r.problem}")
            continue
        catchup = (
            ", ".join(f"{k}@{'?' if v is None else v}" for k, v in r.index_catchup.items()) or "-"
        )
        print(
            f"{r.region_id:<38}{r.writer_epoch:>6}{len(r.flushed_generations):>6}"
            f"{r.merged_generation:>7}{r.unmerged_generations:>9}{r.unmerged_rows:>10,}"
            f"{r.merge_lag_seconds:>8.0f}{r.wal_entries:>6}"
            f"{_size(sum(r.storage_bytes.values())):>10}  {catchup}"
        )


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def cmd_merge(a: argparse.Namespace) -> None:
    r = mw.open_table(a.uri).merge()
    gens = sum(len(g) for g in r.merged.values())
    print(
        f"merged {gens} generation(s) from {len(r.merged)} region(s): {r.rows_upserted:,} rows "
        f"upserted, {r.rows_deleted:,} deleted, {r.conflicts} conflict(s), {r.seconds:.2f} s"
    )


def cmd_gc(a: argparse.Namespace) -> None:
    from datetime import timedelta

    older = (
        timedelta(seconds=a.base_versions_older_than)
        if a.base_versions_older_than is not None
        else None
    )
    r = mw.open_table(a.uri).gc(base_versions_older_than=older)
    print(
        f"deleted {sum(len(g) for g in r.generations.values())} generation(s), "
        f"{r.wal_entries} WAL entries, {r.orphan_directories} orphan directories, "
        f"{r.manifest_versions} manifest versions ({r.objects} objects)"
    )


def cmd_maintain(a: argparse.Namespace) -> None:
    import time
    from datetime import timedelta

    older = (
        timedelta(seconds=a.base_versions_older_than)
        if a.base_versions_older_than is not None
        else None
    )
    tbl = mw.open_table(a.uri)
    runs = 0
    with tqdm(desc="maintenance passes", unit="pass") as bar:
        while True:
            r = tbl.maintain(base_versions_older_than=older)
            runs += 1
            bar.set_postfix(
                merged=sum(len(g) for g in r.merge.merged.values()),
                indexed=len(r.indexes.optimized),
                regions=r.snapshots.regions,
                deleted=r.gc.objects,
            )
            bar.update(1)
            if a.watch is None or (a.iterations and runs >= a.iterations):
                break
            time.sleep(a.watch)


def cmd_verify(a: argparse.Namespace) -> None:
    tbl = mw.open_table(a.uri)
    with tqdm(desc="verifying", unit=" objects", disable=a.json) as bar:
        report = tbl.verify(progress=bar.update)
    if a.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
    if not report.ok:
        raise SystemExit(1)


def cmd_set_aside(a: argparse.Namespace) -> None:
    from memwal_sql.writer.wal import set_aside_damaged_entry

    tbl = mw.open_table(a.uri)
    to = set_aside_damaged_entry(tbl.store, a.region_id, a.position)
    print(
        f"moved the damaged WAL entry at position {a.position} of region {a.region_id} to "
        f"{tbl.store.uri_for(to)}; its rows are given up, and the next writer of the region "
        "takes its position"
    )


def cmd_demo(a: argparse.Namespace) -> None:
    from memwal_sql.demo import run_demo, run_spark_demo

    if a.spark:
        if not run_spark_demo(rows=min(a.rows, 200_000), regions=a.regions, uri=a.uri):
            raise SystemExit("spark demo check FAILED")
        return
    result = run_demo(rows=a.rows, regions=a.regions, uri=a.uri, durable=not a.no_durable)
    if not result.matches:
        raise SystemExit("demo check FAILED: stored rows differ from what was written")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="memwal", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="create a MemWAL table")
    c.add_argument("uri")
    c.add_argument("--from", dest="source", help="file or directory to take the schema from")
    c.add_argument("--with-data", action="store_true", help="also load --from as the base table")
    c.add_argument("--primary-key", required=True, help="column, or comma-separated columns")
    c.add_argument("--region-spec", help="bucket:COL:N | identity:COL | unsharded")
    c.set_defaults(func=cmd_create)
    i = sub.add_parser("ingest", help="upsert a file or directory of rows")
    i.add_argument("uri")
    i.add_argument("source")
    i.add_argument("--format", default="parquet", help="parquet | arrow | csv")
    i.add_argument("--batch-rows", type=int, default=10_000)
    i.add_argument("--no-durable", action="store_true")
    i.set_defaults(func=cmd_ingest)
    s = sub.add_parser("inspect", help="show regions, generations and WAL")
    s.add_argument("uri")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_inspect)
    m = sub.add_parser("merge", help="merge flushed generations into the base table")
    m.add_argument("uri")
    m.set_defaults(func=cmd_merge)
    for name, func, text in (
        ("gc", cmd_gc, "delete what no reader or writer can need"),
        (
            "maintain",
            cmd_maintain,
            "merge, index catch-up, region snapshots and gc, once or on a schedule",
        ),
    ):
        g = sub.add_parser(name, help=text)
        g.add_argument("uri")
        g.add_argument(
            "--base-versions-older-than",
            type=float,
            metavar="SECONDS",
            help="first drop base-table versions older than this",
        )
        if name == "maintain":
            g.add_argument(
                "--watch",
                type=float,
                metavar="SECONDS",
                help="repeat every SECONDS alongside live writers",
            )
            g.add_argument("--iterations", type=int, default=0, help="stop after N passes")
        g.set_defaults(func=func)
    v = sub.add_parser(
        "verify",
        help="check every manifest, WAL entry and generation file "
        "for damage (exit status 1 if any)",
    )
    v.add_argument("uri")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_verify)
    t = sub.add_parser(
        "set-aside",
        help="give up a damaged last WAL entry (a "
        "CorruptWalEntryError) by moving it to the region's torn_wal/",
    )
    t.add_argument("uri")
    t.add_argument("region_id")
    t.add_argument("position", type=int)
    t.set_defaults(func=cmd_set_aside)
    d = sub.add_parser("demo", help="stream 1M upserts into 4 regions and check the result")
    d.add_argument("--rows", type=int, default=1_000_000)
    d.add_argument("--regions", type=int, default=4)
    d.add_argument("--uri", help="where to write the table (default: a temporary directory)")
    d.add_argument("--no-durable", action="store_true")
    d.add_argument(
        "--spark",
        action="store_true",
        help="instead: ingest through Spark, read back with format('memwal'), query",
    )
    d.set_defaults(func=cmd_demo)
    a = p.parse_args(argv)
    try:
        a.func(a)
    except MemWalError as e:
        print(f"memwal: {type(e).__name__}: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
