"""Arrow types as Spark takes them: what Spark rejects is cast to the nearest type it accepts.

Spark's Arrow conversion refuses ``string_view``/``binary_view``, unsigned integers, ``float16``
and keeps no fixed-size lists; this module maps each to a type Spark reads, losslessly
(``uint64`` becomes ``decimal(20, 0)``), so query results and table reads reach Spark with
the same values.

Example:
    >>> spark_compatible(pa.schema([("n", pa.uint32()), ("s", pa.string_view())]))
    n: int64
    s: string
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def spark_type(t: pa.DataType) -> pa.DataType:
    """The type Spark reads for values of ``t`` (``t`` itself when Spark takes it)."""
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if (
        pa.types.is_binary_view(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return pa.binary()
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(
            t.bit_width, pa.decimal128(20, 0)
        )
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type)
    if (
        pa.types.is_fixed_size_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_list(t)
    ):
        return pa.list_(_field(t.value_field))
    if pa.types.is_struct(t):
        return pa.struct([_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(spark_type(t.key_type), spark_type(t.item_type))
    return t


def _field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, spark_type(f.type), f.nullable)


def spark_compatible(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every type Spark rejects replaced (see :func:`spark_type`)."""
    return pa.schema([_field(f) for f in schema])


def to_spark_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast to ``schema`` (a :func:`spark_compatible` schema), by column name."""
    columns = [batch.column(f.name).cast(f.type) for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def as_arrow_table(result: Any) -> pa.Table:
    """A query result (pyarrow Table or RecordBatch(Reader), DataFusion DataFrame, anything
    with ``__arrow_c_stream__``) as a pyarrow Table."""
    if isinstance(result, pa.Table):
        return result
    if isinstance(result, pa.RecordBatch):
        return pa.Table.from_batches([result])
    if isinstance(result, pa.RecordBatchReader):
        return result.read_all()
    if hasattr(result, "to_arrow_table"):
        return result.to_arrow_table()
    return pa.table(result)
