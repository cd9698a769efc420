"""Region specs: how rows are assigned to MemWAL regions (Lance 14: "sharding specs").

A :class:`RegionSpec` is a list of :class:`RegionField` definitions. Each field derives one
*region value* per row from one or more source columns. Rows with equal region-value tuples
belong to the same region. The spec is stored in the MemWAL index as a ``RegionSpec``
protobuf message (Lance 14 calls it ``ShardingSpec``; the field numbers are the same).

Compatibility with Lance 14.0.2
-------------------------------
Lance implements three transforms. This module reproduces them bit-for-bit, including the
protobuf encoding that ``LanceDataset.initialize_mem_wal`` writes:

* ``bucket``: the Spark-style murmur3 x86_32 hash (seed 0) of the value, then
  ``(h & 0x7fffffff) % N``. NULL goes to bucket 0. This is *not* the seed spec's
  ``abs(murmur3(col)) % N``, and int32 and int64 columns hash differently (4 vs 8 bytes).
* ``identity``: the raw value. ``result_type`` is the Arrow type name Lance writes
  (``"int64"``, ``"utf8"``, ``"boolean"``, ...).
* ``unsharded``: no source column, always ``int32 0``.

Lance writes ``field_id = "bucket"`` for all three, so the single-field constructors use that
default too.

The seed spec also has transforms that Lance lacks. They are implemented as the seed spec
defines them:

* ``year``, ``month``, ``day`` and ``hour``: ``date_part(...)`` as int32. ``day`` is the day
  of the month and ``month`` the month of the year, as ``date_part`` defines them. They are
  not Iceberg's "days since epoch".
* ``truncate``, ``multi_bucket``, and free-form DataFusion SQL ``expression`` fields.

Example:
    >>> import pyarrow as pa
    >>> spec = RegionSpec.bucket("id", 8)
    >>> spec.region_values(pa.table({"id": pa.array([1, 2, 3, None], pa.int32())}))["bucket"].to_pylist()
    [2, 7, 1, 0]
"""

from __future__ import annotations

import numbers
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql._proto import memwal_pb2
from memwal_sql.errors import InvalidInputError, InvalidRegionSpecError, SchemaMismatchError
from memwal_sql.partitioning.arrow_types import (
    _BUCKET_TYPES,
    _MULTI_BUCKET_TYPES,
    _bucket_type_ok,
    _date_part_type_ok,
    _identity_type_ok,
    _multi_bucket_type_ok,
    _truncate_type_ok,
    arrow_type_name,
    parse_arrow_type,
)
from memwal_sql.partitioning.murmur3 import (
    MAX_NUM_BUCKETS,
    _check_num_buckets,
    murmur3_bucket,
)
from memwal_sql.partitioning.region_values import decode_region_value, encode_region_value
from memwal_sql.partitioning.transforms import (
    Bucket,
    DatePart,
    Identity,
    MultiBucket,
    SqlExpression,
    Transform,
    Truncate,
    Unsharded,
    _eval_expression,
)

__all__ = [
    "BUCKET",
    "DAY",
    "HOUR",
    "IDENTITY",
    "MAX_NUM_BUCKETS",
    "MONTH",
    "MULTI_BUCKET",
    "TRUNCATE",
    "UNSHARDED",
    "YEAR",
    "RegionField",
    "RegionSpec",
    "arrow_type_name",
    "decode_region_value",
    "encode_region_value",
    "murmur3_bucket",
    "parse_arrow_type",
    "region_id_for",
]

# --------------------------------------------------------------------------------------------
# Transform names and limits
# --------------------------------------------------------------------------------------------

BUCKET = "bucket"
IDENTITY = "identity"
UNSHARDED = "unsharded"
YEAR = "year"
MONTH = "month"
DAY = "day"
HOUR = "hour"
TRUNCATE = "truncate"
MULTI_BUCKET = "multi_bucket"

# MAX_NUM_BUCKETS, Lance's bucket-count limit, lives in murmur3 next to the bucket hash.

_DATE_PARTS = (YEAR, MONTH, DAY, HOUR)
_KNOWN_TRANSFORMS = frozenset({BUCKET, IDENTITY, UNSHARDED, TRUNCATE, MULTI_BUCKET, *_DATE_PARTS})
# Transforms whose region value is an int32: never NULL for bucket and unsharded (Lance
# returns those as `int32 not null`); NULL for the date parts of a NULL date and for a
# multi_bucket whose columns are all NULL. These are the ones that contribute to `num_regions`.
_INT32_TRANSFORMS = frozenset({BUCKET, MULTI_BUCKET, UNSHARDED, *_DATE_PARTS})

# Source columns that Lance cannot resolve from ``source_ids``. This happens when a column was
# dropped from the table. They get a placeholder name that can never match a real column, so
# ``region_values(..., missing_as_null=True)`` reads them as NULL, as the seed spec requires.
# ``to_proto`` turns the placeholder back into the original field id.
_REMOVED_PREFIX = "\x00removed_field:"


# Region ids of spec-governed regions are derived from the region values, so every process that
# routes a key computes the same region (and the writers fence each other instead of splitting a
# key over two regions).
REGION_NAMESPACE = uuid.UUID("6f2e1c7a-3b1d-4d8e-9a55-6d656d77616c")


def region_id_for(spec: RegionSpec, values: Sequence[Any]) -> str:
    """The deterministic region id of the region holding ``values`` under ``spec``.

    Example:
        >>> s = RegionSpec.bucket("id", 4)
        >>> region_id_for(s, (1,)) == region_id_for(s, (1,)) != region_id_for(s, (2,))
        True
    """
    parts = [f"{fid}={v.hex()}" for fid, v in spec.field_entries(tuple(values))]
    return str(uuid.uuid5(REGION_NAMESPACE, f"spec{spec.spec_id}/" + "/".join(parts)))


def _removed_column_name(field_id: int) -> str:
    return f"{_REMOVED_PREFIX}{field_id}"


# Source types each transform accepts, and how to describe them in errors.
_TYPE_CHECKS = {
    BUCKET: (_bucket_type_ok, _BUCKET_TYPES),
    MULTI_BUCKET: (_multi_bucket_type_ok, _MULTI_BUCKET_TYPES),
    IDENTITY: (_identity_type_ok, "an integer, bool, string, binary, date, time or timestamp"),
    TRUNCATE: (_truncate_type_ok, "an integer or string"),
    YEAR: (_date_part_type_ok, "date32, date64 or timestamp"),
    MONTH: (_date_part_type_ok, "date32, date64 or timestamp"),
    DAY: (_date_part_type_ok, "date32, date64 or timestamp"),
    HOUR: (_date_part_type_ok, "date32, date64 or timestamp"),
}


# --------------------------------------------------------------------------------------------
# RegionField / RegionSpec
# --------------------------------------------------------------------------------------------


def _int_param(params: Mapping[str, str], key: str, where: str) -> int:
    raw = params.get(key)
    if raw is None:
        raise InvalidRegionSpecError(f"{where}: missing parameter {key!r}")
    try:
        return int(raw)
    except ValueError as exc:
        raise InvalidRegionSpecError(f"{where}: parameter {key}={raw!r} is not an int") from exc


@dataclass(frozen=True)
class RegionField:
    """One region field: how to derive one region value per row.

    ``source_columns`` are column *names*. The protobuf stores field ids, which
    :meth:`RegionSpec.to_proto` / :meth:`RegionSpec.from_proto` translate. ``parameters`` is
    stored as a sorted tuple of string pairs so the field stays hashable; :attr:`params`
    gives it as a dict. ``result_type`` may be ``None`` for identity/truncate fields until
    the spec is bound to a schema (:meth:`RegionSpec.bind`), because their result type is the
    source column type.

    Example:
        >>> RegionField.bucket("id", 8).params
        {'num_buckets': '8'}
    """

    field_id: str
    source_columns: tuple[str, ...]
    transform: str | None = None
    expression: str | None = None
    result_type: str | None = None
    parameters: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        # Normalise friendly inputs (a list of columns, a dict of parameters) so that
        # equality and hashing work on canonical values.
        if isinstance(self.source_columns, str):
            object.__setattr__(self, "source_columns", (self.source_columns,))
        object.__setattr__(self, "source_columns", tuple(self.source_columns))
        params = self.parameters
        items = params.items() if isinstance(params, Mapping) else params
        object.__setattr__(self, "parameters", tuple(sorted((str(k), str(v)) for k, v in items)))
        self._validate()

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def bucket(cls, column: str, num_buckets: int, *, field_id: str = BUCKET) -> RegionField:
        """Lance bucket field: ``(murmur3(col) & 0x7fffffff) % num_buckets``.

        Example:
            >>> RegionField.bucket("id", 8).result_type
            'int32'
        """
        n = _check_num_buckets(num_buckets, "bucket")
        return cls(field_id, (column,), BUCKET, None, "int32", (("num_buckets", str(n)),))

    @classmethod
    def identity(
        cls, column: str, *, result_type: str | pa.DataType | None = None, field_id: str = BUCKET
    ) -> RegionField:
        """Lance identity field: the raw column value (result type = the source type).

        Example:
            >>> RegionField.identity("tenant", result_type=pa.utf8()).result_type
            'utf8'
        """
        return cls(field_id, (column,), IDENTITY, None, _type_name_or_none(result_type), ())

    @classmethod
    def unsharded(cls, *, field_id: str = BUCKET) -> RegionField:
        """Lance unsharded field: no source column, always int32 0.

        Example:
            >>> RegionField.unsharded().source_columns
            ()
        """
        return cls(field_id, (), UNSHARDED, None, "int32", ())

    @classmethod
    def date_part(cls, part: str, column: str, *, field_id: str | None = None) -> RegionField:
        """Seed year/month/day/hour field: ``date_part(part, col)`` as int32.

        Example:
            >>> RegionField.date_part("year", "ts").transform
            'year'
        """
        if part not in _DATE_PARTS:
            raise InvalidRegionSpecError(f"date part must be one of {_DATE_PARTS}, got {part!r}")
        return cls(field_id or part, (column,), part, None, "int32", ())

    @classmethod
    def truncate(
        cls,
        column: str,
        width: int,
        *,
        result_type: str | pa.DataType | None = None,
        field_id: str = TRUNCATE,
    ) -> RegionField:
        """Seed truncate field: ``left(col, W)`` (strings) or ``col - (col % W)`` (ints, ``%``
        truncating toward zero as in DataFusion).

        Example:
            >>> RegionField.truncate("name", 3).params
            {'width': '3'}
        """
        return cls(
            field_id,
            (column,),
            TRUNCATE,
            None,
            _type_name_or_none(result_type),
            (("width", str(width)),),
        )

    @classmethod
    def multi_bucket(
        cls, columns: Sequence[str], num_buckets: int, *, field_id: str = MULTI_BUCKET
    ) -> RegionField:
        """Seed multi_bucket field over several columns (see :meth:`RegionSpec.multi_bucket`).

        Example:
            >>> RegionField.multi_bucket(["a", "b"], 16).source_columns
            ('a', 'b')
        """
        n = _check_num_buckets(num_buckets, "multi_bucket")
        return cls(
            field_id, tuple(columns), MULTI_BUCKET, None, "int32", (("num_buckets", str(n)),)
        )

    @classmethod
    def sql(
        cls,
        sql: str,
        columns: Sequence[str],
        result_type: str | pa.DataType,
        *,
        field_id: str = "expression",
    ) -> RegionField:
        """A DataFusion SQL expression over ``col0, col1, ...`` (= ``columns`` in order).

        Example:
            >>> RegionField.sql("col0 % 10", ["id"], "int64").expression
            'col0 % 10'
        """
        return cls(field_id, tuple(columns), None, sql, _type_name_or_none(result_type), ())

    # -- accessors ---------------------------------------------------------------------------

    @property
    def transform_impl(self) -> Transform:
        """The transform as an object that applies and projects (see
        :class:`~memwal_sql.partitioning.transforms.Transform`).

        Example:
            >>> RegionField.bucket("id", 8).transform_impl
            Bucket()
        """
        t = self.transform
        if t == BUCKET:
            return Bucket(self.num_buckets or 1)
        if t == MULTI_BUCKET:
            return MultiBucket(self.num_buckets or 1)
        if t == UNSHARDED:
            return Unsharded()
        if t == IDENTITY:
            return Identity(parse_arrow_type(self.result_type) if self.result_type else None)
        if t in _DATE_PARTS:
            return DatePart(t)
        if t == TRUNCATE:
            return Truncate(self.width or 1)
        assert self.expression is not None
        return SqlExpression(self.expression)

    @property
    def params(self) -> dict[str, str]:
        """The parameters as a dict (e.g. ``{"num_buckets": "8"}``)."""
        return dict(self.parameters)

    @property
    def num_buckets(self) -> int | None:
        """``num_buckets`` of a bucket / multi_bucket field, else None."""
        if self.transform in (BUCKET, MULTI_BUCKET):
            return int(self.params["num_buckets"])
        return None

    @property
    def width(self) -> int | None:
        """``width`` of a truncate field, else None."""
        return int(self.params["width"]) if self.transform == TRUNCATE else None

    def describe(self) -> str:
        """Human-readable form, e.g. ``bucket = bucket(id, 8)``.

        Example:
            >>> RegionField.truncate("name", 3).describe()
            'truncate = truncate(name, 3)'
        """
        cols = ", ".join(_display_column(c) for c in self.source_columns)
        if self.transform is None:
            body = f"{self.expression} WITH (col0..) = ({cols}) -> {self.result_type}"
        elif self.transform in (BUCKET, MULTI_BUCKET):
            body = f"{self.transform}({cols}, {self.num_buckets})"
        elif self.transform == TRUNCATE:
            body = f"truncate({cols}, {self.width})"
        else:
            body = f"{self.transform}({cols})"
        return f"{self.field_id} = {body}"

    # -- validation --------------------------------------------------------------------------

    def _validate(self) -> None:
        where = f"region field {self.field_id!r}"
        if not isinstance(self.field_id, str) or not self.field_id:
            raise InvalidRegionSpecError("a region field needs a non-empty string field_id")
        for c in self.source_columns:
            if not isinstance(c, str) or not c:
                raise InvalidRegionSpecError(f"{where}: source columns must be non-empty names")
        if len(set(self.source_columns)) != len(self.source_columns):
            raise InvalidRegionSpecError(f"{where}: a source column is listed twice")
        if (self.transform is None) == (self.expression is None):
            raise InvalidRegionSpecError(f"{where}: specify exactly one of transform / expression")
        if self.result_type is not None:
            parse_arrow_type(self.result_type)  # raises on an unknown name
        params = self.params
        if self.expression is not None:
            if not self.expression.strip():
                raise InvalidRegionSpecError(f"{where}: empty expression")
            if self.result_type is None:
                raise InvalidRegionSpecError(f"{where}: an expression needs a result_type")
            return
        t = self.transform
        if t not in _KNOWN_TRANSFORMS:
            raise InvalidRegionSpecError(
                f"{where}: unknown transform {t!r}; expected one of {sorted(_KNOWN_TRANSFORMS)}"
            )
        nsrc = len(self.source_columns)
        if t == UNSHARDED and nsrc:
            raise InvalidRegionSpecError(f"{where}: unsharded takes no source column")
        if t == MULTI_BUCKET and nsrc < 1:
            raise InvalidRegionSpecError(f"{where}: multi_bucket needs at least one column")
        if t not in (UNSHARDED, MULTI_BUCKET) and nsrc != 1:
            raise InvalidRegionSpecError(f"{where}: {t} takes exactly one source column")
        if t in _INT32_TRANSFORMS and self.result_type != "int32":
            raise InvalidRegionSpecError(f"{where}: {t} has result_type int32")
        if t in (BUCKET, MULTI_BUCKET):
            _check_num_buckets(_int_param(params, "num_buckets", where), where)
        if t == TRUNCATE and _int_param(params, "width", where) < 1:
            raise InvalidRegionSpecError(f"{where}: truncate width must be >= 1")


def _type_name_or_none(t: str | pa.DataType | None) -> str | None:
    if t is None:
        return None
    if isinstance(t, pa.DataType):
        return arrow_type_name(t)
    return arrow_type_name(parse_arrow_type(t))  # canonicalise aliases such as "string"


def _display_column(name: str) -> str:
    if name.startswith(_REMOVED_PREFIX):
        return f"<removed field {name[len(_REMOVED_PREFIX) :]}>"
    return name


@dataclass(frozen=True)
class RegionSpec:
    """A region spec: a ``spec_id`` and the region fields that define a row's region.

    Build one with a single-field constructor (:meth:`bucket`, :meth:`identity`,
    :meth:`unsharded`, :meth:`year`, :meth:`month`, :meth:`day`, :meth:`hour`,
    :meth:`truncate`, :meth:`multi_bucket`, :meth:`expression`), or combine fields with
    :meth:`compose`.

    Example:
        >>> spec = RegionSpec.compose(RegionField.identity("tenant"), RegionField.bucket("id", 4))
        Traceback (most recent call last):
        ...
        memwal_sql.errors.InvalidRegionSpecError: region spec field ids must be unique, got ['bucket', 'bucket']
        >>> spec = RegionSpec.compose(
        ...     RegionField.identity("tenant", field_id="tenant"), RegionField.bucket("id", 4))
        >>> spec.describe()
        'spec 1: tenant = identity(tenant); bucket = bucket(id, 4)'
    """

    fields: tuple[RegionField, ...]
    spec_id: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        if isinstance(self.spec_id, bool) or not isinstance(self.spec_id, (int, np.integer)):
            raise InvalidRegionSpecError(f"spec_id must be an int, got {self.spec_id!r}")
        # spec_id 0 is reserved for manually created regions that follow no spec.
        if not 1 <= int(self.spec_id) <= 0xFFFFFFFF:
            raise InvalidRegionSpecError(f"spec_id must be in [1, 2**32), got {self.spec_id}")
        if not self.fields:
            raise InvalidRegionSpecError("a region spec needs at least one field")
        for f in self.fields:
            if not isinstance(f, RegionField):
                raise InvalidRegionSpecError(f"expected RegionField, got {type(f).__name__}")
        ids = [f.field_id for f in self.fields]
        if len(set(ids)) != len(ids):
            raise InvalidRegionSpecError(f"region spec field ids must be unique, got {ids}")

    # -- constructors ------------------------------------------------------------------------

    @classmethod
    def compose(cls, *fields: RegionField | RegionSpec, spec_id: int = 1) -> RegionSpec:
        """General constructor: a spec from fields (or the fields of other specs), in order.

        Example:
            >>> RegionSpec.compose(RegionField.date_part("year", "ts"),
            ...                    RegionField.bucket("id", 8), spec_id=2).spec_id
            2
        """
        out: list[RegionField] = []
        for f in fields:
            out.extend(f.fields if isinstance(f, RegionSpec) else (f,))
        return cls(tuple(out), spec_id)

    @classmethod
    def bucket(
        cls, column: str, num_buckets: int, *, spec_id: int = 1, field_id: str = BUCKET
    ) -> RegionSpec:
        """Lance bucket spec, bit-exact with Lance 14: NULL -> 0, ``num_buckets`` in [1, 1024].

        Example:
            >>> RegionSpec.bucket("id", 8).num_regions
            8
        """
        return cls((RegionField.bucket(column, num_buckets, field_id=field_id),), spec_id)

    @classmethod
    def identity(
        cls,
        column: str,
        *,
        result_type: str | pa.DataType | None = None,
        spec_id: int = 1,
        field_id: str = BUCKET,
    ) -> RegionSpec:
        """Lance identity spec: the region value is the raw column value.

        ``result_type`` defaults to the column type; :meth:`bind` fills it in.

        Example:
            >>> RegionSpec.identity("tenant").bind(pa.schema([("tenant", pa.utf8())])).result_types()
            [DataType(string)]
        """
        field_ = RegionField.identity(column, result_type=result_type, field_id=field_id)
        return cls((field_,), spec_id)

    @classmethod
    def unsharded(cls, *, spec_id: int = 1, field_id: str = BUCKET) -> RegionSpec:
        """Lance unsharded spec: every row goes to one region (value int32 0).

        Example:
            >>> RegionSpec.unsharded().num_regions
            1
        """
        return cls((RegionField.unsharded(field_id=field_id),), spec_id)

    @classmethod
    def year(cls, column: str, *, spec_id: int = 1, field_id: str = YEAR) -> RegionSpec:
        """Seed ``year`` spec: ``date_part('year', col)`` as int32 (date32/date64/timestamp).

        Example:
            >>> RegionSpec.year("d").region_values(pa.table({"d": pa.array([0], pa.date32())}))["year"].to_pylist()
            [1970]
        """
        return cls((RegionField.date_part(YEAR, column, field_id=field_id),), spec_id)

    @classmethod
    def month(cls, column: str, *, spec_id: int = 1, field_id: str = MONTH) -> RegionSpec:
        """Seed ``month`` spec: ``date_part('month', col)`` (1..12) as int32.

        Example:
            >>> RegionSpec.month("d").region_values(pa.table({"d": pa.array([40], pa.date32())}))["month"].to_pylist()
            [2]
        """
        return cls((RegionField.date_part(MONTH, column, field_id=field_id),), spec_id)

    @classmethod
    def day(cls, column: str, *, spec_id: int = 1, field_id: str = DAY) -> RegionSpec:
        """Seed ``day`` spec: ``date_part('day', col)``, the day of the month (1..31), int32.

        Example:
            >>> RegionSpec.day("d").region_values(pa.table({"d": pa.array([40], pa.date32())}))["day"].to_pylist()
            [10]
        """
        return cls((RegionField.date_part(DAY, column, field_id=field_id),), spec_id)

    @classmethod
    def hour(cls, column: str, *, spec_id: int = 1, field_id: str = HOUR) -> RegionSpec:
        """Seed ``hour`` spec: ``date_part('hour', col)`` (0..23; 0 for dates) as int32.

        For tz-aware timestamps this is the local hour in the column's time zone. All four
        date parts are computed by DataFusion's ``date_part`` (see ``_date_part``).

        Example:
            >>> t = pa.table({"ts": pa.array([7_200], pa.timestamp("s"))})
            >>> RegionSpec.hour("ts").region_values(t)["hour"].to_pylist()
            [2]
        """
        return cls((RegionField.date_part(HOUR, column, field_id=field_id),), spec_id)

    @classmethod
    def truncate(
        cls,
        column: str,
        width: int,
        *,
        result_type: str | pa.DataType | None = None,
        spec_id: int = 1,
        field_id: str = TRUNCATE,
    ) -> RegionSpec:
        """Seed ``truncate`` spec. Strings: ``left(col, W)`` (W code points). Integers:
        ``col - (col % W)`` with DataFusion's truncating ``%``, so -7 -> -5 for W=5 (the
        value moves toward zero). The result has the source type.

        Example:
            >>> t = pa.table({"x": pa.array([-7, 7, None])})
            >>> RegionSpec.truncate("x", 5).region_values(t)["truncate"].to_pylist()
            [-5, 5, None]
        """
        field_ = RegionField.truncate(column, width, result_type=result_type, field_id=field_id)
        return cls((field_,), spec_id)

    @classmethod
    def multi_bucket(
        cls,
        columns: Sequence[str],
        num_buckets: int,
        *,
        spec_id: int = 1,
        field_id: str = MULTI_BUCKET,
    ) -> RegionSpec:
        """Seed ``multi_bucket`` spec: a murmur3 hash across several columns, bucketed.

        The combination is Spark's ``hash(a, b, ...)`` with seed 0, the same chain Lance's
        hash functions use through their seed argument::

            h = 0
            for col in columns:                 # in the given order
                if col is not NULL:             # a NULL column leaves h unchanged (ignored)
                    h = murmur3(normalise(col), seed=h)
            region = abs(h as a signed int32) % num_buckets   # the seed spec's formula

        If every column is NULL the region value is NULL (the seed's ``murmur3_multi`` is NULL
        only then); ``abs`` is taken in 64 bits, so ``i32::MIN`` gives ``2^31 % N``. Lance 14
        has no multi_bucket, so the seed spec is the authority. To resist type promotion, values are normalised before hashing (see
        ``_hash_multi``):

        * all integer widths, signed or unsigned, and bool hash as int64;
        * floats with an integral value hash as that integer;
        * date32 and date64 hash as days;
        * timestamps and times hash as nanoseconds in any unit.

        So ``int32 5``, ``int64 5`` and ``5.0`` share a region.

        Example:
            >>> t = pa.table({"a": pa.array([5], pa.int32()), "b": pa.array([5.0])})
            >>> s = RegionSpec.multi_bucket(["a"], 16)
            >>> s.region_values(t)["multi_bucket"].to_pylist() == RegionSpec.multi_bucket(["b"], 16).region_values(t)["multi_bucket"].to_pylist()
            True
        """
        return cls((RegionField.multi_bucket(columns, num_buckets, field_id=field_id),), spec_id)

    @classmethod
    def expression(
        cls,
        sql: str,
        columns: Sequence[str],
        result_type: str | pa.DataType,
        *,
        spec_id: int = 1,
        field_id: str = "expression",
    ) -> RegionSpec:
        """A DataFusion SQL expression spec over ``col0, col1, ...`` (the ``columns`` in order).

        It is evaluated per batch in a reused DataFusion ``SessionContext``, and the result is
        cast to ``result_type``. The expression must be deterministic and stateless; that is
        not checked.

        Example:
            >>> t = pa.table({"id": pa.array([12, 27])})
            >>> RegionSpec.expression("col0 / 10", ["id"], "int64").region_values(t)["expression"].to_pylist()
            [1, 2]
        """
        return cls((RegionField.sql(sql, columns, result_type, field_id=field_id),), spec_id)

    # -- properties --------------------------------------------------------------------------

    @property
    def source_columns(self) -> tuple[str, ...]:
        """Every source column of every field, in first-use order, without repeats.

        Example:
            >>> RegionSpec.multi_bucket(["a", "b"], 4).source_columns
            ('a', 'b')
        """
        return tuple(dict.fromkeys(c for f in self.fields for c in f.source_columns))

    def routes_by_key(self, primary_key: Sequence[str]) -> bool:
        """Whether the spec reads only ``primary_key`` columns, so each key has one region
        for good (Paimon's rule: partition columns are part of the primary key).

        Example:
            >>> RegionSpec.bucket("id", 4).routes_by_key(["id"])
            True
            >>> RegionSpec.day("ts").routes_by_key(["id"])
            False
        """
        return set(self.source_columns) <= set(primary_key)

    @property
    def num_regions(self) -> int:
        """What Lance writes in ``num_shards``: N for bucket-N, 1 for unsharded, 0 otherwise.

        For multi-field specs made only of bucket/multi_bucket/unsharded fields, this is the
        product of their counts (the number of possible region tuples). Any field with an
        open value domain makes it 0.

        Example:
            >>> RegionSpec.identity("t").num_regions, RegionSpec.bucket("id", 7).num_regions
            (0, 7)
        """
        total = 1
        for f in self.fields:
            if f.transform in (BUCKET, MULTI_BUCKET):
                total *= f.num_buckets or 0
            elif f.transform != UNSHARDED:
                return 0
        return total

    def describe(self) -> str:
        """One-line description of the spec.

        Example:
            >>> RegionSpec.bucket("id", 8).describe()
            'spec 1: bucket = bucket(id, 8)'
        """
        return f"spec {self.spec_id}: " + "; ".join(f.describe() for f in self.fields)

    # -- schema binding ----------------------------------------------------------------------

    def bind(self, schema: pa.Schema) -> RegionSpec:
        """Check the spec against a table schema and fill in the source-typed result types.

        Raises :class:`InvalidRegionSpecError` if a source column is missing or has a type
        the transform cannot handle. Identity and truncate fields without a result type get
        the source column's type. Expression fields are planned once on an empty batch, so
        SQL errors surface here and not at the first write.

        Example:
            >>> RegionSpec.truncate("x", 10).bind(pa.schema([("x", pa.int16())])).fields[0].result_type
            'int16'
        """
        fields: list[RegionField] = []
        for f in self.fields:
            types: list[pa.DataType] = []
            for c in f.source_columns:
                idx = schema.get_field_index(c)
                if idx < 0:
                    raise InvalidRegionSpecError(
                        f"region field {f.field_id!r}: source column {_display_column(c)!r} "
                        f"is not in the table schema (columns: {schema.names})"
                    )
                t = schema.field(idx).type
                types.append(t.value_type if pa.types.is_dictionary(t) else t)
            _check_types(f, types)
            if f.result_type is None:
                f = replace(f, result_type=arrow_type_name(types[0]))
            if f.expression is not None:
                empty = [pa.array([], type=t) for t in types]
                _cast_result(_eval_expression(f.expression, empty, 0), f, InvalidRegionSpecError)
            fields.append(f)
        return RegionSpec(tuple(fields), self.spec_id)

    def result_types(self, schema: pa.Schema | None = None) -> list[pa.DataType]:
        """The Arrow type of each field's region value, in field order.

        Identity/truncate fields without a result type need ``schema`` to resolve it.

        Example:
            >>> RegionSpec.bucket("id", 4).result_types()
            [DataType(int32)]
        """
        spec = self.bind(schema) if schema is not None else self
        out = []
        for f in spec.fields:
            if f.result_type is None:
                raise InvalidRegionSpecError(
                    f"region field {f.field_id!r}: result type unknown; call bind(schema) first"
                )
            out.append(parse_arrow_type(f.result_type))
        return out

    def field_entries(self, values: Sequence[Any]) -> list[tuple[str, bytes]]:
        """``(field_id, encoded value)`` pairs a region manifest records for ``values``.

        NULL values have no encoding and are left out (as Lance leaves out absent entries).

        Example:
            >>> RegionSpec.bucket("id", 4).field_entries((3,))
            [('bucket', b'\\x03\\x00\\x00\\x00')]
        """
        if len(values) != len(self.fields):
            raise InvalidRegionSpecError(
                f"{self.describe()} has {len(self.fields)} field(s), got values {tuple(values)}"
            )
        for f, v in zip(self.fields, values):
            n = f.num_buckets if f.transform != UNSHARDED else 1
            if v is None and f.transform == MULTI_BUCKET:
                continue  # every source column NULL
            if n is not None and not (isinstance(v, numbers.Integral) and 0 <= int(v) < n):
                raise InvalidInputError(
                    f"no row has the region value {v!r} under {f.describe()}: its values are "
                    f"0 to {n - 1}"
                )
        return [
            (f.field_id, encode_region_value(v, t))
            for f, v, t in zip(self.fields, values, self.result_types())
            if v is not None
        ]

    def values_from_entries(
        self, entries: Sequence[tuple[str, bytes]], *, missing_as_null: bool = False
    ) -> tuple[Any, ...] | None:
        """Invert :meth:`field_entries`; None when the entries do not name every field
        (a manual region, or a NULL region value), or, with ``missing_as_null``, a field
        that is not named is NULL (the caller checks the region id to tell a manual region).

        Example:
            >>> s = RegionSpec.bucket("id", 4)
            >>> s.values_from_entries(s.field_entries((3,)))
            (3,)
        """
        by_id = dict(entries)
        ids = {f.field_id for f in self.fields}
        if (
            not set(by_id) <= ids
            or len(ids) != len(self.fields)
            or (set(by_id) != ids and not missing_as_null)
        ):
            return None
        if any(f.field_id not in by_id and f.transform in (BUCKET, UNSHARDED) for f in self.fields):
            return None  # never NULL: a region without that value is not the spec's
        return tuple(
            decode_region_value(by_id[f.field_id], t) if f.field_id in by_id else None
            for f, t in zip(self.fields, self.result_types())
        )

    # -- evaluation --------------------------------------------------------------------------

    def region_values(
        self, data: pa.Table | pa.RecordBatch, *, missing_as_null: bool = False
    ) -> pa.Table:
        """Region values of every row: one column per field (named by field_id), row-aligned.

        bucket, multi_bucket, unsharded and the date parts are int32; bucket-like and
        unsharded columns are never null. A missing source column raises
        :class:`SchemaMismatchError`. With ``missing_as_null=True`` (for readers after a
        column was dropped), it is read as all-NULL instead, as the seed spec requires.
        Identity/truncate/expression results are cast to the field's ``result_type`` when it
        is set. This keeps the region values stable when a column is promoted (int32 ->
        int64).

        Example:
            >>> t = pa.table({"s": ["a", "b", None]})
            >>> RegionSpec.bucket("s", 8).region_values(t).to_pydict()
            {'bucket': [1, 5, 0]}
        """
        if isinstance(data, pa.RecordBatch):
            batches = [data]
            schema = data.schema
        elif isinstance(data, pa.Table):
            batches = data.to_batches()
            schema = data.schema
            if not batches:
                batches = [
                    pa.RecordBatch.from_arrays(
                        [pa.array([], type=f.type) for f in schema], schema=schema
                    )
                ]
        else:
            raise TypeError(f"expected a pyarrow Table or RecordBatch, got {type(data).__name__}")
        out_schema = self._output_schema(schema, missing_as_null)
        out = [self._evaluate_batch(b, out_schema, missing_as_null) for b in batches]
        return pa.Table.from_batches(out, schema=out_schema)

    def group_rows(
        self, data: pa.Table | pa.RecordBatch, *, missing_as_null: bool = False
    ) -> dict[tuple, np.ndarray]:
        """Map each distinct region-value tuple to the (ascending) row indices that hold it.

        Keys are tuples of Python values, one per field, as in :meth:`region_values`.
        Groups appear in order of first occurrence. A router can split a batch with
        ``data.take(indices)``. Vectorised: dictionary-encode each region column, combine the
        codes, and do one stable argsort (radix sort for < 65536 groups).

        Example:
            >>> t = pa.table({"id": pa.array([1, 2, 1, 3], pa.int32())})
            >>> {k: v.tolist() for k, v in RegionSpec.bucket("id", 8).group_rows(t).items()}
            {(2,): [0, 2], (7,): [1], (1,): [3]}
        """
        values = self.region_values(data, missing_as_null=missing_as_null)
        n = values.num_rows
        if n == 0:
            return {}
        codes: np.ndarray | None = None
        for column in values.columns:
            encoded = pc.dictionary_encode(column.combine_chunks(), null_encoding="encode")
            c = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            if codes is None:
                codes = c
            else:
                # Re-compress after every column so the combined code stays < n and never
                # overflows, whatever the per-column cardinalities.
                _, codes = np.unique(codes * len(encoded.dictionary) + c, return_inverse=True)
                codes = codes.astype(np.int64).reshape(-1)
        assert codes is not None
        if int(codes.max()) < 65536:
            codes = codes.astype(np.uint16)  # numpy's stable sort is a radix sort here
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        bounds = np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1
        groups = np.split(order, bounds)
        groups.sort(key=lambda g: int(g[0]))  # first occurrence; stable sort -> g[0] is min
        firsts = pa.array([int(g[0]) for g in groups], pa.int64())
        key_columns = [col.take(firsts).to_pylist() for col in values.columns]
        return {tuple(k): g for k, g in zip(zip(*key_columns), groups)}

    def _output_schema(self, schema: pa.Schema, missing_as_null: bool) -> pa.Schema:
        out = []
        for f in self.fields:
            if f.transform in _INT32_TRANSFORMS:
                # Lance returns bucket/unsharded columns as `int32 not null`. The date parts
                # are int32 but keep NULLs.
                out.append(
                    pa.field(
                        f.field_id, pa.int32(), nullable=f.transform in (*_DATE_PARTS, MULTI_BUCKET)
                    )
                )
                continue
            if f.result_type is not None:
                t = parse_arrow_type(f.result_type)
            else:  # identity / truncate not bound: the data's own column type
                idx = schema.get_field_index(f.source_columns[0])
                if idx < 0:
                    if not missing_as_null:
                        raise _missing(f, f.source_columns[0], schema)
                    t = pa.null()
                else:
                    t = schema.field(idx).type
                    if pa.types.is_dictionary(t):
                        t = t.value_type
            out.append(pa.field(f.field_id, t, nullable=True))
        return pa.schema(out)

    def _evaluate_batch(
        self, batch: pa.RecordBatch, out_schema: pa.Schema, missing_as_null: bool
    ) -> pa.RecordBatch:
        n = batch.num_rows
        arrays = []
        for f, out_field in zip(self.fields, out_schema):
            sources = [_source(batch, f, c, missing_as_null) for c in f.source_columns]
            arr = _evaluate_field(f, sources, n)
            if arr.type != out_field.type:
                arr = _cast_result(
                    arr,
                    replace(f, result_type=arrow_type_name(out_field.type)),
                    SchemaMismatchError,
                )
            arrays.append(arr)
        return pa.RecordBatch.from_arrays(arrays, schema=out_schema)

    # -- protobuf ----------------------------------------------------------------------------

    def to_proto(self, field_ids: Mapping[str, int]) -> memwal_pb2.RegionSpec:
        """Encode as the ``RegionSpec`` protobuf (Lance ``ShardingSpec``), names -> field ids.

        bucket/identity/unsharded encode byte-for-byte as Lance 14's ``initialize_mem_wal``:
        ``transform`` is set, ``expression`` is absent, and ``parameters`` is
        ``{"num_buckets": "N"}`` for bucket. Seed transforms use the seed names
        (``"year"``, ``{"width": W}``, ...). Expression fields set ``expression`` and leave
        ``transform`` absent.

        Example:
            >>> RegionSpec.bucket("id", 8).to_proto({"id": 0}).fields[0].parameters["num_buckets"]
            '8'
        """
        msg = memwal_pb2.RegionSpec(spec_id=self.spec_id)
        for f in self.fields:
            if f.result_type is None:
                raise InvalidRegionSpecError(
                    f"region field {f.field_id!r} has no result_type; call bind(schema) first"
                )
            source_ids = []
            for c in f.source_columns:
                if c.startswith(_REMOVED_PREFIX):
                    source_ids.append(int(c[len(_REMOVED_PREFIX) :]))
                elif c in field_ids:
                    source_ids.append(int(field_ids[c]))
                else:
                    raise InvalidRegionSpecError(
                        f"region field {f.field_id!r}: no field id for source column {c!r}"
                    )
            pf = msg.fields.add(
                field_id=f.field_id, source_ids=source_ids, result_type=f.result_type
            )
            if f.transform is not None:
                pf.transform = f.transform
            if f.expression is not None:
                pf.expression = f.expression
            for k, v in f.parameters:
                pf.parameters[k] = v
        return msg

    @classmethod
    def from_proto(cls, msg: memwal_pb2.RegionSpec, field_names: Mapping[int, str]) -> RegionSpec:
        """Decode a ``RegionSpec`` protobuf, mapping source field ids to column names.

        A source id missing from ``field_names`` (the column was dropped) becomes a
        placeholder column that :meth:`region_values` reads as NULL with
        ``missing_as_null=True``. :meth:`to_proto` turns it back into the same id.

        Example:
            >>> s = RegionSpec.bucket("id", 8)
            >>> RegionSpec.from_proto(s.to_proto({"id": 3}), {3: "id"}) == s
            True
        """
        fields = []
        for pf in msg.fields:
            columns = tuple(
                field_names[i] if i in field_names else _removed_column_name(i)
                for i in pf.source_ids
            )
            fields.append(
                RegionField(
                    field_id=pf.field_id,
                    source_columns=columns,
                    transform=pf.transform if pf.HasField("transform") else None,
                    expression=pf.expression if pf.HasField("expression") else None,
                    result_type=pf.result_type or None,
                    parameters=tuple(pf.parameters.items()),
                )
            )
        return cls(tuple(fields), msg.spec_id)


# --------------------------------------------------------------------------------------------
# Evaluation helpers
# --------------------------------------------------------------------------------------------


def _missing(f: RegionField, column: str, schema: pa.Schema) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"region field {f.field_id!r} needs column {_display_column(column)!r}, which the data "
        f"lacks (columns: {schema.names})"
    )


def _source(batch: pa.RecordBatch, f: RegionField, column: str, missing_as_null: bool) -> pa.Array:
    idx = batch.schema.get_field_index(column)
    if idx >= 0:
        return batch.column(idx)
    if column in batch.schema.names:
        raise SchemaMismatchError(f"column {column!r} appears more than once in the data")
    if missing_as_null:
        return pa.nulls(batch.num_rows)
    raise _missing(f, column, batch.schema)


def _check_types(f: RegionField, types: Sequence[pa.DataType]) -> None:
    """Raise InvalidRegionSpecError if a source type does not suit the field's transform."""
    check = _TYPE_CHECKS.get(f.transform or "")
    if check is None:  # unsharded has no source; expressions are checked by DataFusion
        return
    ok, expected = check
    for c, t in zip(f.source_columns, types):
        if pa.types.is_dictionary(t):
            t = t.value_type
        # A NULL-typed column is what missing_as_null reads for a dropped column: every
        # transform maps it to NULL (or region 0).
        if not (pa.types.is_null(t) or ok(t)):
            raise InvalidRegionSpecError(
                f"region field {f.field_id!r}: {f.transform} cannot use column "
                f"{_display_column(c)!r} of type {t}; expected {expected}"
            )


def _evaluate_field(f: RegionField, sources: Sequence[pa.Array], n: int) -> pa.Array:
    # Check the data's actual types: they may differ from the schema the spec was bound to.
    _check_types(f, [a.type for a in sources])
    out = f.transform_impl.apply(sources, n)
    if f.expression is not None:
        return _cast_result(out, f, InvalidRegionSpecError)
    return out


def _cast_result(arr: pa.Array, f: RegionField, error: type[Exception]) -> pa.Array:
    if f.result_type is None:
        return arr
    target = parse_arrow_type(f.result_type)
    if arr.type == target:
        return arr
    try:
        return arr.cast(target)  # safe cast: overflow / lossy conversions raise
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise error(
            f"region field {f.field_id!r}: values of type {arr.type} cannot be cast to "
            f"result_type {f.result_type}: {exc}"
        ) from exc
