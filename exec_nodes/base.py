"""The exec-node interface: a physical operator that yields Arrow record batches.

DataFusion 55 cannot host Python ExecutionPlans, so memwal-sql's operators are plain Python
objects that pull batches from their children; the planner composes them, and the DataFusion
dataset adapter (``memwal_sql.session``) drives the root of each tree from a partition. Each node
can describe itself, so ``table.explain()`` shows the tree DataFusion's EXPLAIN cannot.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from memwal_sql.writer.wal import TOMBSTONE

GEN = "_gen"
ROWADDR = "_rowaddr"
BASE_GENERATION = -1  # the seed spec's generation of the base table

__all__ = [
    "BASE_GENERATION",
    "GEN",
    "ROWADDR",
    "TOMBSTONE",
    "EmptyExec",
    "ExecNode",
    "conform",
    "empty_rows",
    "gather",
    "stored_columns",
]


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
    """An empty table of ``schema``, made once: pyarrow's ``empty_table`` costs about 0.2 ms
    for a schema with a zoned timestamp, and a point lookup asks for several.

    Example:
        >>> empty_rows(pa.schema([("id", pa.int64())])).num_rows
        0
    """
    return schema.empty_table()


def conform(table: pa.Table, schema: pa.Schema, generation: int | None = None) -> pa.Table:
    """``table`` with exactly the columns of ``schema``, cast where the types differ.

    ``_gen`` is filled with ``generation`` when given; a missing ``_rowaddr`` is the row
    offsets, a missing ``_tombstone`` false, any other missing column NULL. An empty schema
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
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


class ExecNode:
    """A physical operator: ``execute()`` yields record batches of ``schema``."""

    name = "ExecNode"
    #: Attributes holding a lock (made anew when a node is unpickled) and results computed
    #: during execution (not shipped): a plan built on one process runs on another (Spark).
    _locks: tuple[str, ...] = ()
    _computed: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self._locks:
            state.pop(name, None)
        for name in self._computed:
            state[name] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for name in self._locks:
            setattr(self, name, threading.Lock())

    @property
    def schema(self) -> pa.Schema:
        raise NotImplementedError

    @property
    def children(self) -> list[ExecNode]:
        return []

    def execute(self) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def describe(self) -> str:
        """One line: the node's name and what it was asked to do."""
        return self.name

    def explain(self, indent: int = 0) -> str:
        """The tree below this node, one node a line.

        Example:
            >>> print(EmptyExec(pa.schema([("id", pa.int64())])).explain())
            EmptyExec: schema=[id]
        """
        lines = ["  " * indent + self.describe()]
        lines += [c.explain(indent + 1) for c in self.children]
        return "\n".join(lines)

    def to_table(self) -> pa.Table:
        """Run the node and collect its output."""
        return pa.Table.from_batches(list(self.execute()), schema=self.schema)


class EmptyExec(ExecNode):
    """No rows (what a fully pruned plan runs)."""

    name = "EmptyExec"

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def execute(self) -> Iterator[pa.RecordBatch]:
        return iter(())

    def describe(self) -> str:
        return f"{self.name}: schema=[{', '.join(self._schema.names)}]"
