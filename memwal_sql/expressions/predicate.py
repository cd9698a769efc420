"""Predicates as data: the planner's typed predicate tree and its SQL evaluation.

The tree is small: comparisons of a column with a literal or another column, ``IN`` lists with
every value, ``IS NULL``, ``AND``/``OR``/``NOT`` and constants. A pushed filter is decoded into
it from its Substrait form (:mod:`memwal_sql.expressions.substrait`); no text is parsed anywhere.

The tree is evaluated with SQL's three-valued logic exactly as DataFusion evaluates it
(:func:`evaluate`), because DataFusion marks pushed filters *Exact* and never re-checks them:

* ``x NOT IN (...)`` is NULL for a NULL ``x`` and whenever the list holds a NULL (pyarrow's
  ``~is_in`` is true for a NULL ``x``: DataFusion's own pushdown gets this wrong);
* floats compare as DataFusion does: NaN equals NaN and sorts above every number, and
  ``-0.0`` equals ``0.0`` (pyarrow says NaN equals nothing).

A part of a filter that has no Substrait form, or uses a function the tree does not model,
becomes an :class:`Opaque` node that Arrow evaluates as it is; planning treats it as "may
match" (no region pruning, no point lookup).

Example:
    >>> import pyarrow as pa
    >>> pred = Not(InList("s", pa.array(["a", "b"])))
    >>> evaluate(pred, pa.table({"id": [1, 2, 3], "s": ["a", None, "c"]})).to_pylist()
    [False, None, True]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

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
    "evaluate",
    "has_float_in_list",
    "has_opaque",
    "matches",
    "negation_normal_form",
    "to_arrow_filter",
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


def referenced_columns(p: Predicate) -> set[str]:
    """The columns ``p`` reads.

    Example:
        >>> sorted(referenced_columns(And((IsNull("a"), Not(ColumnCompare("b", "<", "c"))))))
        ['a', 'b', 'c']
    """
    if isinstance(p, (Compare, InList, IsNull)):
        return {p.column}
    if isinstance(p, ColumnCompare):
        return {p.left, p.right}
    if isinstance(p, (And, Or)):
        return set().union(*(referenced_columns(c) for c in p.children))
    if isinstance(p, Not):
        return referenced_columns(p.child)
    if isinstance(p, Opaque):
        return set(p.columns)
    return set()


def conjuncts(p: Predicate | None) -> list[Predicate]:
    """The top-level AND terms of ``p``."""
    if p is None:
        return []
    if isinstance(p, And):
        return [c for child in p.children for c in conjuncts(child)]
    return [p]


# ------------------------------------------------------------------------------------------
# Evaluation with SQL semantics
# ------------------------------------------------------------------------------------------


def evaluate(p: Predicate, table: pa.Table | pa.RecordBatch) -> pa.BooleanArray:
    """``p`` over every row of ``table``: TRUE, FALSE or NULL, as DataFusion computes it.

    Example:
        >>> t = pa.table({"f": [float("nan"), -0.0, None]})
        >>> evaluate(Compare("f", "=", pa.scalar(0.0)), t).to_pylist()
        [False, True, None]
    """
    n = table.num_rows
    if isinstance(p, Const):
        return (
            pa.array(np.full(n, p.value), pa.bool_())
            if p.value is not None
            else pa.nulls(n, pa.bool_())
        )
    if isinstance(p, (And, Or)):
        combine = pc.and_kleene if isinstance(p, And) else pc.or_kleene
        result = evaluate(p.children[0], table)
        for child in p.children[1:]:
            result = combine(result, evaluate(child, table))
        return result
    if isinstance(p, Not):
        return pc.invert(evaluate(p.child, table))
    if isinstance(p, IsNull):
        return pc.is_null(_column(table, p.column))
    if isinstance(p, Compare):
        return _compare(_column(table, p.column), p.op, p.value)
    if isinstance(p, ColumnCompare):
        return _compare(_column(table, p.left), p.op, _column(table, p.right))
    if isinstance(p, InList):
        return _in_list(_column(table, p.column), p.values, p.has_null)
    assert isinstance(p, Opaque)
    t = table if isinstance(table, pa.Table) else pa.Table.from_batches([table])
    if p.positional is not None:
        t = t.select(list(p.positional))
    out = pds.dataset(t).to_table(columns={"m": p.expression}).column("m")
    return out.combine_chunks()


def matches(p: Predicate | None, table: pa.Table) -> pa.Table:
    """The rows of ``table`` for which ``p`` is TRUE (NULL and FALSE are dropped)."""
    if p is None or table.num_rows == 0:
        return table
    return table.filter(pc.fill_null(evaluate(p, table), False))


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


def to_arrow_filter(p: Predicate) -> pc.Expression:
    """An Arrow expression that is TRUE exactly where ``p`` is TRUE, for Lance's scanner
    (which evaluates it with DataFusion's semantics, as :func:`evaluate` does).

    Example:
        >>> to_arrow_filter(Not(InList("s", pa.array(["a"])))).equals(
        ...     pc.field("s").is_valid() & ~pc.field("s").isin(["a"]))
        True
    """
    return _arrow(negation_normal_form(p))


def _arrow(p: Predicate) -> pc.Expression:
    if isinstance(p, Const):
        return pc.scalar(bool(p.value))
    if isinstance(p, (And, Or)):
        # Pairwise, so the tree is balanced: pyarrow's Substrait (Lance's way in) doubles in
        # size with each level of nesting, and a chain of n terms is n levels deep.
        parts = [_arrow(c) for c in p.children]
        while len(parts) > 1:
            pairs = zip(parts[::2], parts[1::2])
            joined = [(a & b) if isinstance(p, And) else (a | b) for a, b in pairs]
            parts = joined + parts[len(joined) * 2 :]
        return parts[0]
    if isinstance(p, Compare):
        return _ARROW_OPS[p.op](pc.field(p.column), pc.scalar(p.value))
    if isinstance(p, ColumnCompare):
        return _ARROW_OPS[p.op](pc.field(p.left), pc.field(p.right))
    if isinstance(p, IsNull):
        return pc.field(p.column).is_null()
    if isinstance(p, InList):
        return _is_in(p)
    if isinstance(p, Opaque):
        return p.expression
    assert isinstance(p, Not)
    child = p.child
    if isinstance(child, IsNull):
        return pc.field(child.column).is_valid()
    if isinstance(child, InList):
        if child.has_null:
            return pc.scalar(False)  # x NOT IN (..., NULL) is never TRUE
        if len(child.values) == 0:
            return pc.scalar(True)  # x IN () is FALSE, even for NULL
        return pc.field(child.column).is_valid() & ~_is_in(child)
    return ~_arrow(child)


def has_float_in_list(p: Predicate, schema: pa.Schema) -> bool:
    """Lance compares a float IN list with `=` (-0.0 matches 0.0); DataFusion's SQL uses a
    hash set (it does not), so such a filter is evaluated after reading."""
    if isinstance(p, (And, Or)):
        return any(has_float_in_list(c, schema) for c in p.children)
    if isinstance(p, Not):
        return has_float_in_list(p.child, schema)
    return (
        isinstance(p, InList)
        and p.column in schema.names
        and pa.types.is_floating(schema.field(p.column).type)
    )


def has_opaque(p: Predicate) -> bool:
    if isinstance(p, (And, Or)):
        return any(has_opaque(c) for c in p.children)
    if isinstance(p, Not):
        return has_opaque(p.child)
    return isinstance(p, Opaque)


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
