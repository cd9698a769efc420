"""Predicates as data: the planner's typed predicate tree.

The tree is small: comparisons of a column with a literal or another column, ``IN`` lists with
every value, ``IS NULL``, ``AND``/``OR``/``NOT`` and constants. A pushed filter is decoded into
it from its Substrait form (:mod:`memwal_sql.expressions.substrait`); no text is parsed anywhere.
What is computed from a tree (its value over rows with SQL's three-valued logic, the columns it
reads, its Arrow form for Lance) is a visitor (:mod:`memwal_sql.expressions.visitors`).

A part of a filter that has no Substrait form, or uses a function the tree does not model,
becomes an :class:`Opaque` node that Arrow evaluates as it is; planning treats it as "may
match" (no region pruning, no point lookup).

Example:
    >>> import pyarrow as pa
    >>> negation_normal_form(Not(And((IsNull("s"), Compare("id", "<", pa.scalar(3))))))
    Or(children=(Not(child=IsNull(column='s')), Compare(column='id', op='>=', value=3)))
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "And",
    "ColumnCompare",
    "Compare",
    "Const",
    "InList",
    "IsNull",
    "Not",
    "Opaque",
    "Or",
    "Predicate",
    "conjuncts",
    "negation_normal_form",
]

FLIP = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
NEGATE = {"=": "!=", "!=": "=", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}


class Predicate:
    """A node of the predicate tree."""


@dataclass(frozen=True)
class Const(Predicate):
    """TRUE, FALSE or NULL (``None``): what a constant-folded filter is."""

    value: bool | None


@dataclass(frozen=True, eq=False)
class Compare(Predicate):
    """``column op value``; ``value`` is a non-NULL scalar of the column's type."""

    column: str
    op: str
    value: pa.Scalar

    def __repr__(self) -> str:
        return f"Compare(column={self.column!r}, op={self.op!r}, value={self.value.as_py()!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Compare)
            and (self.column, self.op) == (other.column, other.op)
            and self.value.equals(other.value)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class ColumnCompare(Predicate):
    """``left op right`` over two columns of one type."""

    left: str
    op: str
    right: str


@dataclass(frozen=True, eq=False)
class InList(Predicate):
    """``column IN (values)``; ``values`` holds no NULL, ``has_null`` says the list had one."""

    column: str
    values: pa.Array
    has_null: bool = False

    def __repr__(self) -> str:
        return (
            f"InList(column={self.column!r}, values={self.values.to_pylist()!r}, "
            f"has_null={self.has_null})"
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, InList)
            and self.column == other.column
            and self.has_null == other.has_null
            and self.values.equals(other.values)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class IsNull(Predicate):
    column: str


@dataclass(frozen=True)
class And(Predicate):
    children: tuple[Predicate, ...]


@dataclass(frozen=True)
class Or(Predicate):
    children: tuple[Predicate, ...]


@dataclass(frozen=True)
class Not(Predicate):
    child: Predicate


@dataclass(frozen=True, eq=False)
class Opaque(Predicate):
    """A part of the filter the tree does not model, kept as the Arrow expression it was.

    ``positional`` lists the column names when the expression refers to columns by position
    (what pyarrow gives back for a Substrait subtree); ``columns`` are the columns it reads.
    """

    expression: pc.Expression
    columns: tuple[str, ...] = field(default=())
    positional: tuple[str, ...] | None = None

    def __repr__(self) -> str:
        return f"Opaque({self.expression})"


# ------------------------------------------------------------------------------------------
# Rewrites
# ------------------------------------------------------------------------------------------


def negation_normal_form(p: Predicate, negate: bool = False) -> Predicate:
    """``p`` with NOT pushed down to the leaves (De Morgan), which SQL's three-valued logic
    allows: NOT maps TRUE/FALSE/NULL to FALSE/TRUE/NULL, and AND/OR commute with it. A negated
    comparison becomes the opposite comparison; ``Not`` stays only on ``InList``, ``IsNull``
    and ``Opaque``.

    Example:
        >>> negation_normal_form(Not(Or((IsNull("a"), Compare("b", "<", pa.scalar(1))))))
        And(children=(Not(child=IsNull(column='a')), Compare(column='b', op='>=', value=1)))
    """
    if isinstance(p, Not):
        return negation_normal_form(p.child, not negate)
    if isinstance(p, (And, Or)):
        children = tuple(negation_normal_form(c, negate) for c in p.children)
        flip = isinstance(p, And) == negate
        return Or(children) if flip else And(children)
    if not negate:
        return p
    if isinstance(p, Compare):
        return Compare(p.column, NEGATE[p.op], p.value)
    if isinstance(p, ColumnCompare):
        return ColumnCompare(p.left, NEGATE[p.op], p.right)
    if isinstance(p, Const):
        return Const(None if p.value is None else not p.value)
    return Not(p)


def conjuncts(p: Predicate | None) -> list[Predicate]:
    """The top-level AND terms of ``p``."""
    if p is None:
        return []
    if isinstance(p, And):
        return [c for child in p.children for c in conjuncts(child)]
    return [p]
