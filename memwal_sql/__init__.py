"""memwal-sql: streaming upserts into Lance tables through the MemTable & WAL (MemWAL) spec.

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.schema([pa.field("id", pa.int64(), False)]),
    ...                       primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2))
    >>> with tbl.writer(region_values=(0,)) as w:
    ...     w.upsert({"id": [2]})
"""

import logging
import os
from typing import TYPE_CHECKING

from memwal_sql import errors

if TYPE_CHECKING:  # loaded on first use at runtime (see __getattr__)
    from memwal_sql.maintenance.config import MaintenanceConfig
    from memwal_sql.metrics import CacheMetrics, RegionMetrics, TableMetrics
    from memwal_sql.namespaces import Namespace, namespace
    from memwal_sql.partitioning.region_spec import RegionSpec, region_id_for
    from memwal_sql.read_snapshot import PinnedSnapshot
    from memwal_sql.search import SearchQuery
    from memwal_sql.session import MemWalContext
    from memwal_sql.sql import connect
    from memwal_sql.structures.cache import Caches, CacheStats
    from memwal_sql.table import MemWalTable, create_table, open_table
    from memwal_sql.table_state import DEFAULT_REGION_ID
    from memwal_sql.writer.config import WriterConfig
    from memwal_sql.writer.region_writer import RegionWriter

__all__ = [
    "DEFAULT_REGION_ID",
    "CacheMetrics",
    "CacheStats",
    "Caches",
    "MaintenanceConfig",
    "MemWalContext",
    "MemWalTable",
    "Namespace",
    "PinnedSnapshot",
    "RegionMetrics",
    "RegionSpec",
    "RegionWriter",
    "SearchQuery",
    "TableMetrics",
    "WriterConfig",
    "connect",
    "create_table",
    "errors",
    "namespace",
    "open_table",
    "region_id_for",
]
__version__ = "0.1.0"

#: What ``LANCE_LOG`` is set to when this package is imported before Lance and the user set none:
#: Lance's Rust log at ``error`` only, so its warnings (empty IVF partitions, index statistics)
#: stay off stderr. ``lance::index`` is off: the only error it logs on our tables is "Index
#: __lance_mem_wal has no fields", on every full-text query, which Lance logs for its own MemWAL
#: index too (docs/search.md has a minimal repro) and which changes no result. Module
#: directives only: a bare level would also set pylance's Python logger.
QUIET_LANCE_LOG = "lance=error,lance::index=off"
# Lance reads LANCE_LOG once, at its import: the table code imports it on first use, after this.
os.environ.setdefault("LANCE_LOG", QUIET_LANCE_LOG)

# The library logs (writer claims and flushes, merges, GC) on the ``memwal_sql`` logger and
# prints nothing; the application decides where the records go.
logging.getLogger(__name__).addHandler(logging.NullHandler())


# Loaded on first use: the table and writers import Lance, whose Rust logger reads LANCE_LOG
# once, at import (the ``memwal`` command line sets it first); the session pulls in DataFusion
# and the read side (planner, exec nodes), which import back from this package. Importing the
# package itself loads nothing heavy, so ``memwal`` handles a Ctrl-C from its first moment.
_LAZY = {
    "DEFAULT_REGION_ID": "memwal_sql.table_state",
    "MaintenanceConfig": "memwal_sql.maintenance.config",
    "Caches": "memwal_sql.structures.cache",
    "CacheStats": "memwal_sql.structures.cache",
    "CacheMetrics": "memwal_sql.metrics",
    "RegionMetrics": "memwal_sql.metrics",
    "TableMetrics": "memwal_sql.metrics",
    "MemWalTable": "memwal_sql.table",
    "PinnedSnapshot": "memwal_sql.read_snapshot",
    "Namespace": "memwal_sql.namespaces",
    "namespace": "memwal_sql.namespaces",
    "create_table": "memwal_sql.table",
    "open_table": "memwal_sql.table",
    "region_id_for": "memwal_sql.partitioning.region_spec",
    "RegionSpec": "memwal_sql.partitioning.region_spec",
    "RegionWriter": "memwal_sql.writer.region_writer",
    "WriterConfig": "memwal_sql.writer.config",
    "connect": "memwal_sql.sql",
    "MemWalContext": "memwal_sql.session",
    "SearchQuery": "memwal_sql.search",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memwal_sql' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
