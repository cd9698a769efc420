"""The exec-node contract: a physical operator that yields Arrow record batches by partition.

DataFusion 55 cannot host Python ExecutionPlans, so memwal-sql's operators are plain Python
objects that pull batches from their children; the planner composes them, and the DataFusion
dataset adapter (``memwal_sql.session``) drives the root of each tree, one fragment per
partition. Every node, plan roots included, has the same four parts: ``schema``, ``children``,
``partitions`` with ``execute(partition)``, and ``explain()``. Planning only builds nodes;
all reading and ranking happens in ``execute``. Each node can describe itself, so
``table.explain()`` shows the tree DataFusion's EXPLAIN cannot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from memwal_sql.expressions.predicate import Predicate
from memwal_sql.expressions.visitors import matches
from memwal_sql.formats.source_rows import conform


class ExecNode:
    """A physical operator: ``execute(partition)`` yields record batches of ``schema``.

    Example:
        >>> node = EmptyExec(pa.schema([("id", pa.int64())]))
        >>> node.partitions, list(node.execute(0))
        (1, [])
    """

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

    @property
    def partitions(self) -> int:
        """How many partitions :meth:`execute` takes (DataFusion runs one fragment each)."""
        return 1

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        """The batches of ``partition`` (``0 <= partition < partitions``)."""
        raise NotImplementedError

    def execute_columns(self, partition: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """The batches of ``partition`` with the columns of ``schema`` (some of ``self.schema``,
        what a query projects). A node that can read fewer columns overrides this."""
        for batch in self.execute(partition):
            yield from conform(pa.Table.from_batches([batch]), schema).to_batches()

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
        """Run every partition and collect the output."""
        batches = [b for p in range(self.partitions) for b in self.execute(p)]
        return pa.Table.from_batches(batches, schema=self.schema)

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise IndexError(f"{self.name} has {self.partitions} partition(s), not {partition + 1}")


class EmptyExec(ExecNode):
    """No rows (what a fully pruned plan runs)."""

    name = "EmptyExec"

    def __init__(self, schema: pa.Schema) -> None:
        self._schema = schema

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        self._check_partition(partition)
        return iter(())

    def describe(self) -> str:
        return f"{self.name}: schema=[{', '.join(self._schema.names)}]"


class FilterExec(ExecNode):
    """The rows of its child for which ``predicate`` is TRUE, partition by partition (what a
    plan root applies of a pushed filter that a lookup or a search did not use).

    Example:
        >>> from memwal_sql.expressions.predicate import Compare
        >>> rows = pa.table({"id": [1, 2, 3]})
        >>> node = FilterExec(TableExec(rows), Compare("id", ">", pa.scalar(1)))
        >>> node.to_table()["id"].to_pylist()
        [2, 3]
    """

    name = "FilterExec"

    def __init__(self, child: ExecNode, predicate: Predicate) -> None:
        self.child = child
        self.predicate = predicate

    @property
    def schema(self) -> pa.Schema:
        return self.child.schema

    @property
    def children(self) -> list[ExecNode]:
        return [self.child]

    @property
    def partitions(self) -> int:
        return self.child.partitions

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        for batch in self.child.execute(partition):
            rows = matches(self.predicate, pa.Table.from_batches([batch]))
            if rows.num_rows:  # no empty batches (PySpark's createDataFrame stops at one)
                yield from rows.to_batches()

    def describe(self) -> str:
        return f"{self.name}: {self.predicate}"


class TableExec(ExecNode):
    """Rows given in memory, as one partition (a test's or a caller's hand-built input)."""

    name = "TableExec"

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows

    @property
    def schema(self) -> pa.Schema:
        return self.rows.schema

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        self._check_partition(partition)
        yield from self.rows.to_batches()

    def describe(self) -> str:
        return f"{self.name}: {self.rows.num_rows} row(s)"
