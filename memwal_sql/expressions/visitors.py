"""Visitors over the predicate tree, and what is built on them: evaluation, columns read,
the Arrow filter handed to Lance.

A :class:`PredicateVisitor` has one method per node kind; :func:`visit` walks a tree bottom-up
and hands each combining node (``AND``, ``OR``, ``NOT``) the results of its children, so a new
question about predicates is one small class, not another ``isinstance`` chain (pyiceberg's
``expressions/visitors.py`` is the model). Region pruning projects predicates with one
(:mod:`planner.pruning`), the operators evaluate them with :func:`evaluate`.

The tree is evaluated with SQL's three-valued logic exactly as DataFusion evaluates it, because
DataFusion marks pushed filters *Exact* and never re-checks them:

* ``x NOT IN (...)`` is NULL for a NULL ``x`` and whenever the list holds a NULL (pyarrow's
  ``~is_in`` is true for a NULL ``x``: DataFusion's own pushdown gets this wrong);
* floats compare as DataFusion does: NaN equals NaN and sorts above every number, and
  ``-0.0`` equals ``0.0`` (pyarrow says NaN equals nothing).

Example:
    >>> import pyarrow as pa
    >>> class Leaves(PredicateVisitor[int]):
    ...     def visit_leaf(self, p): return 1
    ...     def visit_and(self, p, children): return sum(children)
    ...     visit_or = visit_and
    ...     def visit_not(self, p, child): return child
    >>> visit(And((IsNull("a"), Not(IsNull("b")))), Leaves())
    2
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

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
    negation_normal_form,
)

__all__ = [
    "PredicateVisitor",
    "evaluate",
    "has_float_in_list",
    "has_opaque",
    "matches",
    "referenced_columns",
    "to_arrow_filter",
    "visit",
]

T = TypeVar("T")


class PredicateVisitor(ABC, Generic[T]):
    """One method per node kind. A leaf kind's method defaults to :meth:`visit_leaf`, so a
    visitor that treats all leaves alike overrides that one; ``AND``, ``OR`` and ``NOT`` get
    their children's results."""

    def visit_leaf(self, p: Predicate) -> T:
        raise NotImplementedError(f"{type(self).__name__} does not visit {type(p).__name__}")

    def visit_const(self, p: Const) -> T:
        return self.visit_leaf(p)

    def visit_compare(self, p: Compare) -> T:
        return self.visit_leaf(p)

    def visit_column_compare(self, p: ColumnCompare) -> T:
        return self.visit_leaf(p)

    def visit_in_list(self, p: InList) -> T:
        return self.visit_leaf(p)

    def visit_is_null(self, p: IsNull) -> T:
        return self.visit_leaf(p)

    def visit_opaque(self, p: Opaque) -> T:
        return self.visit_leaf(p)

    @abstractmethod
    def visit_and(self, p: And, children: list[T]) -> T: ...

    @abstractmethod
    def visit_or(self, p: Or, children: list[T]) -> T: ...

    @abstractmethod
    def visit_not(self, p: Not, child: T) -> T: ...


def visit(p: Predicate, visitor: PredicateVisitor[T]) -> T:
    """Walk ``p`` bottom-up with ``visitor`` and return its result for the root."""
    if isinstance(p, And):
        return visitor.visit_and(p, [visit(c, visitor) for c in p.children])
    if isinstance(p, Or):
        return visitor.visit_or(p, [visit(c, visitor) for c in p.children])
    if isinstance(p, Not):
        return visitor.visit_not(p, visit(p.child, visitor))
    if isinstance(p, Compare):
        return visitor.visit_compare(p)
    if isinstance(p, InList):
        return visitor.visit_in_list(p)
    if isinstance(p, IsNull):
        return visitor.visit_is_null(p)
    if isinstance(p, ColumnCompare):
        return visitor.visit_column_compare(p)
    if isinstance(p, Const):
        return visitor.visit_const(p)
    if isinstance(p, Opaque):
        return visitor.visit_opaque(p)
    raise TypeError(f"not a predicate node: {p!r}")


# ------------------------------------------------------------------------------------------
# Questions about a tree
# ------------------------------------------------------------------------------------------


class _Any(PredicateVisitor[bool]):
    """True when some leaf satisfies :meth:`visit_leaf`."""

    def visit_and(self, p: And, children: list[bool]) -> bool:
        return any(children)

    visit_or = visit_and  # type: ignore[assignment]

    def visit_not(self, p: Not, child: bool) -> bool:
        return child


class _ReferencedColumns(PredicateVisitor[frozenset[str]]):
    def visit_leaf(self, p: Predicate) -> frozenset[str]:
        return frozenset()

    def visit_compare(self, p: Compare) -> frozenset[str]:
        return frozenset((p.column,))

    visit_in_list = visit_is_null = visit_compare  # type: ignore[assignment]

    def visit_column_compare(self, p: ColumnCompare) -> frozenset[str]:
        return frozenset((p.left, p.right))

    def visit_opaque(self, p: Opaque) -> frozenset[str]:
        return frozenset(p.columns)

    def visit_and(self, p: And, children: list[frozenset[str]]) -> frozenset[str]:
        return frozenset().union(*children)

    visit_or = visit_and  # type: ignore[assignment]

    def visit_not(self, p: Not, child: frozenset[str]) -> frozenset[str]:
        return child


def referenced_columns(p: Predicate) -> set[str]:
    """The columns ``p`` reads.

    Example:
        >>> sorted(referenced_columns(And((IsNull("a"), Not(ColumnCompare("b", "<", "c"))))))
        ['a', 'b', 'c']
    """
    columns: frozenset[str] = visit(p, _ReferencedColumns())
    return set(columns)


class _HasOpaque(_Any):
    def visit_leaf(self, p: Predicate) -> bool:
        return isinstance(p, Opaque)


def has_opaque(p: Predicate) -> bool:
    """Whether a part of ``p`` is a function the tree does not model.

    Example:
        >>> has_opaque(And((IsNull("a"), Opaque(pc.field("a").is_nan(), ("a",)))))
        True
    """
    return visit(p, _HasOpaque())


class _HasFloatInList(_Any):
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def visit_leaf(self, p: Predicate) -> bool:
        return False

    def visit_in_list(self, p: InList) -> bool:
        return p.column in self.schema.names and pa.types.is_floating(
            self.schema.field(p.column).type
        )


def has_float_in_list(p: Predicate, schema: pa.Schema) -> bool:
    """Lance compares a float IN list with `=` (-0.0 matches 0.0); DataFusion's SQL uses a
    hash set (it does not), so such a filter is evaluated after reading.

    Example:
        >>> has_float_in_list(InList("f", pa.array([0.0])), pa.schema([("f", pa.float64())]))
        True
    """
    return visit(p, _HasFloatInList(schema))


# ------------------------------------------------------------------------------------------
# Evaluation with SQL semantics
# ------------------------------------------------------------------------------------------


class _Evaluate(PredicateVisitor[pa.Array]):
    def __init__(self, table: pa.Table | pa.RecordBatch) -> None:
        self.table = table

    def visit_const(self, p: Const) -> pa.Array:
        n = self.table.num_rows
        if p.value is None:
            return pa.nulls(n, pa.bool_())
        return pa.array(np.full(n, p.value), pa.bool_())

    def visit_compare(self, p: Compare) -> pa.Array:
        return _compare(_column(self.table, p.column), p.op, p.value)

    def visit_column_compare(self, p: ColumnCompare) -> pa.Array:
        return _compare(_column(self.table, p.left), p.op, _column(self.table, p.right))

    def visit_in_list(self, p: InList) -> pa.Array:
        return _in_list(_column(self.table, p.column), p.values, p.has_null)

    def visit_is_null(self, p: IsNull) -> pa.Array:
        return pc.is_null(_column(self.table, p.column))

    def visit_opaque(self, p: Opaque) -> pa.Array:
        t = self.table
        t = t if isinstance(t, pa.Table) else pa.Table.from_batches([t])
        if p.positional is not None:
            t = t.select(list(p.positional))
        return pds.dataset(t).to_table(columns={"m": p.expression}).column("m").combine_chunks()

    def visit_and(self, p: And, children: list[pa.Array]) -> pa.Array:
        result = children[0]
        for child in children[1:]:
            result = pc.and_kleene(result, child)
        return result

    def visit_or(self, p: Or, children: list[pa.Array]) -> pa.Array:
        result = children[0]
        for child in children[1:]:
            result = pc.or_kleene(result, child)
        return result

    def visit_not(self, p: Not, child: pa.Array) -> pa.Array:
        return pc.invert(child)


def evaluate(p: Predicate, table: pa.Table | pa.RecordBatch) -> pa.BooleanArray:
    """``p`` over every row of ``table``: TRUE, FALSE or NULL, as DataFusion computes it.

    Example:
        >>> t = pa.table({"f": [float("nan"), -0.0, None]})
        >>> evaluate(Compare("f", "=", pa.scalar(0.0)), t).to_pylist()
        [False, True, None]
    """
    return visit(p, _Evaluate(table))


def matches(p: Predicate | None, table: pa.Table) -> pa.Table:
    """The rows of ``table`` for which ``p`` is TRUE (NULL and FALSE are dropped).

    Example:
        >>> matches(IsNull("a"), pa.table({"a": [1, None]})).num_rows
        1
    """
    if p is None or table.num_rows == 0:
        return table
    return table.filter(pc.fill_null(evaluate(p, table), False))


# The kernels: SQL's semantics over Arrow arrays.


def _column(table: pa.Table | pa.RecordBatch, name: str) -> pa.Array:
    col = table.column(name)
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return col


def _floats(a: pa.Array | pa.Scalar, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(is NaN, value with NaN as 0 and -0.0 as 0.0) of a float array or scalar."""
    if isinstance(a, pa.Scalar):
        v = np.full(n, a.as_py(), dtype=np.float64)
    else:
        v = pc.fill_null(a, 0).to_numpy(zero_copy_only=False).astype(np.float64)
    nan = np.isnan(v)
    return nan, np.where(nan, 0.0, v) + 0.0


def _float_bits(a: pa.Array) -> np.ndarray:
    return pc.fill_null(a, 0).to_numpy(zero_copy_only=False).astype(np.float64).view(np.int64)


_ARROW_COMPARE = {
    "=": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def _compare(left: pa.Array, op: str, right: pa.Array | pa.Scalar) -> pa.Array:
    if pa.types.is_floating(left.type) and isinstance(right, pa.Scalar) and right.is_valid:
        value = float(right.as_py())
        if not np.isnan(value):
            # Against a number, IEEE order is DataFusion's (-0.0 == 0.0, NULL stays NULL)
            # except for NaN rows, which sort above every number.
            result = _ARROW_COMPARE[op](left, right)
            if op in (">", ">=", "!="):
                result = pc.or_(result, pc.is_nan(left))
            return result
    if pa.types.is_floating(left.type):
        n = len(left)
        lnan, lv = _floats(left, n)
        rnan, rv = _floats(right, n)
        # NaN is one value, above every number (DataFusion's order); -0.0 equals 0.0.
        eq = (lnan & rnan) | (~lnan & ~rnan & (lv == rv))
        lt = (~lnan & rnan) | (~lnan & ~rnan & (lv < rv))
        result = {"=": eq, "!=": ~eq, "<": lt, "<=": lt | eq, ">": ~(lt | eq), ">=": ~lt}[op]
        valid = left.is_valid()
        if not isinstance(right, pa.Scalar):
            valid = pc.and_(valid, right.is_valid())
        return pa.array(result, pa.bool_(), mask=~valid.to_numpy(zero_copy_only=False))
    return _ARROW_COMPARE[op](left, right)


def _in_list(column: pa.Array, values: pa.Array, has_null: bool) -> pa.Array:
    if len(values) == 0 and not has_null:
        return pa.array(np.zeros(len(column), dtype=bool))  # x IN (): FALSE, even for NULL
    if pa.types.is_floating(column.type):
        # DataFusion keeps an IN list of floats in a hash set: NaN matches NaN, and -0.0 and
        # 0.0 are different values (its `=` says they are equal; a short list it rewrites to
        # `=` comparisons, which the decoder then sees as such).
        n = len(column)
        cnan, _ = _floats(column, n)
        vnan, _ = _floats(values, len(values))
        bits = _float_bits(column)
        found = (cnan & bool(vnan.any())) | (~cnan & np.isin(bits, _float_bits(values)[~vnan]))
        found_arr = pa.array(found & column.is_valid().to_numpy(zero_copy_only=False))
    else:
        found_arr = pc.is_in(column, value_set=values, skip_nulls=True)
        found_arr = pc.fill_null(found_arr, False)
    # x IN (...): TRUE if found; else NULL if x is NULL or the list has a NULL; else FALSE.
    unknown = pc.invert(column.is_valid())
    if has_null:
        unknown = pa.array(np.ones(len(column), dtype=bool))
    unknown = pc.and_(unknown, pc.invert(found_arr))
    return pc.if_else(unknown, pa.scalar(None, pa.bool_()), found_arr)


# ------------------------------------------------------------------------------------------
# Back to Arrow, for Lance
# ------------------------------------------------------------------------------------------


class _ToArrow(PredicateVisitor[pc.Expression]):
    """An Arrow expression TRUE exactly where a predicate in negation normal form is TRUE."""

    def visit_const(self, p: Const) -> pc.Expression:
        return pc.scalar(bool(p.value))

    def visit_compare(self, p: Compare) -> pc.Expression:
        return _ARROW_OPS[p.op](pc.field(p.column), pc.scalar(p.value))

    def visit_column_compare(self, p: ColumnCompare) -> pc.Expression:
        return _ARROW_OPS[p.op](pc.field(p.left), pc.field(p.right))

    def visit_is_null(self, p: IsNull) -> pc.Expression:
        return pc.field(p.column).is_null()

    def visit_in_list(self, p: InList) -> pc.Expression:
        return _is_in(p)

    def visit_opaque(self, p: Opaque) -> pc.Expression:
        return p.expression

    def visit_and(self, p: And, children: list[pc.Expression]) -> pc.Expression:
        return _balanced(children, lambda a, b: a & b)

    def visit_or(self, p: Or, children: list[pc.Expression]) -> pc.Expression:
        return _balanced(children, lambda a, b: a | b)

    def visit_not(self, p: Not, child: pc.Expression) -> pc.Expression:
        inner = p.child  # in negation normal form: IsNull, InList or Opaque
        if isinstance(inner, IsNull):
            return pc.field(inner.column).is_valid()
        if isinstance(inner, InList):
            if inner.has_null:
                return pc.scalar(False)  # x NOT IN (..., NULL) is never TRUE
            if len(inner.values) == 0:
                return pc.scalar(True)  # x IN () is FALSE, even for NULL
            return pc.field(inner.column).is_valid() & ~_is_in(inner)
        return ~child


def _balanced(parts: list[pc.Expression], join: Callable[..., pc.Expression]) -> pc.Expression:
    # Pairwise, so the tree is balanced: pyarrow's Substrait (Lance's way in) doubles in size
    # with each level of nesting, and a chain of n terms is n levels deep.
    while len(parts) > 1:
        joined = [join(a, b) for a, b in zip(parts[::2], parts[1::2])]
        parts = joined + parts[len(joined) * 2 :]
    return parts[0]


def to_arrow_filter(p: Predicate) -> pc.Expression:
    """An Arrow expression that is TRUE exactly where ``p`` is TRUE, for Lance's scanner
    (which evaluates it with DataFusion's semantics, as :func:`evaluate` does).

    Example:
        >>> to_arrow_filter(Not(InList("s", pa.array(["a"])))).equals(
        ...     pc.field("s").is_valid() & ~pc.field("s").isin(["a"]))
        True
    """
    return visit(negation_normal_form(p), _ToArrow())


def _is_in(p: InList) -> pc.Expression:
    if len(p.values) == 0:
        return pc.scalar(False)
    return pc.field(p.column).isin(p.values)


_ARROW_OPS = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
