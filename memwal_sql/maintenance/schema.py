"""Schema evolution: nullable columns added, non-null columns made nullable, while writers write.

The table's schema is its base table's: a change is one Lance commit (``add_columns``,
``alter_columns``) on the base, which Lance 14 allows on a MemWAL table because it rewrites no
data. WAL entries, generations and the MemTables of writers opened before the change keep the
schema they were written in, and every read and merge takes them into the new one (a missing
column NULL: ``formats.source_rows.conform``, ``formats.wal.conform_batch``).

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.table({"id": [1], "n": [2]}), primary_key="id")
    >>> tbl.add_columns({"note": pa.string()})
    >>> tbl.to_arrow().to_pylist()
    [{'id': 1, 'n': 2, 'note': None}]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lance
import pyarrow as pa

from memwal_sql.compat.lance import is_commit_conflict
from memwal_sql.errors import CommitConflictError, SchemaMismatchError
from memwal_sql.formats.source_rows import GEN, ROWADDR
from memwal_sql.formats.wal import TOMBSTONE
from memwal_sql.storage import storage_error
from memwal_sql.table_state import TableState

_RESERVED = (TOMBSTONE, GEN, ROWADDR, "_rowid", "_distance", "_score")
_ATTEMPTS = 5  # commits lost to concurrent merges before the change gives up


def add_columns(table: TableState, columns: Mapping[str, pa.DataType] | Sequence[pa.Field]) -> None:
    """Add nullable ``columns`` to ``table``, NULL in every row written before.

    Example:
        ``add_columns(tbl, {"score": pa.float64(), "tags": pa.list_(pa.string())})``
    """
    fields = (
        [pa.field(n, t) for n, t in columns.items()]
        if isinstance(columns, Mapping)
        else list(columns)
    )
    if not fields:
        raise SchemaMismatchError("add_columns needs at least one column")
    table.follow_schema(table.dataset())  # checked against the latest schema, not this table's
    names = [f.name for f in fields]
    for f in fields:
        if f.name in table.schema.names or names.count(f.name) > 1:
            raise SchemaMismatchError(f"column {f.name!r} exists already: give a new name")
        if f.name in _RESERVED:
            raise SchemaMismatchError(f"{f.name!r} is a name memwal-sql reserves: choose another")
        if not f.nullable:
            raise SchemaMismatchError(
                f"column {f.name!r} must be nullable: every row written before has no value"
            )
    _commit(table, lambda ds: ds.add_columns(pa.schema(fields)))


def alter_columns(table: TableState, *changes: Mapping[str, Any]) -> None:
    """Make columns of ``table`` nullable, each change as Lance's ``alter_columns`` takes it:
    ``{"path": name, "nullable": True}``. A key column stays non-nullable.

    A new ``data_type`` is refused: Lance 14 refuses to change a column's type on a table with
    a MemWAL (a cast gives the column a new field id, which rows in the WAL cannot be matched
    to). Add a column of the new type and fill it through the writers instead, e.g.
    ``tbl.add_columns({"n64": pa.int64()})`` then ``UPDATE t SET n64 = n`` in SQL.

    Example:
        ``alter_columns(tbl, {"path": "score", "nullable": True})``
    """
    if not changes:
        raise SchemaMismatchError("alter_columns needs at least one change")
    table.follow_schema(table.dataset())
    for change in changes:
        name = change.get("path")
        if "data_type" in change:
            raise SchemaMismatchError(
                f"column {name!r} cannot change type: Lance 14 refuses to on a table with a "
                "MemWAL (a cast gives the column a new field id that rows in the WAL cannot be "
                f"matched to). Add a column of the new type and fill it: tbl.add_columns("
                f'{{"{name}_new": ...}}), then UPDATE t SET {name}_new = {name}'
            )
        unknown = set(change) - {"path", "nullable"}
        if unknown:
            raise SchemaMismatchError(
                f"alter_columns makes a column nullable, it does not change {sorted(unknown)} "
                "(a renamed or dropped column would break the rows written before)"
            )
        if name not in table.schema.names:
            raise SchemaMismatchError(
                f"no column {name!r} to alter; the columns are {table.schema.names}"
            )
        if change.get("nullable") is not True:
            raise SchemaMismatchError(
                f"column {name!r} can become nullable (nullable=True), not non-nullable: rows "
                "written before may hold NULL"
            )
        if name in table.primary_key:
            raise SchemaMismatchError(f"{name!r} is a key column: a key is never NULL")
    nullable = [{"path": c["path"], "nullable": True} for c in changes]
    # pylance annotates each alteration as an iterable of them; it takes the dicts.
    _commit(table, lambda ds: ds.alter_columns(*nullable))  # type: ignore[arg-type]


def _commit(table: TableState, change: Callable[[lance.LanceDataset], Any]) -> None:
    """Apply ``change`` to the latest base version, again on a newer one if a merge committed
    first; then ``table`` (reads, and writers opened from now on) takes the new schema."""
    for _ in range(_ATTEMPTS):
        ds = table.dataset()
        try:
            change(ds)
        except OSError as e:
            if is_commit_conflict(e):
                continue
            if "Invalid user input" in str(e):
                raise SchemaMismatchError(f"Lance refused the schema change: {e}") from e
            raise storage_error(f"changing the schema of {table.uri}", e) from e
        table.follow_schema(table.dataset())
        return
    raise CommitConflictError(
        f"the schema change of {table.uri} lost {_ATTEMPTS} commits to concurrent merges; retry"
    )
