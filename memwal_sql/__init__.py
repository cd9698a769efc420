"""memwal-sql: streaming upserts into Lance tables through the MemTable & WAL (MemWAL) spec.

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.schema([pa.field("id", pa.int64(), False)]),
    ...                       primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2))
    >>> with tbl.writer(region_values=(0,)) as w:
    ...     w.upsert({"id": [2]})
"""

from memwal_sql import errors
from memwal_sql.index.region_spec import RegionSpec
from memwal_sql.table import (
    DEFAULT_REGION_ID,
    MemWalTable,
    create_table,
    open_table,
    region_id_for,
)
from memwal_sql.writer.region_writer import RegionWriter, WriterConfig

__all__ = [
    "DEFAULT_REGION_ID",
    "MemWalContext",
    "MemWalTable",
    "RegionSpec",
    "RegionWriter",
    "WriterConfig",
    "connect",
    "create_table",
    "errors",
    "open_table",
    "region_id_for",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The session pulls in DataFusion and the read side (planner, exec nodes), which import
    # back from this package: load it on first use.
    if name in ("connect", "MemWalContext"):
        from memwal_sql import session

        return getattr(session, name)
    raise AttributeError(f"module 'memwal_sql' has no attribute {name!r}")
