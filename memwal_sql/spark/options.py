"""The ``memwal`` source's options: the table they open and the columns a read returns.

Every option the source does not know is a storage option (``aws_*``...).

Example:
    ``open_table({"path": uri}).schema``
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from memwal_sql.errors import InvalidInputError

if TYPE_CHECKING:
    from memwal_sql.table import MemWalTable

_OPTIONS = {
    "path",
    "columns",
    "consistency",
    "partitions",
    "operation",
    "version",
    "summary_path",
    "operation_column",
    "checkpointLocation",
    "checkpointlocation",
    "mergeSchema",
    "mergeschema",
    "format",
    "value_column",
    "asOf",
    "asof",
    "readChangeFeed",
    "readchangefeed",
    "mode",
    "startingSnapshot",
    "startingsnapshot",
    "startingTimestamp",
    "startingtimestamp",
    "endingSnapshot",
    "endingsnapshot",
    "maxRowsPerTrigger",
    "maxrowspertrigger",
    "namespace",
}


def option(options: dict[str, str], name: str, default: str | None = None) -> str | None:
    """Option ``name`` (Spark hands options over with lower-case names; a caller in Python may
    spell them as documented), else ``default``.

    Example:
        ``option({"asof": "mw1.x"}, "asOf")  # 'mw1.x'``
    """
    return options.get(name, options.get(name.lower(), default))


def open_table(options: dict[str, str]) -> MemWalTable:
    """The table ``options`` name (``path``), opened with the storage options among them.

    Example:
        ``open_table({"path": "/data/events", "aws_region": "eu-west-1"})``
    """
    import memwal_sql as mw

    uri = options.get("path")
    if not uri:
        raise InvalidInputError(
            "no table: use .load(uri) or .save(uri), or with option('namespace', root) "
            ".load('schema.table')"
        )
    if "version" in options:
        raise InvalidInputError(
            "a MemWAL table has no version to read: read a pinned snapshot with "
            ".option('asOf', token) (tbl.snapshot().token), or the base table with Lance"
        )
    storage = {k: v for k, v in options.items() if k not in _OPTIONS}
    root = option(options, "namespace")
    if root is not None:  # the path is a table id in the namespace at root
        return mw.namespace(root, storage or None).open_table(uri)
    return mw.open_table(uri, storage or None)


def read_schema(table: MemWalTable, options: dict[str, str]) -> pa.Schema:
    """The columns a read returns: the ``columns`` option's, in its order, else all."""
    if "columns" not in options:
        return table.schema
    names = [c.strip() for c in options["columns"].split(",") if c.strip()]
    unknown = [c for c in names if c not in table.schema.names]
    if not names or unknown:
        raise InvalidInputError(
            f"the columns option names {unknown or 'no column'}; give a comma-separated list of "
            f"the table's columns: {', '.join(table.schema.names)}"
        )
    return pa.schema([table.schema.field(c) for c in dict.fromkeys(names)])
