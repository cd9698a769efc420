"""Pushed filters in and out of Arrow: DataFusion's filter decoded into the predicate tree
(:func:`decode_filter`), and the tree handed to Lance as Substrait (:func:`lance_filter`).

DataFusion hands a table's pushed filter to the dataset protocol as a ``pyarrow.compute``
Expression, which has no introspection API. Its Arrow serialization (what pickling writes,
:func:`memwal_sql.compat.arrow.expression_parts`) lists every node in prefix order with every
literal and ``IN`` list as a typed Arrow value, and is linear in the filter's size; its
Substrait form is not (see :mod:`memwal_sql.compat.arrow`), so a filter is never decoded from
Substrait, and one too big for it is applied after Lance reads (:data:`MAX_LANCE_FILTER_WEIGHT`).

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    >>> decode_filter(~pc.field("s").isin(["a", "b"]), schema)
    Not(child=InList(column='s', values=['a', 'b'], has_null=False))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.compat.arrow import expression_of_parts, expression_parts, substrait_schema
from memwal_sql.expressions.predicate import (
    FLIP,
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
from memwal_sql.expressions.visitors import has_float_in_list, has_opaque, to_arrow_filter

__all__ = ["MAX_LANCE_FILTER_WEIGHT", "decode_filter", "lance_filter", "substrait_weight"]

#: A filter whose Substrait would weigh more is not pushed into Lance's scan but applied to
#: what it reads. pyarrow's Substrait, Lance's only way in, repeats a leaf (column, literal, IN
#: list) once per call it is nested in, doubling at each level: it holds about 32 bytes per
#: unit of weight, the sum over the leaves of 2 ** depth (measured to within 3%). 2 ** 14 is
#: 0.5 MB, written again on every scan (benchmarks/bench_inputs.py): 64 comparisons in one AND or OR (written as a
#: balanced tree), or 12 nested levels.
MAX_LANCE_FILTER_WEIGHT = 1 << 14


def decode_filter(
    expr: pc.Expression | pa.Scalar | bool | None, schema: pa.Schema
) -> Predicate | None:
    """The predicate tree of a pushed filter (None for no filter), in time linear in its size.

    A constant-folded filter (DataFusion passes ``v = 1 AND v = 2`` as a boolean scalar) is a
    :class:`Const`. A chain of ``AND`` (or of ``OR``) becomes one node, however deep
    DataFusion nests it.

    Example:
        >>> decode_filter(pa.scalar(False), pa.schema([("v", pa.int64())]))
        Const(value=False)
    """
    if expr is None:
        return None
    if isinstance(expr, (bool, pa.BooleanScalar)):
        return Const(expr if isinstance(expr, bool) else expr.as_py())
    if isinstance(expr, pa.Scalar):
        return Const(None) if not expr.is_valid else Const(bool(expr.as_py()))
    try:
        parts, batch = expression_parts(expr)
    except (pa.ArrowException, TypeError, ValueError):
        return Opaque(expr)  # e.g. a nested field reference: Arrow does not serialize it
    return _Decoder(parts, batch, schema).decode()


@dataclass(frozen=True)
class _Other:
    """A node the tree does not model: parts ``start`` to ``end`` (inclusive) of the filter."""

    start: int
    end: int


@dataclass(frozen=True)
class _Field(_Other):
    name: str


@dataclass(frozen=True)
class _Literal(_Other):
    value: pa.Scalar


_Node = Predicate | _Other
ScalarOrArray = TypeVar("ScalarOrArray", pa.Scalar, pa.Array)

_COMPARISONS = {
    "equal": "=",
    "not_equal": "!=",
    "less": "<",
    "less_equal": "<=",
    "greater": ">",
    "greater_equal": ">=",
}


class _Decoder:
    """Turns the prefix-ordered parts of a filter into the tree with one pass and a stack
    (no recursion: a chain of thousands of ``OR`` s is as deep)."""

    def __init__(self, parts: list[tuple[str, str]], batch: pa.RecordBatch, schema: pa.Schema):
        self.parts = parts
        self.batch = batch
        self.schema = schema

    def decode(self) -> Predicate:
        calls: list[tuple[str, int, list[_Node], pa.Scalar | None]] = []
        done: list[_Node] = []
        for at, (kind, value) in enumerate(self.parts):
            if kind == "call":
                calls.append((value, at, [], None))
                continue
            if kind == "options":
                name, start, args, _ = calls[-1]
                calls[-1] = (name, start, args, self.batch.column(int(value))[0])
                continue
            node: _Node
            if kind == "field_ref":
                node = _Field(at, at, value) if value in self.schema.names else _Other(at, at)
            elif kind == "literal":
                node = _Literal(at, at, self.batch.column(int(value))[0])
            else:  # "end"
                name, start, args, options = calls.pop()
                node = self._call(name, args, options) or _Other(start, at)
            (calls[-1][2] if calls else done).append(node)
        return self._predicate(done[0])

    def _call(self, name: str, args: list[_Node], options: pa.Scalar | None) -> Predicate | None:
        """The call as a predicate, or None if the tree does not model it."""
        if name in ("and_kleene", "or_kleene"):
            kind = And if name == "and_kleene" else Or
            children: list[Predicate] = []
            for arg in args:
                p = self._predicate(arg)
                children.extend(p.children if isinstance(p, kind) else [p])
            return kind(tuple(children))
        if name == "invert" and len(args) == 1:
            return Not(self._predicate(args[0]))
        if name in ("is_null", "is_valid") and len(args) == 1 and isinstance(args[0], _Field):
            if options is not None and options.get("nan_is_null", pa.scalar(False)).as_py():
                return None  # NaN counted as NULL: not SQL's IS NULL
            node = IsNull(args[0].name)
            return node if name == "is_null" else Not(node)
        if name == "is_in" and len(args) == 1 and isinstance(args[0], _Field):
            return self._in_list(args[0].name, options)
        op = _COMPARISONS.get(name)
        if op is None or len(args) != 2:
            return None
        left, right = args
        if isinstance(left, _Field) and isinstance(right, _Field):
            same = self.schema.field(left.name).type == self.schema.field(right.name).type
            return ColumnCompare(left.name, op, right.name) if same else None
        if isinstance(left, _Literal) and isinstance(right, _Field):
            left, right, op = right, left, FLIP[op]
        if not (isinstance(left, _Field) and isinstance(right, _Literal)):
            return None
        if not right.value.is_valid:
            return Const(None)
        value = self._cast(right.value, left.name)
        return None if value is None else Compare(left.name, op, value)

    def _in_list(self, column: str, options: pa.Scalar | None) -> Predicate | None:
        # SQL's IN, whatever the options say of NULLs: a NULL in the list makes a miss NULL.
        if options is None or options.type.get_field_index("value_set") < 0:
            return None
        values = options["value_set"].values
        present = None if values is None else self._cast(values.drop_null(), column)
        if present is None:
            return None
        return InList(column, present, has_null=len(present) < len(values))

    def _cast(self, value: ScalarOrArray, column: str) -> ScalarOrArray | None:
        """``value`` in ``column``'s type (None if it does not convert exactly)."""
        typ = self.schema.field(column).type
        if value.type == typ:
            return value
        if pa.types.is_dictionary(typ):
            return None
        try:
            return value.cast(typ)  # safe: a value that would change raises
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return None

    def _predicate(self, node: _Node) -> Predicate:
        """``node`` where a boolean is expected."""
        if isinstance(node, Predicate):
            return node
        if isinstance(node, _Literal) and pa.types.is_boolean(node.value.type):
            return Const(node.value.as_py())
        if isinstance(node, _Field) and pa.types.is_boolean(self.schema.field(node.name).type):
            return Compare(node.name, "=", pa.scalar(True))
        return self._opaque(node.start, node.end)

    def _opaque(self, start: int, end: int) -> Opaque:
        """Parts ``start`` to ``end`` as an Arrow expression again, for Arrow to evaluate."""
        parts: list[tuple[str, str]] = []
        columns: list[pa.Array] = []
        renumbered: dict[str, str] = {}
        for kind, value in self.parts[start : end + 1]:
            if kind in ("literal", "options"):
                if value not in renumbered:
                    renumbered[value] = str(len(columns))
                    columns.append(self.batch.column(int(value)))
                value = renumbered[value]
            parts.append((kind, value))
        names = sorted({v for k, v in parts if k == "field_ref"})
        return Opaque(expression_of_parts(parts, columns), tuple(names))


def lance_filter(p: Predicate | None, schema: pa.Schema) -> tuple[pc.Expression | None, bool]:
    """(the filter to push into a Lance scan of ``schema``, whether it is exact).

    Lance turns the filter into Substrait itself; a filter pyarrow cannot express there (a
    timestamp[ns] literal), one Lance would evaluate differently (an IN list of floats), or
    one whose Substrait would weigh more than :data:`MAX_LANCE_FILTER_WEIGHT` is not pushed,
    and the caller evaluates ``p`` on what it reads.

    Example:
        >>> lance_filter(Compare("id", ">", pa.scalar(3)), pa.schema([("id", pa.int64())]))[1]
        True
    """
    if p is None:
        return None, True
    if has_opaque(p) or has_float_in_list(p, schema) or 2 * _leaves(p) > MAX_LANCE_FILTER_WEIGHT:
        return None, False  # (each leaf of a filter weighs 2 at least: no need to write it)
    expr = to_arrow_filter(p)
    if substrait_weight(expr) > MAX_LANCE_FILTER_WEIGHT:
        return None, False
    try:
        expr.to_substrait(substrait_schema(schema))
    except (pa.ArrowException, TypeError, ValueError):
        return None, False
    return expr, True


def _leaves(p: Predicate) -> int:
    if isinstance(p, (And, Or)):
        return sum(_leaves(c) for c in p.children)
    return _leaves(p.child) if isinstance(p, Not) else 1


def substrait_weight(expr: pc.Expression) -> int:
    """The sum over the leaves of ``expr`` of 2 ** their depth: what the size of pyarrow's
    Substrait of it follows (see :data:`MAX_LANCE_FILTER_WEIGHT`), found in linear time.

    Example:
        >>> substrait_weight((pc.field("a") > 1) | (pc.field("b") > 2))
        16
    """
    depth = weight = 0
    for kind, _ in expression_parts(expr)[0]:
        if kind == "call":
            depth += 1
        elif kind == "end":
            depth -= 1
        else:
            weight += 1 << depth
    return weight
