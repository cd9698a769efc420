"""The seed spec's other transforms: date parts, truncate, and DataFusion SQL expressions.

Date parts and expressions run in DataFusion, through one ``SessionContext`` per thread.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.errors import InvalidInputError, InvalidRegionSpecError
from memwal_sql.index.arrow_types import _is_int, _is_string
from memwal_sql.index.murmur3 import _decode_dictionary, _primitive, _valid_mask

# --------------------------------------------------------------------------------------------
# Other transforms
# --------------------------------------------------------------------------------------------


def _date_part(arr: pa.Array, part: str) -> pa.Array:
    """`date_part(part, col)` as int32, for date32/date64/timestamp columns.

    This runs DataFusion's own ``date_part``, because that *is* the seed spec's definition
    of these transforms. pyarrow's ``pc.year`` etc. are not equivalent:

    * pyarrow keeps the year in 16 bits. It wraps for |year| > 32767 (timestamp[us] 2**62
      gives 17036 in pyarrow, 148108 in DataFusion). DataFusion returns NULL outside chrono's
      range, e.g. date32 2**31-1.
    * For tz-aware timestamps, both use the local time of the column's zone. But their time
      zone databases disagree on far-future DST (after 2037), so they differ by an hour
      there.
    """
    arr = _decode_dictionary(arr)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.int32())
    out = _eval_expression(f"date_part('{part}', col0)", [arr], len(arr))
    return out if out.type == pa.int32() else out.cast(pa.int32())


def _truncate(arr: pa.Array, width: int) -> pa.Array:
    """Seed `truncate`: `left(col, W)` for strings; `col - (col mod W)` with floor mod for ints.

    Floor semantics (Iceberg's too): -7 truncated to width 5 is -10, not -5. DataFusion's
    `%` is truncating, so the SQL text `col0 - (col0 % 5)` would give -5 for -7.
    """
    arr = _decode_dictionary(arr)
    t = arr.type
    if pa.types.is_null(t):
        return arr
    if _is_string(t):
        # utf8_slice_codeunits counts code points, like DataFusion's left().
        return pc.utf8_slice_codeunits(arr, 0, width)
    if not _is_int(t):
        raise InvalidRegionSpecError(f"truncate needs an integer or string column, got {t}")
    valid = _valid_mask(arr)
    mask = None if valid is None else ~valid
    np_type = np.dtype(t.to_pandas_dtype())
    if pa.types.is_unsigned_integer(t):
        v = _primitive(arr, np_type).astype(np.uint64)
        out = v - v % np.uint64(width)  # never below 0, so it always fits the source type
        return pa.array(out.astype(np_type), type=t, mask=mask)
    v = _primitive(arr, np_type).astype(np.int64)
    out = v - np.mod(v, np.int64(width)) if width <= np.iinfo(np.int64).max else None
    info = np.iinfo(np_type)
    # The result is <= v. It can only leave the type's range downward, which wraps around
    # for int64 and shows up as out > v.
    bad = (out > v) | (out < info.min) if out is not None else np.ones(len(v), bool)
    if valid is not None:
        bad &= valid
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise InvalidInputError(
            f"truncate({width}) of {int(v[row])} does not fit {t}; use a smaller width"
        )
    return pa.array(out.astype(np_type), type=t, mask=mask)


_DF_LOCAL = threading.local()


def _datafusion_context() -> Any:
    """One DataFusion SessionContext per thread, created on first use.

    target_partitions=1 makes DataFusion keep the input row order. A projection over one
    partition is never repartitioned, so output row i is input row i.
    """
    ctx = getattr(_DF_LOCAL, "ctx", None)
    if ctx is None:
        from datafusion import SessionConfig, SessionContext  # imported lazily: slow import

        ctx = SessionContext(SessionConfig().with_target_partitions(1))
        _DF_LOCAL.ctx = ctx
    return ctx


def _eval_expression(sql: str, arrays: Sequence[pa.Array], n: int) -> pa.Array:
    """Evaluate a DataFusion SQL expression over one batch with columns col0..colN."""
    batch = pa.record_batch({f"col{i}": a for i, a in enumerate(arrays)}) if arrays else (
        pa.record_batch({"__row": pa.nulls(n)})
    )
    ctx = _datafusion_context()
    # A unique name per call: the context is reused across batches, and a leftover
    # registration must never be read by another call.
    name = f"region_input_{uuid.uuid4().hex}"
    ctx.register_record_batches(name, [[batch]])
    try:
        result = ctx.sql(f"SELECT {sql} AS v FROM {name}").to_arrow_table()
    except Exception as exc:  # DataFusion raises plain Exception subclasses
        raise InvalidRegionSpecError(f"region expression {sql!r} failed: {exc}") from exc
    finally:
        ctx.deregister_table(name)
    if result.num_rows != n:
        raise InvalidRegionSpecError(
            f"region expression {sql!r} returned {result.num_rows} rows for {n} input rows; "
            "it must be a scalar (row-wise) expression"
        )
    column = result.column(0)
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
