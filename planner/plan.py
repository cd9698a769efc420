"""The root node of every plan: the snapshot it reads, a header for ``explain()``, and the
node tree it drives (optionally with the rest of a pushed filter applied to its output)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from exec_nodes.base import ExecNode, FilterExec
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.read_snapshot import ReadSnapshot


class PlanExec(ExecNode):
    """A plan's root: an exec node over ``root`` (the tree the planner built) that a
    DataFusion fragment, Spark or a table method runs by partition. ``residual`` is what of a
    pushed filter the tree does not apply itself (rows for which it is not TRUE are dropped).

    Example:
        ``plan = plan_scan(snap, spec, schema, None); plan.to_table(); print(plan.explain())``
    """

    name = "PlanExec"
    title = "MemWAL plan"

    def __init__(
        self, snapshot: ReadSnapshot, root: ExecNode, residual: Predicate | None = None
    ) -> None:
        self.snapshot = snapshot
        self.root = root
        self.residual = residual
        # The residual may name columns the query does not project: filtered, then projected.
        self._top = root if residual is None else FilterExec(root, residual)

    @property
    def schema(self) -> pa.Schema:
        return self.root.schema

    @property
    def children(self) -> list[ExecNode]:
        return [self.root]

    @property
    def partitions(self) -> int:
        return self.root.partitions

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        return self._top.execute(partition)

    def execute_columns(self, partition: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        return self._top.execute_columns(partition, schema)

    def header(self) -> list[str]:
        """The lines above the node tree: what the plan reads and what it left out."""
        snap = self.snapshot
        return [f"{self.title}: base version {snap.base_version}, consistency={snap.consistency}"]

    def describe(self) -> str:
        return "\n".join(self.header())

    def explain(self, indent: int = 0) -> str:
        pad = "  " * indent
        lines = [pad + line for line in self.header()]
        if self.residual is not None:
            lines.append(f"{pad}then filtered by {self.residual}")
        return "\n".join([*lines, self.root.explain(indent)])
