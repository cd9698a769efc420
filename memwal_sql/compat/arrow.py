"""What pyarrow 26 writes into Substrait for a filter (``Expression.to_substrait``).

* pyarrow needs the PyPI ``substrait`` package importable (``substrait.proto``) or it says
  it was "not built with support for Substrait".
* Timestamps and times are written in literal fields newer Substrait versions removed
  (field 14: microseconds since the epoch; 27: the same with a time zone; 17: time of day in
  microseconds), which the ``substrait`` package's classes leave as unknown fields.
* date64, unsigned integers and large strings/binaries are ``user_defined`` literals holding
  a protobuf wrapper (``google.protobuf.Int64Value`` ...).
* Some types have no Substrait form at all: fixed-size lists (vectors) and durations in a
  schema, and timestamp[ns] literals.
"""

from __future__ import annotations

import pyarrow as pa

DEPRECATED_TIMESTAMP, DEPRECATED_TIME, DEPRECATED_TIMESTAMP_TZ = 14, 17, 27

_NO_SUBSTRAIT_TYPE = (pa.types.is_fixed_size_list, pa.types.is_duration)


def substrait_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types pyarrow cannot put in Substrait replaced by ``null``: a
    filter never compares them with a literal, and one that does is left undecoded.

    Example:
        >>> substrait_schema(pa.schema([("v", pa.list_(pa.float32(), 2))])).field("v").type
        DataType(null)
    """
    return pa.schema(
        [
            f.with_type(pa.null()) if any(p(f.type) for p in _NO_SUBSTRAIT_TYPE) else f
            for f in schema
        ]
    )
