"""Rows of a source as the read side sees them: the WAL schema plus ``_gen`` and ``_rowaddr``.

Every source (the base table, a flushed generation, a MemTable) hands its rows to the operators
in one shape, so operators and the MemTable's in-memory indexes can build on one helper set.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from memwal_sql.formats.wal import TOMBSTONE

GEN = "_gen"
ROWADDR = "_rowaddr"
#: The column an aligned lookup adds: whether the key was found (with its tombstone, if asked).
FOUND = "_found"
BASE_GENERATION = -1  # the seed spec's generation of the base table


def stored_columns(schema: pa.Schema, dataset: Any) -> list[str]:
    """The columns of ``schema`` that ``dataset`` (a Lance dataset) stores, in schema order.

    Example:
        ``stored_columns(source_schema(tbl.wal_schema), tbl.dataset())  # no _gen, _rowaddr``
    """
    stored = set(dataset.schema.names)  # a Lance dataset builds its schema on each access
    return [f.name for f in schema if f.name in stored]


def gather(owners: np.ndarray, read: Callable[[Any, np.ndarray], pa.Table]) -> pa.Table:
    """Rows read from several owners, in the order asked: row ``i`` belongs to ``owners[i]``,
    and ``read(owner, at)`` gives that owner's rows for the positions ``at``, in order.
    Each owner reads once.

    Example:
        >>> gather(np.array([1, 0, 1]), lambda o, at: pa.table({"v": [f"{o}@{i}" for i in at]}))["v"].to_pylist()
        ['1@0', '0@1', '1@2']
    """
    distinct = np.unique(owners)
    if len(distinct) == 1:  # one owner (a lookup of one key, say): its rows are in order
        return read(distinct[0], np.arange(len(owners)))
    parts, order = [], []
    for owner in distinct:
        at = np.nonzero(owners == owner)[0]
        parts.append(read(owner, at))
        order.append(at)
    table = pa.concat_tables(parts)
    return table.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))


@functools.lru_cache(maxsize=256)
def empty_rows(schema: pa.Schema) -> pa.Table:
    """An empty table of ``schema``, made once: pyarrow's ``empty_table`` is slow for a schema
    with a zoned timestamp, and a point lookup, which takes under a millisecond in all
    (``benchmarks/bench_lookup.py``, docs/performance.md), asks for several.

    Example:
        >>> empty_rows(pa.schema([("id", pa.int64())])).num_rows
        0
    """
    return schema.empty_table()


#: On a base column a type widening is filling, the name of the column it will replace
#: (``maintenance/schema.py``): readers and writers do not see it, merges fill it.
WIDENS_METADATA = b"memwal-sql:widens"


def conform(table: pa.Table, schema: pa.Schema, generation: int | None = None) -> pa.Table:
    """``table`` with exactly the columns of ``schema``, cast where the types differ.

    ``_gen`` is filled with ``generation`` when given; a missing ``_rowaddr`` is the row
    offsets, a missing ``_tombstone`` false, a missing column a widening fills
    (:data:`WIDENS_METADATA`) the column it widens, any other missing column NULL. An empty schema
    keeps the row count (what ``count(*)`` reads).

    Example:
        >>> s = pa.schema([("id", pa.int64()), (GEN, pa.int64()), (ROWADDR, pa.uint64())])
        >>> conform(pa.table({"id": [7, 8]}), s, generation=3).to_pylist()[1]
        {'id': 8, '_gen': 3, '_rowaddr': 1}
    """
    n = table.num_rows
    if len(schema) == 0:
        return table.select([])
    cols = []
    for f in schema:
        if f.name == GEN and generation is not None:
            cols.append(pa.array(np.full(n, generation, dtype=np.int64)))
        elif f.name in table.column_names:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        elif f.name == ROWADDR:
            cols.append(pa.array(np.arange(n, dtype=np.uint64)))
        elif f.name == TOMBSTONE:
            cols.append(pa.array(np.zeros(n, dtype=bool)))
        elif f.metadata and f.metadata.get(WIDENS_METADATA, b"").decode() in table.column_names:
            cols.append(table.column(f.metadata[WIDENS_METADATA].decode()).cast(f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


@functools.lru_cache(maxsize=64)
def source_schema(wal_schema: pa.Schema) -> pa.Schema:
    """Schema of a newer-than-base source: the WAL schema plus ``_gen`` and ``_rowaddr``.

    Made once per WAL schema: every leaf of every plan asks for it (a point lookup builds a
    leaf per source).

    Example:
        >>> source_schema(pa.schema([("id", pa.int64())])).names
        ['id', '_gen', '_rowaddr']
    """
    return pa.schema(
        [*wal_schema, pa.field(GEN, pa.int64(), False), pa.field(ROWADDR, pa.uint64(), False)]
    )
