"""The commands of pinned snapshots and the change feed: ``snapshot`` and ``changes``."""

from __future__ import annotations

import argparse
import os

import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

import memwal_sql as mw
from memwal_sql.cli import storage_options
from memwal_sql.cli.failures import UsageError
from memwal_sql.cli.output import text_table, write_rows

_TOKEN_PREFIX = "mw1."


def snapshot(a: argparse.Namespace) -> None:
    """Print a token of the table's state now (and tag it), list the tags, or remove one."""
    tbl = mw.open_table(a.uri, storage_options.from_args(a))
    try:
        if a.list:
            tags = tbl.tags()
            lines = [
                [name, s.base_version, s.taken_at.isoformat(timespec="seconds"), s.token]
                for name, s in tags.items()
            ]
            print(text_table(["tag", "base version", "taken at", "token"], lines))
        elif a.untag is not None:
            tbl.untag(a.untag)
            print(f"untagged {a.untag}: what only it kept goes at the next gc past the retention")
        else:
            snap = tbl.tag(a.tag) if a.tag else tbl.snapshot()
            print(snap.token)
    finally:
        tbl.close()


def resolve(tbl: mw.MemWalTable, token_or_tag: str) -> mw.PinnedSnapshot:
    """A snapshot of ``tbl`` given on the command line: a token (``mw1.``...) or a tag name."""
    if token_or_tag.startswith(_TOKEN_PREFIX):
        return tbl.snapshot(token_or_tag)
    return tbl.snapshot(tag=token_or_tag)


def changes(a: argparse.Namespace) -> None:
    """Print or write the changes between two snapshots."""
    tbl = mw.open_table(a.uri, storage_options.from_args(a))
    try:
        start = resolve(tbl, a.start)
        end = resolve(tbl, a.end) if a.end else tbl.snapshot()
        rows = tbl.changes(start, end, mode=a.mode)
    finally:
        tbl.close()
    if a.out is None:
        write_rows(rows, a.output)
        return
    ext = os.path.splitext(a.out)[1].lower()
    if ext == ".parquet":
        pq.write_table(rows, a.out)
    elif ext == ".csv":
        pa_csv.write_csv(rows, a.out)
    else:
        raise UsageError(f"--out {a.out!r}: write a .parquet or a .csv file")
    print(f"wrote {rows.num_rows} change(s) to {a.out}; the end snapshot is {end.token}")
