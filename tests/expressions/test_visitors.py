"""The predicate visitor: bottom-up, children's results in order, every node kind dispatched."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from memwal_sql.expressions.predicate import (
    And,
    ColumnCompare,
    Compare,
    Const,
    InList,
    IsNull,
    Not,
    Opaque,
    Or,
    Predicate,
)
from memwal_sql.expressions.visitors import PredicateVisitor, visit


class _Render(PredicateVisitor[str]):
    """SQL-ish text of a tree: shows which method each node reached, and in what order."""

    def visit_const(self, p: Const) -> str:
        return {True: "TRUE", False: "FALSE", None: "NULL"}[p.value]

    def visit_compare(self, p: Compare) -> str:
        return f"{p.column} {p.op} {p.value.as_py()}"

    def visit_column_compare(self, p: ColumnCompare) -> str:
        return f"{p.left} {p.op} {p.right}"

    def visit_in_list(self, p: InList) -> str:
        return f"{p.column} IN {p.values.to_pylist()}"

    def visit_is_null(self, p: IsNull) -> str:
        return f"{p.column} IS NULL"

    def visit_opaque(self, p: Opaque) -> str:
        return "opaque"

    def visit_and(self, p: And, children: list[str]) -> str:
        return "(" + " AND ".join(children) + ")"

    def visit_or(self, p: Or, children: list[str]) -> str:
        return "(" + " OR ".join(children) + ")"

    def visit_not(self, p: Not, child: str) -> str:
        return f"NOT {child}"


def test_every_node_kind_reaches_its_method_with_its_childrens_results_in_order() -> None:
    tree = Or(
        (
            And((Compare("a", "<", pa.scalar(3)), Not(IsNull("b")), Const(None))),
            InList("c", pa.array([1, 2])),
            ColumnCompare("a", "=", "d"),
            Opaque(pc.field("e").is_nan(), ("e",)),
        )
    )
    assert visit(tree, _Render()) == (
        "((a < 3 AND NOT b IS NULL AND NULL) OR c IN [1, 2] OR a = d OR opaque)"
    )


def test_a_leaf_the_visitor_does_not_handle_is_named() -> None:
    class OnlyCompare(_Render):
        visit_is_null = PredicateVisitor.visit_is_null

    with pytest.raises(NotImplementedError, match="OnlyCompare does not visit IsNull"):
        visit(Not(IsNull("x")), OnlyCompare())


def test_a_foreign_node_is_refused() -> None:
    class Stray(Predicate):
        pass

    with pytest.raises(TypeError, match="not a predicate node"):
        visit(And((Stray(),)), _Render())
