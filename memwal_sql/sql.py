"""``mw.connect()``: a DataFusion session that runs SQL over MemWAL tables, opened by uri too.

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> uri = tempfile.mkdtemp()
    >>> mw.create_table(uri, pa.table({"id": [1, 2]}), primary_key="id").close()
    >>> ctx = mw.connect()
    >>> ctx.register("t", uri)
    >>> ctx.sql("SELECT count(*) AS n FROM t").to_pydict()
    {'n': [2]}
"""

from __future__ import annotations

from datafusion import DataFrame, SessionConfig

from memwal_sql.errors import InvalidInputError, StatementNotAllowedError
from memwal_sql.namespaces import Namespace
from memwal_sql.search import register_search_functions
from memwal_sql.session import MemWalContext
from memwal_sql.table import MemWalTable, open_table
from memwal_sql.table_state import TableState


def connect(
    config: SessionConfig | None = None,
    *,
    trusted: bool = False,
    read_only: bool = False,
    namespace: Namespace | None = None,
    default_schema: str | None = None,
) -> MemWalContext:
    """A DataFusion session with MemWAL support. Its SQL runs queries and, on MemWAL tables,
    ``INSERT`` (an upsert), ``UPDATE`` and ``DELETE`` (not with ``read_only=True``); SQL text
    from anyone cannot read or write files (``CREATE EXTERNAL TABLE``, ``COPY``), drop tables
    or change settings. ``trusted=True`` gives DataFusion's every statement.

    A write runs when :meth:`~MemWalContext.sql` is called, through the table's routed
    writers (durable as the table's writes are), and returns DataFusion's ``count`` row.

    With a ``namespace`` (:func:`~memwal_sql.namespace`), its tables need no registering:
    ``sales.orders`` names table ``orders`` of namespace ``sales``, and an unqualified name a
    table of ``default_schema`` (the root's own tables if None).

    Example:
        ``ctx = mw.connect(); ctx.register("events", tbl); ctx.sql("SELECT ...").to_arrow_table()``
        ``ctx.sql("DELETE FROM events WHERE ts < '2026-01-01'").to_pydict()  # {'count': [n]}``
        ``mw.connect(namespace=ns).sql("SELECT * FROM sales.orders JOIN sales.lineitem ...")``
    """
    if default_schema is not None and namespace is None:
        raise InvalidInputError("default_schema names a schema of a namespace: give namespace=")
    write_rows = None if read_only else _write_rows
    directory = None if namespace is None else namespace.sql_tables(default_schema)
    ctx = MemWalContext(
        config, trusted=trusted, open_table=open_table, write_rows=write_rows, directory=directory
    )
    register_search_functions(ctx)
    return ctx


def _write_rows(table: TableState, statement: str, rows: DataFrame) -> int:
    """Write one DML statement's rows (see :data:`~memwal_sql.session.WriteRows`)."""
    if not isinstance(table, MemWalTable):
        raise StatementNotAllowedError(f"{statement} needs a table opened for writing")
    if statement == "DELETE":
        keys = rows.select(*table.delete_columns).to_arrow_table()
        if keys.num_rows:
            table.delete(keys)
        return keys.num_rows
    if statement == "UPDATE":
        changed = _set_columns(table, rows)
        new_rows = rows.select(*table.primary_key, *changed).to_arrow_table()
        if new_rows.num_rows:
            table.update(new_rows)  # only the SET columns: the others keep their latest values
        return new_rows.num_rows
    new_rows = rows.to_arrow_table()
    if new_rows.num_rows:
        table.upsert(new_rows)
    return new_rows.num_rows


def _set_columns(table: MemWalTable, rows: DataFrame) -> list[str]:
    """The columns an UPDATE sets. Its rows are its SET's projection of the matched rows, each
    other column the matched row's own; a key column must be that, or the update would write
    a new key and keep the old one."""
    changed = []
    for expr in rows.logical_plan().to_variant().projections():
        name, inner = expr.schema_name(), expr
        if inner.variant_name() == "Alias":
            inner = inner.to_variant().expr()
        if inner.variant_name() == "Column" and inner.to_variant().name() == name:
            continue
        if name in table.primary_key:
            raise InvalidInputError(
                f"UPDATE cannot set key column {name!r}: a key is a row's identity. "
                "DELETE the old key and INSERT the new one"
            )
        changed.append(name)
    return changed
