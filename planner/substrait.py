"""Pushed filters in and out of Substrait: DataFusion's filter decoded into the predicate
tree (:func:`decode_filter`), and the tree handed to Lance (:func:`lance_filter`).

DataFusion hands a table's pushed filter to the dataset protocol as a ``pyarrow.compute``
Expression, which has no introspection API; its Substrait form
(``Expression.to_substrait``, parsed with the ``substrait`` package's classes) has every
value of every ``IN`` list and every literal typed. What pyarrow writes there that newer
Substrait no longer names is in :mod:`memwal_sql.compat.arrow`.

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    >>> decode_filter(~pc.field("s").isin(["a", "b"]), schema)
    Not(child=InList(column='s', values=['a', 'b'], has_null=False))
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from decimal import Decimal
from operator import attrgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
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
from planner.predicate import (
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
    has_float_in_list,
    has_opaque,
    to_arrow_filter,
)

__all__ = ["decode_filter", "lance_filter"]


class _Undecodable(Exception):
    pass


def decode_filter(
    expr: pc.Expression | pa.Scalar | bool | None, schema: pa.Schema
) -> Predicate | None:
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
        self.functions = {
            e.extension_function.function_anchor: e.extension_function.name
            for e in message.extensions
        }

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
        return Opaque(
            bound.expressions["p"],
            tuple(sorted(self._columns(e))),
            positional=tuple(self.schema.names),
        )

    def _columns(self, e: Any) -> set[str]:
        out: set[str] = set()
        for desc, value in e.ListFields():
            if desc.name == "selection":
                out.add(self._column(value))
            elif desc.message_type is not None:
                for v in value if desc.label == desc.LABEL_REPEATED else [value]:
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
        if (
            name in ("is_null", "is_not_null")
            and len(args) == 1
            and args[0].WhichOneof("rex_type") == "selection"
        ):
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
        if s.value.WhichOneof("rex_type") != "selection":
            raise _Undecodable
        column = self._column(s.value.selection)
        typ = self.schema.field(column).type
        # An option that is not a literal reads as an empty literal (kind None), as does a
        # deprecated literal kind (read from unknown fields): both take the checked path.
        literals = [o.literal for o in s.options]
        kinds = {lit.WhichOneof("literal_type") for lit in literals}
        if len(kinds) == 1 and None not in kinds:  # one array for the list, not a scalar each
            fast = _plain_literals(literals, kinds.pop(), typ)
            if fast is not None:
                return InList(column, fast)
        if any(o.WhichOneof("rex_type") != "literal" for o in s.options):
            raise _Undecodable
        values = [self._literal(lit, typ) for lit in literals]
        present = [v for v in values if v is not None]
        array = (
            pa.array([v.as_py() for v in present], type=typ) if present else pa.array([], type=typ)
        )
        return InList(column, array, has_null=len(present) != len(values))

    def _column(self, selection: Any) -> str:
        if selection.WhichOneof(
            "root_type"
        ) != "root_reference" or selection.direct_reference.struct_field.HasField("child"):
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


# Literal kinds that convert to a column type by a plain cast of the whole list.
_PLAIN_KINDS = {"i8", "i16", "i32", "i64", "string", "binary"}


def _plain_literals(literals: list[Any], kind: str, typ: pa.DataType) -> pa.Array | None:
    """The values of an IN list whose literals are all of one plain ``kind`` (integers,
    strings, binaries; no NULL), cast to ``typ`` as a whole; None otherwise."""
    if kind not in _PLAIN_KINDS or not (
        pa.types.is_integer(typ)
        or pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_string_view(typ)
    ):
        return None
    try:
        return pa.array(list(map(attrgetter(kind), literals))).cast(typ)  # safe: overflow raises
    except (pa.ArrowException, ValueError, OverflowError):
        return None


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


_WRAPPERS = {
    f"type.googleapis.com/{w.DESCRIPTOR.full_name}": w
    for w in (
        wrappers_pb2.Int32Value,
        wrappers_pb2.Int64Value,
        wrappers_pb2.UInt32Value,
        wrappers_pb2.UInt64Value,
        wrappers_pb2.StringValue,
        wrappers_pb2.BytesValue,
        wrappers_pb2.FloatValue,
        wrappers_pb2.DoubleValue,
        wrappers_pb2.BoolValue,
    )
}


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
    if kind in (
        "boolean",
        "i8",
        "i16",
        "i32",
        "i64",
        "fp32",
        "fp64",
        "string",
        "binary",
        "fixed_binary",
        "fixed_char",
        "var_char",
    ):
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


def lance_filter(p: Predicate | None, schema: pa.Schema) -> tuple[pc.Expression | None, bool]:
    """(the filter to push into a Lance scan of ``schema``, whether it is exact).

    Lance turns the filter into Substrait itself; a filter pyarrow cannot express there (a
    timestamp[ns] literal), or one Lance would evaluate differently (an IN list of floats), is
    not pushed, and the caller evaluates ``p`` on what it reads.

    Example:
        >>> lance_filter(Compare("id", ">", pa.scalar(3)), pa.schema([("id", pa.int64())]))[1]
        True
    """
    if p is None:
        return None, True
    if has_opaque(p) or has_float_in_list(p, schema):
        return None, False
    expr = to_arrow_filter(p)
    try:
        expr.to_substrait(substrait_schema(schema))
    except (pa.ArrowException, TypeError, ValueError):
        return None, False
    return expr, True
