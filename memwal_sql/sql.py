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

from datafusion import SessionConfig

from memwal_sql.search import register_search_functions
from memwal_sql.session import MemWalContext
from memwal_sql.table import open_table


def connect(config: SessionConfig | None = None, *, trusted: bool = False) -> MemWalContext:
    """A DataFusion session with MemWAL support. Its SQL runs queries only, so SQL text from
    anyone cannot read or write files (``CREATE EXTERNAL TABLE``, ``COPY``), drop tables or
    change settings; ``trusted=True`` gives DataFusion's every statement.

    Example:
        ``ctx = mw.connect(); ctx.register("events", tbl); ctx.sql("SELECT ...").to_arrow_table()``
    """
    ctx = MemWalContext(config, trusted=trusted, open_table=open_table)
    register_search_functions(ctx)
    return ctx
