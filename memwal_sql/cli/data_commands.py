"""The commands that move rows: ``create``, ``ingest``, ``sql`` and ``lookup``."""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
from tqdm import tqdm

import memwal_sql as mw
from memwal_sql.cli import region_specs, storage_options
from memwal_sql.cli.failures import INTERRUPTED, CliError, UsageError, flatten, one_line
from memwal_sql.cli.keys import parse_keys
from memwal_sql.cli.output import write_rows
from memwal_sql.cli.snapshot_commands import resolve
from memwal_sql.cli.sources import Source, null_values, open_source
from memwal_sql.errors import MemWalError, TableExistsError, TableNotFoundError
from memwal_sql.storage import layout

_T = TypeVar("_T")


def create(a: argparse.Namespace) -> None:
    spec = region_specs.parse(a.region_spec) if a.region_spec else None
    keys = names(a.primary_key, "--primary-key")
    if a.with_data and a.source is None:
        raise UsageError("--with-data loads the rows of --from FILE; give --from FILE")
    path = a.source or a.schema_from
    data: pa.Schema | pa.Table | None = None
    if path is not None:
        src = open_source(path, a.format, nulls=null_values(a.null_values))
        missing = [k for k in keys if k not in src.schema.names]
        if missing:
            raise CliError(
                f"primary key column(s) {', '.join(missing)} not in {path}; its columns are "
                f"{', '.join(src.schema.names)}"
            )
        data = _key_not_null(src.to_table() if a.with_data else src.schema, keys, path)
    try:
        tbl = mw.create_table(
            a.uri,
            data,
            primary_key=keys,
            region_spec=spec,
            storage_options=storage_options.from_args(a),
            data_storage_version=a.data_storage_version,
            allow_non_key_region_spec=a.allow_non_key_region_spec,
            sequence_column=a.sequence_column,
        )
    except TableExistsError:
        raise CliError(
            f"a table already exists at {a.uri}; write to it with `memwal ingest {a.uri} FILE` "
            f"or look at it with `memwal inspect {a.uri}`"
        ) from None
    except TableNotFoundError:
        if data is not None:
            raise
        raise CliError(
            f"no Lance table at {a.uri} to enable MemWAL on; give --schema-from FILE or "
            "--from FILE to create a new table"
        ) from None
    with tbl:
        rows = ""
        if isinstance(data, pa.Table):
            stored = tbl.dataset().count_rows()
            rows = f", {stored:,} rows"
            if stored < data.num_rows:  # create_table keeps one row of a repeated key
                rows += f" ({data.num_rows - stored:,} older rows of repeated keys replaced)"
        regions = tbl.region_spec.describe() if tbl.region_spec else "manual regions"
        sequence = f", ordered by {tbl.sequence_column}" if tbl.sequence_column else ""
        print(
            f"created {tbl.uri}: primary key ({', '.join(tbl.primary_key)}), {regions}"
            f"{sequence}{rows}"
        )


def _key_not_null(data: pa.Schema | pa.Table, keys: Sequence[str], path: str) -> Any:
    """``data`` with its key columns non-nullable (CSV and JSON infer every column nullable)."""
    schema = data if isinstance(data, pa.Schema) else data.schema
    fields = [f.with_nullable(False) if f.name in keys else f for f in schema]
    schema = pa.schema(fields, metadata=schema.metadata)
    if isinstance(data, pa.Schema):
        return schema
    for k in keys:
        nulls = data.column(k).null_count
        if nulls:
            raise CliError(
                f"primary key column {k} is empty in {nulls:,} row(s) of {path}; every row "
                "needs a key"
            )
    return data.cast(schema)


def ingest(a: argparse.Namespace) -> None:
    if a.batch_rows < 1:
        raise UsageError("--batch-rows must be at least 1")
    tbl = mw.open_table(a.uri, storage_options.from_args(a))
    tbl.writer_config = tbl.writer_config.with_overrides(durable_write=not a.no_durable)
    types = {f.name: f.type for f in tbl.schema}
    # Every file is opened (and its columns checked) before anything is written.
    plan = [
        (src, _ingest_columns(tbl, src, a.delete))
        for src in (open_source(p, a.format, types, null_values(a.null_values)) for p in a.files)
    ]
    known = [src.known_rows() for src, _ in plan]
    total = None if None in known else sum(n or 0 for n in known)
    written, regions, at = 0, 0, (plan[0][0].path, 0)
    try:
        with tqdm(
            total=total,
            unit=" rows",
            unit_scale=True,
            desc="deleting" if a.delete else "upserting",
            disable=None,  # only on a terminal
            file=sys.stderr,
        ) as bar:
            for src, columns in plan:
                at = (src.path, 0)
                for batch in src.batches(a.batch_rows, columns):
                    if a.delete:
                        tbl.delete(pa.Table.from_batches([batch]))
                    else:
                        tbl.upsert(batch)
                    written += batch.num_rows
                    at = (src.path, at[1] + batch.num_rows)
                    bar.update(batch.num_rows)
            regions = len(tbl.live_writers())
        tbl.close()
    except (MemWalError, CliError) as e:
        _close_quietly(tbl)
        raise CliError(
            f"{one_line(e)} ({written:,} row(s) of this run were written before the failure)"
        ) from e
    except KeyboardInterrupt:
        _close_quietly(tbl)  # flushes what was acknowledged
        # Python raises the interrupt between two steps: the write under way may have landed.
        raise KeyboardInterrupt(
            f"{written:,} row(s) of this run were written durably (up to row {at[1]:,} of "
            f"{at[0]}; the write under way may have landed too). To resume, run the same "
            f"command again: {'deleting' if a.delete else 'upserting'} a row twice gives "
            "the same table"
        ) from None
    except BaseException:
        _close_quietly(tbl)
        raise
    what = f"deleted {written:,} key(s)" if a.delete else f"upserted {written:,} row(s)"
    durable = "" if not a.no_durable else " (not durable: acknowledged before the WAL put)"
    print(f"{what} from {len(plan)} file(s) in {regions} region(s) of {a.uri}{durable}")


def _ingest_columns(tbl: Any, src: Source, delete: bool) -> list[str] | None:
    """The columns of ``src`` to read: all (upserts), or the key and region-spec columns
    (deletes); a :class:`CliError` if ``src`` lacks one or has one the table does not."""
    have = src.schema.names
    key = list(tbl.primary_key)
    missing = [k for k in key if k not in have]
    if missing:
        raise CliError(
            f"{src.path} has no primary key column(s) {', '.join(missing)}; its columns are "
            f"{', '.join(have)}"
        )
    if delete:
        needed = [c for c in tbl.delete_columns if c not in key]
        lacking = [c for c in needed if c not in have]
        if lacking:
            raise CliError(
                f"deleting from {src.path} needs the column(s) {', '.join(lacking)} too: the "
                "table's regions are split by them, or orders writes by its sequence column"
            )
        return key + needed
    unknown = [c for c in have if c not in tbl.schema.names]
    if unknown:
        raise CliError(
            f"{src.path} has column(s) {', '.join(unknown)} the table does not have; its "
            f"columns are {', '.join(tbl.schema.names)}"
        )
    return None


def _close_quietly(tbl: Any) -> None:
    try:
        tbl.close()  # what was acknowledged is flushed; the first error is the one reported
    except Exception:
        pass


def sql(a: argparse.Namespace) -> None:
    options = storage_options.from_args(a)
    if a.default_schema is not None and a.namespace is None:
        raise UsageError("--default-schema names a schema of a namespace: give --namespace ROOT")
    ns = mw.namespace(a.namespace, options) if a.namespace is not None else None
    ctx = mw.connect(
        trusted=a.trusted, read_only=a.read_only, namespace=ns, default_schema=a.default_schema
    )
    tables = []
    named = _named_tables(a.table)
    as_of = _as_of(a.as_of, [name for name, _ in named])
    for name, uri in named:
        tables.append(mw.open_table(uri, options))
        at = as_of.get(name)
        ctx.register(name, tables[-1] if at is None else resolve(tables[-1], at))
    try:
        rows = _interruptible(lambda: ctx.sql(a.query).to_arrow_table())
    except MemWalError:
        raise
    except Exception as e:  # DataFusion's errors at execution: ValueError, or a plain Exception
        raise CliError(f"query failed: {flatten(str(e))}") from None
    finally:
        for tbl in tables:
            _close_quietly(tbl)  # a write's rows flushed, its writers released
    if rows.column_names == ["plan_type", "plan"] and a.output == "table":
        _print_plans(rows)  # EXPLAIN: multi-line plans, which a table cell would cut short
    else:
        write_rows(rows, a.output)


def _as_of(specs: Sequence[str], names: Sequence[str]) -> dict[str, str]:
    """Table name -> snapshot of each ``--as-of [NAME=]SNAPSHOT``."""
    out = {}
    for spec in specs:
        named = _NAME.match(spec)
        if named is not None and not spec.startswith("mw1."):
            name, snap = named.group(1), named.group(2)
        elif len(names) == 1:
            name, snap = names[0], spec
        else:
            raise UsageError(
                f"--as-of {spec}: name the table it reads, NAME=SNAPSHOT (the tables are "
                f"{', '.join(names) or 'none'})"
            )
        if name not in names:
            raise UsageError(
                f"--as-of {spec}: no --table {name}; the tables are {', '.join(names)}"
            )
        out[name] = snap
    return out


def _print_plans(rows: pa.Table) -> None:
    kinds, plans = rows.column("plan_type").to_pylist(), rows.column("plan").to_pylist()
    print(
        "\n\n".join(f"{k}:\n{textwrap.indent(str(p).rstrip(), '  ')}" for k, p in zip(kinds, plans))
    )


def _interruptible(query: Callable[[], _T]) -> _T:
    """``query()``, run on a thread of its own so that Ctrl-C stops the wait for it.

    DataFusion's collect never returns to Python until the query ends, so a SIGINT would
    wait for a query that may run for hours. On Ctrl-C the process ends at once with status
    130: a read holds nothing to save, and a normal exit would wait for the query's threads.
    """
    done: list[_T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(query())
        except BaseException as e:
            failed.append(e)

    worker = threading.Thread(target=run, name="memwal-sql-query", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        print("memwal: interrupted", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(INTERRUPTED)
    if failed:
        raise failed[0]
    return done[0]


_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.+)$")


def _named_tables(specs: Sequence[str]) -> list[tuple[str, str]]:
    """(name, uri) of each ``--table [NAME=]URI``; a local directory that is no table but
    holds tables gives each of them, named by its directory."""
    out: dict[str, str] = {}

    def add(name: str, uri: str) -> None:
        if name in out:
            raise UsageError(f"--table {name} is given twice; name one of them: NAME=URI")
        out[name] = uri

    for spec in specs:
        named = _NAME.match(spec)
        if named is not None:
            add(named.group(1), named.group(2))
            continue
        path = spec.removeprefix("file://")
        if "://" not in path and os.path.isdir(path) and not _is_lance(path):
            tables = sorted(e.name for e in os.scandir(path) if _is_lance(e.path))
            if not tables:
                raise CliError(f"no tables in {spec}; give --table NAME=URI for each")
            for name in tables:
                add(name, os.path.join(spec, name))
            continue
        name = os.path.basename(spec.rstrip("/"))
        if not _NAME.match(f"{name}=x"):
            raise UsageError(
                f"bad --table {spec!r}: {name!r} is no SQL name; write NAME=URI, e.g. "
                "events=s3://bucket/events"
            )
        add(name, spec)
    return list(out.items())


def _is_lance(path: str) -> bool:
    return os.path.isdir(os.path.join(path, layout.VERSIONS_DIR))


def delete(a: argparse.Namespace) -> None:
    tbl = mw.open_table(a.uri, storage_options.from_args(a))
    try:
        n = _interruptible(lambda: tbl.delete(filter=a.where))
    finally:
        _close_quietly(tbl)
    print(f"memwal: deleted {n:,} row(s)", file=sys.stderr)


def lookup(a: argparse.Namespace) -> None:
    tbl = mw.open_table(a.uri, storage_options.from_args(a))
    columns = names(a.columns, "--columns") if a.columns else None
    unknown = [c for c in columns or () if c not in tbl.schema.names]
    if unknown:
        raise CliError(
            f"no column(s) {', '.join(unknown)} in {a.uri}; its columns are "
            f"{', '.join(tbl.schema.names)}"
        )
    keys = parse_keys(a.keys, tbl.schema, tbl.primary_key)
    rows = tbl.lookup(keys, columns=columns)
    write_rows(rows, a.output)
    wanted = keys.group_by(list(keys.column_names)).aggregate([]).num_rows
    if rows.num_rows < wanted:
        print(f"memwal: found {rows.num_rows} of {wanted} key(s)", file=sys.stderr)


def names(text: str, option: str) -> list[str]:
    """Comma-separated column names."""
    out = [n.strip() for n in text.split(",")]
    if not all(out):
        raise UsageError(f"bad {option} {text!r}: write comma-separated column names, e.g. a,b")
    return out
