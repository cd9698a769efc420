"""The seed spec's other transforms: date parts, truncate, and DataFusion SQL expressions.

Date parts run in numpy (:mod:`memwal_sql.partitioning.date_parts`), except for time zones with
daylight saving time; those and SQL expressions run in DataFusion, through one
``SessionContext`` per thread, and so never inside a DataFusion callback (see
:meth:`Transform.evaluable_in_callbacks`).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.errors import InvalidRegionSpecError, MemWalError
from memwal_sql.expressions.predicate import Compare, InList, IsNull, Not, Or, Predicate
from memwal_sql.partitioning import date_parts
from memwal_sql.partitioning.arrow_types import _is_int, _is_string
from memwal_sql.partitioning.murmur3 import (
    _decode_dictionary,
    _hash_lance,
    _hash_multi,
    _primitive,
    _to_bucket,
    _valid_mask,
)

# --------------------------------------------------------------------------------------------
# Other transforms
# --------------------------------------------------------------------------------------------


def _date_part(arr: pa.Array, part: str) -> pa.Array:
    """`date_part(part, col)` as int32, for date32/date64/timestamp columns.

    DataFusion's own ``date_part`` *is* the seed spec's definition of these transforms.
    :mod:`memwal_sql.partitioning.date_parts` reproduces it bit for bit without DataFusion (readers
    evaluate transforms inside DataFusion callbacks); only zones with daylight saving time
    still go through DataFusion. pyarrow's ``pc.year`` is not equivalent: it wraps for
    |year| > 32767, and its time zone database disagrees with chrono-tz after 2037.
    """
    arr = _decode_dictionary(arr)
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.int32())
    if date_parts.supports(arr.type):
        return date_parts.date_part(arr, part)
    out = _eval_expression(f"date_part('{part}', col0)", [arr], len(arr))
    return out if out.type == pa.int32() else out.cast(pa.int32())


def _truncate(arr: pa.Array, width: int) -> pa.Array:
    """Seed `truncate`, exactly as the spec writes it in DataFusion SQL: `left(col, W)` for
    strings, `col - (col % W)` for integers, where `%` truncates toward zero (DataFusion's
    and Rust's remainder): -7 truncated to width 5 is -5, 7 is 5. NULL stays NULL. The result
    lies between 0 and the value, so it always fits the source type.
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
        out = v - v % np.uint64(width)
    else:
        v = _primitive(arr, np_type).astype(np.int64)
        # A width beyond int64 leaves every value's remainder equal to the value itself.
        out = (
            v - np.fmod(v, np.int64(width)) if width <= np.iinfo(np.int64).max else np.zeros_like(v)
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
    batch = (
        pa.record_batch({f"col{i}": a for i, a in enumerate(arrays)})
        if arrays
        else (pa.record_batch({"__row": pa.nulls(n)}))
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


# --------------------------------------------------------------------------------------------
# Transforms as classes: apply, result type, and projection of predicates onto region values
# --------------------------------------------------------------------------------------------


class Transform:
    """A region-spec transform: derives a region value from source columns (``apply``) and
    turns a predicate on its source column into one on the region value (``project``), so
    regions can be pruned by evaluating the projection against each region's value.

    A projection is *inclusive* (pyiceberg's word): every row that satisfies the predicate has
    a region value that satisfies the projection; None means "no information". Predicates
    come in negation normal form (:func:`memwal_sql.expressions.predicate.negation_normal_form`).

    Example:
        >>> import pyarrow as pa
        >>> from memwal_sql.expressions.predicate import InList
        >>> Bucket(8).project("b", InList("id", pa.array([1, 2, 3])))
        InList(column='b', values=[4, 3], has_null=False)
    """

    name = "transform"
    #: rows ordered by source value have ordered region values (ranges project)
    monotone = False
    #: a non-NULL source value never gives a NULL region value
    keeps_non_null = False

    def apply(self, sources: Sequence[pa.Array], n: int) -> pa.Array:
        """The region value of each row, vectorised."""
        raise NotImplementedError

    def evaluable_in_callbacks(self, source_types: Sequence[pa.DataType]) -> bool:
        """True if :meth:`apply` never calls DataFusion for these types, so a reader may
        evaluate it while DataFusion plans or executes a query."""
        return True

    def project(self, field_id: str, atom: Predicate) -> Predicate | None:
        """A predicate on column ``field_id`` (the region value) implied by ``atom`` (a
        predicate on this transform's one source column), or None."""
        if isinstance(atom, Compare):
            if atom.op == "=":
                return self._project_values(field_id, pa.array([atom.value]))
            if self.monotone and atom.op != "!=":
                mapped = self._map(pa.array([atom.value]))
                if mapped is None or not mapped[0].is_valid:
                    return None
                return Compare(field_id, "<=" if atom.op in ("<", "<=") else ">=", mapped[0])
            return None
        if isinstance(atom, InList):
            return self._project_values(field_id, atom.values)
        if isinstance(atom, IsNull):
            return self._project_null(field_id)
        if isinstance(atom, Not) and isinstance(atom.child, IsNull) and self.keeps_non_null:
            return Not(IsNull(field_id))
        return None

    def _map(self, values: pa.Array) -> pa.Array | None:
        try:
            return self.apply([values], len(values))
        except (MemWalError, pa.ArrowException, ValueError, OverflowError):
            return None  # a literal the transform cannot take: no pruning on it

    def _project_values(self, field_id: str, values: pa.Array) -> Predicate | None:
        mapped = self._map(values)
        if mapped is None:
            return None
        present = pc.unique(mapped.drop_null())
        in_list = InList(field_id, present)
        return Or((in_list, IsNull(field_id))) if mapped.null_count else in_list

    def _project_null(self, field_id: str) -> Predicate | None:
        return IsNull(field_id)  # NULL source values give NULL region values

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Identity(Transform):
    """The value itself: every predicate projects exactly."""

    name = "identity"
    monotone = True
    keeps_non_null = True

    def __init__(self, result_type: pa.DataType | None = None) -> None:
        self.result_type = result_type

    def apply(self, sources: Sequence[pa.Array], n: int) -> pa.Array:
        return _decode_dictionary(sources[0])

    def project(self, field_id: str, atom: Predicate) -> Predicate | None:
        inner = atom.child if isinstance(atom, Not) else atom
        if isinstance(inner, IsNull):
            moved: Predicate = IsNull(field_id)
        elif isinstance(inner, Compare):
            value = self._cast(pa.array([inner.value]))
            if value is None:
                return None
            moved = Compare(field_id, inner.op, value[0])
        elif isinstance(inner, InList):
            values = self._cast(inner.values)
            if values is None:
                return None
            moved = InList(field_id, values, inner.has_null)
        else:
            return None
        return Not(moved) if isinstance(atom, Not) else moved

    def _cast(self, values: pa.Array) -> pa.Array | None:
        if self.result_type is None or values.type == self.result_type:
            return values
        try:
            return values.cast(self.result_type)  # safe: a value that does not fit raises
        except (pa.ArrowException, ValueError):
            return None


class Bucket(Transform):
    """Lance's bucket: ``(murmur3(col) & 0x7fffffff) % N``; NULL goes to bucket 0."""

    name = "bucket"

    def __init__(self, num_buckets: int) -> None:
        self.num_buckets = num_buckets

    def apply(self, sources: Sequence[pa.Array], n: int) -> pa.Array:
        h = _hash_lance(sources[0], np.zeros(n, np.uint32))
        return pa.array(_to_bucket(h, self.num_buckets), pa.int32())

    def _project_null(self, field_id: str) -> Predicate | None:
        return Compare(field_id, "=", pa.scalar(0, pa.int32()))


class MultiBucket(Transform):
    """The seed's ``abs(murmur3_multi(col0, col1, ...)) % N``: NULL columns are skipped in
    the hash, and the value is NULL only when every column is NULL. ``abs`` is taken in 64
    bits, so a hash of ``i32::MIN`` gives ``2^31 % N`` (in 32 bits it has no absolute value).
    """

    name = "multi_bucket"
    keeps_non_null = True

    def __init__(self, num_buckets: int) -> None:
        self.num_buckets = num_buckets

    def apply(self, sources: Sequence[pa.Array], n: int) -> pa.Array:
        h = np.zeros(n, np.uint32)
        any_valid = np.zeros(n, dtype=bool)
        for a in sources:  # Spark's hash(a, b, ...): each column's hash seeds the next
            h = _hash_multi(a, h)
            valid = _valid_mask(_decode_dictionary(a))
            any_valid |= True if valid is None else valid
        signed = h.astype(np.uint32).view(np.int32).astype(np.int64)
        bucket = (np.abs(signed) % self.num_buckets).astype(np.int32)
        return pa.array(bucket, pa.int32(), mask=~any_valid)


class DatePart(Transform):
    """``date_part(part, col)`` as int32 (``year`` is monotone; a date out of chrono's range
    gives NULL)."""

    def __init__(self, part: str) -> None:
        self.name = part
        self.monotone = part == "year"

    def apply(self, sources: Sequence[pa.Array], n: int) -> pa.Array:
        return _date_part(sources[0], self.name)

    def evaluable_in_callbacks(self, source_types: Sequence[pa.DataType]) -> bool:
        return all(pa.types.is_null(t) or date_parts.supports(t) for t in source_types)

    def _map(self, values: pa.Array) -> pa.Array | None:
        if not self.evaluable_in_callbacks([values.type]):
            return None
        return super()._map(values)

    def __repr__(self) -> str:
        return f"DatePart({self.name!r})"


class Truncate(Transform):
    """The seed's ``left(col, W)`` / ``col - (col % W)``: monotone, NULL only for NULL."""

    name = "truncate"
    monotone = True
    keeps_non_null = True

    def __init__(self, width: int) -> None:
        self.width = width

    def apply(self, sources: Sequence[pa.Array], n: int) -> pa.Array:
        return _truncate(sources[0], self.width)


class Unsharded(Transform):
    """Every row in region 0: nothing to project."""

    name = "unsharded"

    def apply(self, sources: Sequence[pa.Array], n: int) -> pa.Array:
        return pa.array(np.zeros(n, np.int32), pa.int32())

    def project(self, field_id: str, atom: Predicate) -> Predicate | None:
        return None


class SqlExpression(Transform):
    """A DataFusion SQL expression over ``col0, col1, ...``: evaluated by DataFusion, so
    never inside a query (no pruning, no lookup routing)."""

    name = "expression"

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def apply(self, sources: Sequence[pa.Array], n: int) -> pa.Array:
        return _eval_expression(self.sql, sources, n)

    def evaluable_in_callbacks(self, source_types: Sequence[pa.DataType]) -> bool:
        return False

    def project(self, field_id: str, atom: Predicate) -> Predicate | None:
        return None

    def __repr__(self) -> str:
        return f"SqlExpression({self.sql!r})"
