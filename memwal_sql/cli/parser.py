"""The ``memwal`` command tree: each subcommand's arguments, help and examples."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from typing import Any

import memwal_sql
from memwal_sql.cli import (
    data_commands,
    ops_commands,
    region_specs,
    snapshot_commands,
    storage_options,
)
from memwal_sql.cli.output import OUTPUT_HELP, OUTPUTS
from memwal_sql.cli.sources import FORMAT_HELP, FORMATS, NULL_VALUES_HELP
from memwal_sql.maintenance.config import MaintenanceConfig
from memwal_sql.table import DATA_STORAGE_VERSIONS

DESCRIPTION = """\
memwal: streaming upserts into Lance tables through MemTables and a write-ahead log (MemWAL),
read with SQL.

A table lives at a local path, file:// or s3:// URI; object-store settings (endpoint,
credentials) go in --storage-options KEY=VALUE or --storage-options-file FILE."""

EPILOG = """\
examples:
  memwal create ./events --primary-key id --from events.parquet --region-spec bucket:id:4
  memwal ingest ./events more.csv updates.jsonl
  memwal sql "SELECT count(*) FROM events" --table events=./events
  memwal sql "SELECT 1 + 1"
  memwal delete ./events --where "ts < '2026-01-01'"
  memwal lookup ./events 42 43 --columns id,user
  memwal snapshot ./events --tag nightly
  memwal changes ./events --from nightly --out changes.parquet
  memwal inspect ./events
  memwal maintain ./events --watch 60

Lance's own (Rust) log is off unless LANCE_LOG is set, e.g. LANCE_LOG=warn."""


def _verbose(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="log what memwal-sql does (-v: info, -vv: debug) on stderr",
    )


def build() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memwal",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _verbose(p, 0)
    p.add_argument("--version", action="version", version=f"memwal {memwal_sql.__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    # Also after the command; SUPPRESS keeps a -v given before it.
    _verbose(common, argparse.SUPPRESS)
    table = argparse.ArgumentParser(add_help=False)
    storage_options.add_arguments(table)

    def command(
        name: str, run: Callable[[argparse.Namespace], None], summary: str, examples: str,
        opens_table: bool = True,
    ) -> argparse.ArgumentParser:  # fmt: skip
        c = sub.add_parser(
            name,
            help=summary,
            description=textwrap.fill(summary, 79),
            epilog="examples:\n" + examples,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[common, table] if opens_table else [common],
        )
        c.set_defaults(run=run)
        return c

    _create(command)
    _ingest(command)
    _delete(command)
    _sql(command)
    _lookup(command)
    _snapshot(command)
    _changes(command)
    _inspect(command)
    _maintenance(command)
    _repair(command)
    return p


def _uri(c: argparse.ArgumentParser) -> None:
    c.add_argument("uri", metavar="URI", help="the table: a local path, file:// or s3:// URI")


def _output(c: argparse.ArgumentParser) -> None:
    c.add_argument("-o", "--output", choices=OUTPUTS, default="table", help=OUTPUT_HELP)


def _create(command: Any) -> None:
    c = command(
        "create",
        data_commands.create,
        "create a MemWAL table, its schema (or schema and rows) from a file; with no file, "
        "enable MemWAL on the existing Lance table at URI",
        "  memwal create ./events --primary-key id --schema-from sample.csv\n"
        "  memwal create ./events --primary-key id --from events.parquet --with-data \\\n"
        "      --region-spec bucket:id:8\n"
        "  memwal create s3://bucket/orders --primary-key tenant,order_id --from orders.jsonl \\\n"
        "      --region-spec identity:tenant+bucket:order_id:4 \\\n"
        "      --storage-options-file s3.env\n"
        "  memwal create ./logs --primary-key id --from logs.arrow --region-spec day:ts \\\n"
        "      --allow-non-key-region-spec --data-storage-version 2.0\n"
        "  memwal create ./m --primary-key id --from m.csv \\\n"
        "      --region-spec 'expression:id:int64:col0 % 10'\n"
        "  memwal create ./orders --primary-key id --from orders.parquet --sequence-column lsn\n"
        "  memwal create ./existing-lance-table --primary-key id",
    )
    _uri(c)
    c.add_argument(
        "--primary-key",
        required=True,
        metavar="COLS",
        help="key column, or comma-separated columns",
    )
    src = c.add_mutually_exclusive_group()
    src.add_argument("--schema-from", metavar="FILE", help="take the schema from FILE (no rows)")
    src.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="take the schema from FILE (a file or a directory of files)",
    )
    c.add_argument(
        "--with-data", action="store_true", help="also load the rows of --from FILE as the table"
    )
    c.add_argument("--format", choices=FORMATS, help=FORMAT_HELP)
    c.add_argument("--null-values", metavar="LIST", help=NULL_VALUES_HELP)
    c.add_argument("--region-spec", metavar="SPEC", help=region_specs.HELP)
    c.add_argument(
        "--allow-non-key-region-spec",
        action="store_true",
        help="let --region-spec read columns outside the primary key, for rows that never "
        "change them: a write that moves a key to another region is then refused, and reads "
        "check that no key is in two regions",
    )
    c.add_argument(
        "--sequence-column",
        metavar="COL",
        help="order each key's writes by COL (an integer, decimal, date, timestamp or string "
        "column): the row with the highest value wins, whatever order writes arrive in",
    )
    c.add_argument(
        "--data-storage-version",
        choices=DATA_STORAGE_VERSIONS,
        help="Lance file format of the new table (default: Lance's, 2.2); 2.0 scans "
        "faster and takes more bytes (README, 'Lance file format')",
    )


def _ingest(command: Any) -> None:
    c = command(
        "ingest",
        data_commands.ingest,
        "upsert the rows of files into a table (or, with --delete, delete their keys); "
        "each write is durable (in the WAL) before the next",
        "  memwal ingest ./events day1.parquet day2.parquet\n"
        "  memwal ingest ./events exports/ --format csv --batch-rows 50000\n"
        "  memwal ingest ./events gone.csv --delete\n"
        "  memwal ingest ./events export.csv --null-values 'NA,null'\n"
        "  memwal ingest s3://bucket/events new.jsonl --storage-options aws_region=eu-west-1",
    )
    _uri(c)
    c.add_argument("files", nargs="+", metavar="FILE", help="a file or a directory of files")
    c.add_argument("--format", choices=FORMATS, help=FORMAT_HELP)
    c.add_argument("--null-values", metavar="LIST", help=NULL_VALUES_HELP)
    c.add_argument(
        "--delete", action="store_true", help="delete the keys in FILE (only key columns needed)"
    )
    c.add_argument(
        "--batch-rows", type=int, default=10_000, metavar="N", help="rows per write (10000)"
    )
    c.add_argument(
        "--no-durable",
        action="store_true",
        help="acknowledge writes before their WAL put (faster; a crash may lose the last ones)",
    )


def _delete(command: Any) -> None:
    c = command(
        "delete",
        data_commands.delete,
        "delete every key whose latest row matches a SQL predicate (judged on the rows as "
        "the command reads them); prints how many",
        "  memwal delete ./events --where \"ts < '2026-01-01'\"\n"
        "  memwal delete ./events --where \"status = 'cancelled' AND amount IS NULL\"",
    )
    _uri(c)
    c.add_argument("--where", required=True, metavar="PREDICATE", help="a SQL predicate")


def _sql(command: Any) -> None:
    c = command(
        "sql",
        data_commands.sql,
        "run a SQL statement (DataFusion) over the tables given by --table (none, one or "
        "more); every acknowledged write is seen. EXPLAIN prints the plan as text. "
        "INSERT INTO (an upsert), UPDATE and DELETE FROM write MemWAL tables durably and "
        "print the rows they affected",
        "  memwal sql \"SELECT count(*) FROM events\" --table events=./events\n"
        "  memwal sql \"DELETE FROM events WHERE ts < '2026-01-01'\" --table ./events\n"
        "  memwal sql \"SELECT count(*) FROM events JOIN users USING (uid)\" --table ./data\n"
        "  memwal sql \"EXPLAIN SELECT * FROM events WHERE id = 42\" --table ./events\n"
        "  memwal sql \"SELECT u.name, count(*) AS n FROM events e JOIN users u ON e.uid = u.id\n"
        "              GROUP BY u.name ORDER BY n DESC LIMIT 10\" \\\n"
        "      --table events=s3://bucket/events --table users=s3://bucket/users \\\n"
        "      --storage-options-file s3.env --output csv\n"
        "  memwal sql \"SELECT * FROM t WHERE id = 42\" --table t=./events --output json\n"
        "  memwal sql \"SELECT * FROM sales.orders o JOIN sales.lineitem l ON l.oid = o.id\" \\\n"
        "      --namespace ./warehouse",
    )  # fmt: skip
    c.add_argument("query", metavar="QUERY", help="the SQL query")
    c.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="[NAME=]URI",
        help="register the table at URI under NAME (default: the last part of URI); a local "
        "directory that is not a table registers each table in it by its directory name "
        "(repeat for more tables)",
    )
    c.add_argument(
        "--read-only",
        action="store_true",
        help="refuse INSERT, UPDATE and DELETE: run queries only",
    )
    c.add_argument(
        "--namespace",
        metavar="ROOT",
        help="resolve tables in the Lance directory namespace at ROOT: schema.table names a "
        "table of a namespace in it, an unqualified name one of --default-schema (else the "
        "root's own)",
    )
    c.add_argument(
        "--default-schema", metavar="NAME", help="with --namespace: the schema of unqualified names"
    )
    c.add_argument(
        "--as-of",
        action="append",
        default=[],
        metavar="[NAME=]SNAPSHOT",
        help="read table NAME (the only table, without NAME) as of a snapshot: a token from "
        "'memwal snapshot' or a tag name (repeat for more tables)",
    )
    c.add_argument(
        "--trusted",
        action="store_true",
        help="allow every DataFusion statement (CREATE EXTERNAL TABLE, COPY, SET, ...), "
        "not only queries: they read and write any path this process can",
    )
    _output(c)


def _lookup(command: Any) -> None:
    c = command(
        "lookup",
        data_commands.lookup,
        "the latest row of each primary key (absent and deleted keys are left out)",
        "  memwal lookup ./events 42 43 44\n"
        "  memwal lookup ./events 42 --columns user,amount --output json\n"
        "  memwal lookup ./orders acme,1001 zeta,7   # composite key (tenant, order_id)",
    )
    _uri(c)
    c.add_argument(
        "keys",
        nargs="+",
        metavar="KEY",
        help="a key value; a composite key's parts comma-separated (a,b)",
    )
    c.add_argument("--columns", metavar="COLS", help="comma-separated columns to show")
    _output(c)


def _snapshot(command: Any) -> None:
    c = command(
        "snapshot",
        snapshot_commands.snapshot,
        "print a token of the table's state now, which 'sql --as-of' and 'changes' read later "
        "(while GC keeps it: base_versions_older_than); --tag NAME keeps it until untagged",
        "  memwal snapshot ./events\n"
        "  memwal snapshot ./events --tag before-backfill\n"
        "  memwal snapshot ./events --list\n"
        "  memwal snapshot ./events --untag before-backfill",
    )
    _uri(c)
    what = c.add_mutually_exclusive_group()
    what.add_argument("--tag", metavar="NAME", help="also keep the snapshot as tag NAME")
    what.add_argument("--list", action="store_true", help="list the tags and their tokens")
    what.add_argument("--untag", metavar="NAME", help="remove tag NAME")


def _changes(command: Any) -> None:
    c = command(
        "changes",
        snapshot_commands.changes,
        "the changes between two snapshots (tokens or tag names; --to defaults to now): the "
        "table's columns plus _change_type and _commit_position",
        "  memwal changes ./events --from mw1.eNrj...\n"
        "  memwal changes ./events --from nightly --to mw1.eNrj... --mode all --output csv\n"
        "  memwal changes ./events --from nightly --out changes.parquet",
    )
    _uri(c)
    c.add_argument("--from", dest="start", required=True, metavar="SNAPSHOT", help="the start")
    c.add_argument("--to", dest="end", metavar="SNAPSHOT", help="the end (default: now)")
    c.add_argument(
        "--mode",
        choices=("net", "all"),
        default="net",
        help="net: each changed key's row at the start and at the end (default); all: every "
        "write in order",
    )
    c.add_argument("--out", metavar="FILE", help="write to FILE (.parquet or .csv), not stdout")
    _output(c)


def _inspect(command: Any) -> None:
    c = command(
        "inspect",
        ops_commands.inspect,
        "show each region: writer epoch, generations, unmerged rows, merge lag, WAL entries, "
        "unflushed WAL rows, idle time, storage and index catch-up; with --watch, the "
        "table's metrics live",
        "  memwal inspect ./events\n  memwal inspect s3://bucket/events --json | jq .regions\n"
        "  memwal inspect ./events --watch 2",
    )
    _uri(c)
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="show the metrics (tbl.metrics()) every SECONDS until stopped (Ctrl-C); with "
        "--json, one JSON line each time",
    )
    c.add_argument(
        "--iterations", type=int, default=0, metavar="N", help="with --watch: stop after N views"
    )


_DEFAULTS = MaintenanceConfig()


def _older_than(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--keep-manifest-versions",
        type=int,
        default=_DEFAULTS.keep_manifest_versions,
        metavar="N",
        help=f"region manifest versions to keep ({_DEFAULTS.keep_manifest_versions})",
    )
    retention = _DEFAULTS.base_versions_older_than
    c.add_argument(
        "--base-versions-older-than",
        type=float,
        metavar="SECONDS",
        help="first drop base-table versions superseded longer ago than this "
        f"({retention.total_seconds():.0f}; tagged versions stay)"
        if retention is not None
        else "first drop base-table versions superseded longer ago than this",
    )


def _compaction(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--target-rows-per-fragment",
        type=int,
        default=_DEFAULTS.target_rows_per_fragment,
        metavar="N",
        help="merge smaller base-table fragments up to N rows "
        f"({_DEFAULTS.target_rows_per_fragment:,})",
    )
    c.add_argument(
        "--deletion-threshold",
        type=float,
        default=_DEFAULTS.deletion_threshold,
        metavar="SHARE",
        help="rewrite a fragment once this share of its rows is deleted "
        f"({_DEFAULTS.deletion_threshold}; 0 removes every deletion vector)",
    )


def _regions(c: argparse.ArgumentParser, help: str) -> None:
    c.add_argument("--region", dest="regions", action="append", metavar="REGION", help=help)


def _maintenance(command: Any) -> None:
    c = command(
        "merge",
        ops_commands.merge,
        "merge flushed generations into the base table",
        "  memwal merge ./events\n"
        "  memwal merge ./events --region 0b7c...-older-region --region 5e1f...-newer-region",
    )
    _uri(c)
    _regions(
        c,
        "merge only this region (repeatable), in the order given: where two of them hold "
        "one key (KeyInTwoRegionsError), the last one's version wins",
    )
    c = command(
        "flush",
        ops_commands.flush,
        "fold WAL rows no generation holds (a writer that exited without close) into "
        "generations now: claim, replay, flush and release each region that has some "
        "(fencing a live writer of it)",
        "  memwal flush ./events\n  memwal flush ./events --region 0b7c...-region-id",
    )
    _uri(c)
    _regions(c, "flush only this region (repeatable)")
    c = command(
        "compact",
        ops_commands.compact,
        "rewrite the base table's small fragments into bigger ones, and those with deleted rows "
        "(merges leave both; scans of them are slower) without them",
        "  memwal compact ./events\n  memwal compact ./events --deletion-threshold 0",
    )
    _uri(c)
    _compaction(c)
    c = command(
        "gc",
        ops_commands.gc,
        "delete what no reader or writer can need: merged generations, replayed WAL entries, "
        "orphans and old manifest versions; says what it kept and why",
        "  memwal gc ./events\n  memwal gc ./events --base-versions-older-than 3600",
    )
    _uri(c)
    _older_than(c)
    c = command(
        "maintain",
        ops_commands.maintain,
        "flush of idle regions' WAL rows, merge, index catch-up, compaction, region snapshots "
        "and gc: once, N times, or every SECONDS alongside live writers (Ctrl-C stops --watch)",
        "  memwal maintain ./events\n"
        "  memwal maintain s3://bucket/events --watch 60 --storage-options-file s3.env\n"
        "  memwal maintain ./events --watch 5 --iterations 12",
    )
    _uri(c)
    c.add_argument(
        "--watch", type=float, metavar="SECONDS", help="repeat every SECONDS until stopped"
    )
    c.add_argument("--iterations", type=int, default=0, metavar="N", help="stop after N passes")
    idle = _DEFAULTS.recover_regions_idle_for
    c.add_argument(
        "--recover-regions-idle-for",
        type=float,
        metavar="SECONDS",
        help="flush the WAL rows of a region whose writer is gone once it has seen no write "
        f"for this long ({idle.total_seconds() if idle else 0:.0f}); it fences a writer "
        "quieter than that",
    )
    _older_than(c)
    _compaction(c)


def _repair(command: Any) -> None:
    c = command(
        "verify",
        ops_commands.verify,
        "check every manifest, WAL entry and generation file for damage (exit status 1 if any)",
        "  memwal verify ./events\n  memwal verify s3://bucket/events --json",
    )
    _uri(c)
    c.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    c = command(
        "set-aside",
        ops_commands.set_aside,
        "give up a damaged last WAL entry (a CorruptWalEntryError) by moving it to the "
        "region's torn_wal/",
        "  memwal set-aside ./events 0b7c...-region-id 17",
    )
    _uri(c)
    c.add_argument("region_id", metavar="REGION", help="the region id (a UUID)")
    c.add_argument("position", metavar="POSITION", type=int, help="the WAL entry's position")
    c = command(
        "demo",
        ops_commands.demo,
        "stream 1M upserts into 4 regions and check the result",
        "  memwal demo\n  memwal demo --rows 100000 --regions 2\n  memwal demo --spark",
        opens_table=False,
    )
    c.add_argument("--rows", type=int, default=1_000_000)
    c.add_argument("--regions", type=int, default=4)
    c.add_argument("--uri", help="where to write the table (default: a temporary directory)")
    c.add_argument("--no-durable", action="store_true")
    c.add_argument(
        "--spark",
        action="store_true",
        help="instead: ingest through Spark, read back with format('memwal'), query",
    )
