"""Spark's pushed filters as the planner's predicate tree, so region pruning and the exact
filtering of every source apply to Spark reads as to SQL.

Only filters whose meaning is the same in Spark and in the tree are taken (comparisons, ``IN``,
``IS [NOT] NULL`` and ``NOT`` of those, on integer, floating-point, decimal, string, binary,
boolean and date columns); Spark evaluates the rest itself.

Example:
    >>> from pyspark.sql.datasource import EqualTo, In
    >>> schema = pa.schema([("id", pa.int64())])
    >>> spark_predicate(In(("id",), (1, 2)), schema)
    InList(column='id', values=[1, 2], has_null=False)
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import datasource as sds

from memwal_sql.expressions.predicate import Compare, InList, IsNull, Not, Predicate

_OPS = {
    sds.EqualTo: "=",
    sds.GreaterThan: ">",
    sds.GreaterThanOrEqual: ">=",
    sds.LessThan: "<",
    sds.LessThanOrEqual: "<=",
}


def _pushable(t: pa.DataType) -> bool:
    return (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_date32(t)
    )


def spark_predicate(f: Any, schema: pa.Schema) -> Predicate | None:
    """The tree for Spark filter ``f``, or None if it is not taken."""
    if isinstance(f, sds.Not):
        child = spark_predicate(f.child, schema)
        return None if child is None else Not(child)
    attribute = getattr(f, "attribute", None)
    if attribute is None or len(attribute) != 1 or attribute[0] not in schema.names:
        return None
    column = attribute[0]
    typ = schema.field(column).type
    if not _pushable(typ):
        return None
    try:
        if isinstance(f, sds.IsNull):
            return IsNull(column)
        if isinstance(f, sds.IsNotNull):
            return Not(IsNull(column))
        if isinstance(f, sds.In):
            present = [v for v in f.value if v is not None]
            return InList(
                column, pa.array(present, type=typ), has_null=len(present) != len(f.value)
            )
        if isinstance(f, sds.EqualNullSafe):
            # NULL <=> v is FALSE where NULL = v is NULL: the same rows are kept.
            return (
                IsNull(column)
                if f.value is None
                else Compare(column, "=", pa.scalar(f.value, type=typ))
            )
        op = _OPS.get(type(f))
        if op is None or f.value is None:
            return None
        return Compare(column, op, pa.scalar(f.value, type=typ))
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None  # a value the column cannot hold exactly: Spark compares it
