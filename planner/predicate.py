"""Predicates as data: the planner's typed predicate tree, decoded from a pushed filter.

DataFusion hands a table's pushed filter to the dataset protocol as a ``pyarrow.compute``
Expression, which has no introspection API. It is decoded here from its Substrait form
(``Expression.to_substrait``, parsed with the ``substrait`` package's protobuf classes) into a
small tree: comparisons of a column with a literal or another column, ``IN`` lists with every
value, ``IS NULL``, ``AND``/``OR``/``NOT`` and constants. No text is parsed anywhere.

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
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    >>> pred = decode_filter(~pc.field("s").isin(["a", "b"]), schema)
    >>> pred
    Not(child=InList(column='s', values=['a', 'b'], has_null=False))
    >>> evaluate(pred, pa.table({"id": [1, 2, 3], "s": ["a", None, "c"]})).to_pylist()
    [False, None, True]
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from google.protobuf import wrappers_pb2
from google.protobuf.unknown_fields import UnknownFieldSet
from substrait.algebra_pb2 import Expression as SubstraitExpression
from substrait.extended_expression_pb2 import ExtendedExpression

from memwal_sql.compat.arrow import (
    DEPRECATED_TIME,
    DEPRECATED_TIMESTAMP,
    DEPRECATED_TIMESTAMP_TZ,
    substrait_schema,
)

__all__ = [
    "And", "ColumnCompare", "Compare", "Const", "InList", "IsNull", "Not", "Opaque", "Or",
    "Predicate", "decode_filter", "evaluate", "negation_normal_form", "to_arrow_filter",
    "conjuncts", "columns_of",
]

OPS = ("=", "!=", "<", "<=", ">", ">=")
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
        return (isinstance(other, Compare) and (self.column, self.op) == (other.column, other.op)
                and self.value.equals(other.value))

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
        return (f"InList(column={self.column!r}, values={self.values.to_pylist()!r}, "
                f"has_null={self.has_null})")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, InList) and self.column == other.column
                and self.has_null == other.has_null and self.values.equals(other.values))

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
# Decoding
# ------------------------------------------------------------------------------------------

class _Undecodable(Exception):
    pass


def decode_filter(expr: pc.Expression | pa.Scalar | bool | None,
                  schema: pa.Schema) -> Predicate | None:
    """The predicate tree of a pushed filter (None for no filter).

    A constant-folded filter (DataFusion passes ``v = 1 AND v = 2`` as a boolean scalar) is a
    :class:`Const`.

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
        message = ExtendedExpression()
        message.ParseFromString(bytes(expr.to_substrait(substrait_schema(schema))))
    except (pa.ArrowException, TypeError, ValueError):
        return Opaque(expr)  # e.g. a timestamp[ns] literal: pyarrow has no Substrait form
    return _Decoder(message, schema).decode(message.referred_expr[0].expression)


class _Decoder:
    def __init__(self, message: ExtendedExpression, schema: pa.Schema) -> None:
        self.message = message
        self.schema = schema
        self.functions = {e.extension_function.function_anchor: e.extension_function.name
                          for e in message.extensions}

    def decode(self, e: SubstraitExpression) -> Predicate:
        try:
            return self._decode(e)
        except _Undecodable:
            return self._opaque(e)

    def _opaque(self, e: SubstraitExpression) -> Predicate:
        """The subtree as an Arrow expression again (pyarrow reads its own Substrait)."""
        sub = ExtendedExpression()
        sub.CopyFrom(self.message)
        del sub.referred_expr[:]
        sub.referred_expr.add(output_names=["p"]).expression.CopyFrom(e)
        bound = pa.substrait.deserialize_expressions(sub.SerializeToString())
        return Opaque(bound.expressions["p"], tuple(sorted(self._columns(e))),
                      positional=tuple(self.schema.names))

    def _columns(self, e: Any) -> set[str]:
        out: set[str] = set()
        for desc, value in e.ListFields():
            if desc.name == "selection":
                out.add(self._column(value))
            elif desc.message_type is not None:
                for v in (value if desc.label == desc.LABEL_REPEATED else [value]):
                    if hasattr(v, "ListFields"):
                        out |= self._columns(v)
        return out

    def _decode(self, e: SubstraitExpression) -> Predicate:
        kind = e.WhichOneof("rex_type")
        if kind == "literal":
            value = self._literal(e.literal, pa.bool_())
            return Const(None if value is None else bool(value.as_py()))
        if kind == "selection":
            name = self._column(e.selection)
            if not pa.types.is_boolean(self.schema.field(name).type):
                raise _Undecodable
            return Compare(name, "=", pa.scalar(True))
        if kind == "singular_or_list":
            return self._in_list(e.singular_or_list)
        if kind != "scalar_function":
            raise _Undecodable
        fn = e.scalar_function
        name = self.functions.get(fn.function_reference, "")
        args = [a.value for a in fn.arguments]
        if name in ("and", "or"):
            children = tuple(self.decode(a) for a in args)
            return And(children) if name == "and" else Or(children)
        if name == "not" and len(args) == 1:
            return Not(self.decode(args[0]))
        if name in ("is_null", "is_not_null") and len(args) == 1 and \
                args[0].WhichOneof("rex_type") == "selection":
            node = IsNull(self._column(args[0].selection))
            return node if name == "is_null" else Not(node)
        op = _COMPARISONS.get(name)
        if op is None or len(args) != 2:
            raise _Undecodable
        kinds = [a.WhichOneof("rex_type") for a in args]
        if kinds == ["selection", "selection"]:
            left, right = (self._column(a.selection) for a in args)
            if self.schema.field(left).type != self.schema.field(right).type:
                raise _Undecodable
            return ColumnCompare(left, op, right)
        if kinds == ["literal", "selection"]:
            args, op = args[::-1], FLIP[op]
        elif kinds != ["selection", "literal"]:
            raise _Undecodable
        column = self._column(args[0].selection)
        value = self._literal(args[1].literal, self.schema.field(column).type)
        return Const(None) if value is None else Compare(column, op, value)

    def _in_list(self, s: Any) -> Predicate:
        if s.value.WhichOneof("rex_type") != "selection" or \
                any(o.WhichOneof("rex_type") != "literal" for o in s.options):
            raise _Undecodable
        column = self._column(s.value.selection)
        typ = self.schema.field(column).type
        values = [self._literal(o.literal, typ) for o in s.options]
        present = [v for v in values if v is not None]
        array = pa.array([v.as_py() for v in present], type=typ) if present else \
            pa.array([], type=typ)
        return InList(column, array, has_null=len(present) != len(values))

    def _column(self, selection: Any) -> str:
        if selection.WhichOneof("root_type") != "root_reference" or \
                selection.direct_reference.struct_field.HasField("child"):
            raise _Undecodable
        index = selection.direct_reference.struct_field.field
        if not 0 <= index < len(self.schema):
            raise _Undecodable
        return self.schema.field(index).name

    def _literal(self, lit: Any, typ: pa.DataType) -> pa.Scalar | None:
        """The literal as a scalar of ``typ`` (None for NULL)."""
        value = _literal_value(lit)
        if value is None:
            return None
        try:
            if isinstance(value, _Micros):
                scalar = pa.scalar(value.micros, pa.timestamp("us", getattr(typ, "tz", None)))
                return scalar.cast(typ)
            if isinstance(value, _TimeMicros):
                return pa.scalar(value.micros, pa.time64("us")).cast(typ)
            if isinstance(value, _Days):
                return pa.scalar(value.days, pa.date32()).cast(typ)
            if pa.types.is_dictionary(typ):
                raise _Undecodable
            return pa.scalar(value, type=typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise _Undecodable from e


_COMPARISONS = {"equal": "=", "not_equal": "!=", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}


@dataclass(frozen=True)
class _Micros:
    micros: int


@dataclass(frozen=True)
class _TimeMicros:
    micros: int


@dataclass(frozen=True)
class _Days:
    days: int


_WRAPPERS = {f"type.googleapis.com/{w.DESCRIPTOR.full_name}": w for w in (
    wrappers_pb2.Int32Value, wrappers_pb2.Int64Value, wrappers_pb2.UInt32Value,
    wrappers_pb2.UInt64Value, wrappers_pb2.StringValue, wrappers_pb2.BytesValue,
    wrappers_pb2.FloatValue, wrappers_pb2.DoubleValue, wrappers_pb2.BoolValue)}


def _literal_value(lit: Any) -> Any:
    kind = lit.WhichOneof("literal_type")
    if kind is None:
        for f in UnknownFieldSet(lit):
            if f.field_number in (DEPRECATED_TIMESTAMP, DEPRECATED_TIMESTAMP_TZ):
                return _Micros(_signed64(f.data))
            if f.field_number == DEPRECATED_TIME:
                return _TimeMicros(_signed64(f.data))
        raise _Undecodable
    if kind == "null":
        return None
    if kind in ("boolean", "i8", "i16", "i32", "i64", "fp32", "fp64", "string", "binary",
                "fixed_binary", "fixed_char", "var_char"):
        value = getattr(lit, kind)
        return value.value if kind == "var_char" else value
    if kind == "date":
        return _Days(lit.date)
    if kind == "decimal":
        unscaled = int.from_bytes(lit.decimal.value, "little", signed=True)
        return Decimal(unscaled).scaleb(-lit.decimal.scale)
    if kind == "user_defined" and lit.user_defined.HasField("value"):
        wrapper = _WRAPPERS.get(lit.user_defined.value.type_url)
        if wrapper is not None:
            message = wrapper()
            lit.user_defined.value.Unpack(message)
            return message.value
    raise _Undecodable


def _signed64(data: int) -> int:
    return struct.unpack("<q", struct.pack("<Q", data & (2**64 - 1)))[0]


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


def columns_of(p: Predicate) -> set[str]:
    """Every column ``p`` reads."""
    if isinstance(p, (And, Or)):
        return set().union(*(columns_of(c) for c in p.children))
    if isinstance(p, Not):
        return columns_of(p.child)
    if isinstance(p, (Compare, InList, IsNull)):
        return {p.column}
    if isinstance(p, ColumnCompare):
        return {p.left, p.right}
    if isinstance(p, Opaque):
        return set(p.columns)
    return set()


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
        return pa.array(np.full(n, p.value), pa.bool_()) if p.value is not None else \
            pa.nulls(n, pa.bool_())
    if isinstance(p, And) or isinstance(p, Or):
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


def _compare(left: pa.Array, op: str, right: pa.Array | pa.Scalar) -> pa.Array:
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
    fn = {"=": pc.equal, "!=": pc.not_equal, "<": pc.less, "<=": pc.less_equal,
          ">": pc.greater, ">=": pc.greater_equal}[op]
    return fn(left, right)


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
        parts = [_arrow(c) for c in p.children]
        out = parts[0]
        for part in parts[1:]:
            out = (out & part) if isinstance(p, And) else (out | part)
        return out
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
        return pc.field(child.column).is_valid() & ~_is_in(child)
    return ~_arrow(child)


def _has_float_in_list(p: Predicate, schema: pa.Schema) -> bool:
    """Lance compares a float IN list with `=` (-0.0 matches 0.0); DataFusion's SQL uses a
    hash set (it does not), so such a filter is evaluated after reading."""
    if isinstance(p, (And, Or)):
        return any(_has_float_in_list(c, schema) for c in p.children)
    if isinstance(p, Not):
        return _has_float_in_list(p.child, schema)
    return isinstance(p, InList) and p.column in schema.names and \
        pa.types.is_floating(schema.field(p.column).type)


def _has_opaque(p: Predicate) -> bool:
    if isinstance(p, (And, Or)):
        return any(_has_opaque(c) for c in p.children)
    if isinstance(p, Not):
        return _has_opaque(p.child)
    return isinstance(p, Opaque)


def _is_in(p: InList) -> pc.Expression:
    if len(p.values) == 0:
        return pc.scalar(False)
    return pc.field(p.column).isin(p.values)


_ARROW_OPS = {
    "=": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


def lance_filter(p: Predicate | None, schema: pa.Schema) -> tuple[pc.Expression | None, bool]:
    """(the filter to push into a Lance scan of ``schema``, whether it is exact).

    Lance turns the filter into Substrait itself; a filter pyarrow cannot express there (a
    timestamp[ns] literal), or one Lance would evaluate differently (an IN list of floats), is
    not pushed, and the caller evaluates ``p`` on what it reads.
    """
    if p is None:
        return None, True
    if _has_opaque(p) or _has_float_in_list(p, schema):
        return None, False
    expr = to_arrow_filter(p)
    try:
        expr.to_substrait(substrait_schema(schema))
    except (pa.ArrowException, TypeError, ValueError):
        return None, False
    return expr, True

