"""The exec-node interface: a physical operator that yields Arrow record batches.

DataFusion 55 cannot host Python ExecutionPlans, so memwal-sql's operators are plain Python
objects that pull batches from their children; the planner composes them, and the DataFusion
dataset adapter (``memwal_sql.session``) drives the root of each tree from a partition. Each node
can describe itself, so ``table.explain()`` shows the tree DataFusion's EXPLAIN cannot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa


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
