"""Turn what a user hands a writer into WAL-schema Arrow tables, or a typed error.

Validation is all-or-nothing per call: a bad batch raises before anything reaches the MemTable or
the WAL, so nothing already written can be affected. Upserts replace whole rows, so every column
of the table must be present (partial updates are a different merge engine); extra columns are
refused rather than dropped silently.

Example:
    >>> import pyarrow as pa
    >>> rows = RowCoercer(pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())]), ["id"])
    >>> rows.upserts({"id": [1], "v": ["a"]}).column("_tombstone").to_pylist()
    [False]

Both ``upserts`` and ``deletes`` return one record batch: the unit the MemTable holds and a WAL
entry serializes. Input already in the table's exact column order and types (the common case of a
stream of same-shaped batches) takes a fast path that only checks nulls and vectors.

Vectors (every fixed-size list of floats) must be usable by a vector index and search: finite,
no missing element, and a squared norm of at most a quarter of the largest float
(:func:`unusable_vectors`). A NULL vector is fine: it never matches a vector search.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.errors import InvalidInputError, PrimaryKeyError, SchemaMismatchError
from memwal_sql.formats.wal import TOMBSTONE, wal_schema

if TYPE_CHECKING:
    import pandas
    import polars
    import pyspark.sql

    from memwal_sql.partitioning.region_spec import RegionSpec


class ArrowStreamExportable(Protocol):
    """Data that exports an Arrow stream (the Arrow PyCapsule interface): pandas 2.2+ and
    polars DataFrames, DuckDB and DataFusion results, and the like."""

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...


#: One column's values, in a dict of columns.
ColumnValues: TypeAlias = "pa.Array | pa.ChunkedArray | np.ndarray | Sequence[object]"
#: What a write takes (an upsert, a table's initial data): Arrow data, a dict of columns, or a
#: pandas or Spark DataFrame (or anything else that exports an Arrow stream).
WriteData: TypeAlias = (
    "pa.Table | pa.RecordBatch | pa.RecordBatchReader | Mapping[str, ColumnValues]"
    " | Sequence[Mapping[str, object]] | ArrowStreamExportable | pandas.DataFrame"
    " | polars.DataFrame | pyspark.sql.DataFrame"
)
#: Primary keys to delete or look up: a table holding the key columns or, for a one-column key,
#: its values (an Arrow array, a list, a numpy array or a pandas Series) or one value; a
#: composite key as a tuple of its values, or a list of such tuples.
Keys: TypeAlias = (
    "WriteData | pa.Array | pa.ChunkedArray | np.ndarray | pandas.Series | Sequence[object]"
    " | str | bytes | int | float | tuple[object, ...]"
)
# One key value, as a lookup or delete takes it for a one-column key.
_SCALARS = (
    str,
    bytes,
    int,
    float,
    decimal.Decimal,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    np.generic,
    pa.Scalar,
)

#: What a WAL entry holds: rows to insert or replace, or tombstones of deleted keys.
WriteKind: TypeAlias = Literal["upserts", "deletes"]


def to_arrow_table(data: WriteData) -> pa.Table:
    """Accept a pa.Table, RecordBatch, RecordBatchReader, pandas, polars or Spark DataFrame,
    anything that exports an Arrow stream, a dict of columns or a list of row dicts.

    Example:
        >>> to_arrow_table([{"id": 1, "v": "a"}, {"id": 2}]).to_pydict()
        {'id': [1, 2], 'v': ['a', None]}
    """
    try:
        table = _convert(data)
    except InvalidInputError:
        raise
    except OverflowError as e:
        raise SchemaMismatchError(
            f"a value of the {type(data).__name__} is out of range of every 64-bit integer "
            f"type ({e}); the call did nothing"
        ) from e
    except (pa.ArrowException, ValueError, TypeError, KeyError) as e:
        raise InvalidInputError(f"cannot convert the {type(data).__name__} to Arrow: {e}") from e
    names = table.schema.names  # once: Table.column_names builds the list again on every call
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise SchemaMismatchError(f"column(s) {dup} appear more than once in the input")
    return table


def _convert(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    if isinstance(data, Mapping):
        return pa.table(dict(data))
    if isinstance(data, (list, tuple)) and (not data or isinstance(data[0], Mapping)):
        return pa.Table.from_pylist(list(data))  # rows as dicts
    if hasattr(data, "__arrow_c_stream__") or type(data).__module__.startswith("pandas"):
        return pa.table(data)
    if type(data).__module__.startswith("pyspark") and hasattr(data, "toArrow"):
        return data.toArrow()  # a Spark DataFrame, collected to this process
    raise InvalidInputError(
        f"cannot write a {type(data).__name__}; pass a pyarrow Table, RecordBatch, "
        "RecordBatchReader, pandas, polars or Spark DataFrame, anything with "
        "__arrow_c_stream__, a dict of columns or a list of row dicts"
    )


class RowCoercer:
    """Validates and casts upserts and deletes to the WAL schema of one table."""

    def __init__(self, base_schema: pa.Schema, primary_key: Sequence[str]) -> None:
        self.base_schema = base_schema
        self.primary_key = list(primary_key)
        self.schema = wal_schema(base_schema, primary_key)
        self._live_rows = pa.array(np.zeros(0, dtype=bool))
        self._not_null = [
            f.name for f in base_schema if not f.nullable and f.name not in primary_key
        ]
        # Input of exactly these fields needs no cast or reordering, only null checks.
        self._exact_input = pa.schema(list(self.schema)[:-1])
        self._required = [
            (i, f.name)
            for i, f in enumerate(self._exact_input)
            if f.name in self.primary_key or f.name in self._not_null
        ]
        self._tombstone_field = self.schema.field(TOMBSTONE)
        self._vectors = [
            (i, f.name) for i, f in enumerate(self._exact_input) if is_vector_type(f.type)
        ]

    def upserts(self, data: WriteData) -> pa.RecordBatch:
        """Rows to insert or replace, with ``_tombstone = false``."""
        table = data if isinstance(data, pa.Table) else to_arrow_table(data)
        if table.schema.equals(self._exact_input):  # unique names: no need to check for any
            batch = _one_batch(table)
            for i, name in self._required:
                self._check_not_null(batch.column(i), name)
            self._check_vectors(batch)
            return batch.append_column(self._tombstone_field, self._live(batch.num_rows))
        table = to_arrow_table(table)
        names = set(table.schema.names)
        self._check_keys(table, names)
        missing = [f.name for f in self.base_schema if f.name not in names]
        extra = sorted(names - {f.name for f in self.base_schema})
        if missing or extra:
            raise SchemaMismatchError(
                "upsert columns do not match the table: "
                + (f"missing {missing} " if missing else "")
                + (f"unknown {extra} " if extra else "")
                + f"(table columns: {self.base_schema.names})"
            )
        cols = [self._cast(table.column(f.name), f) for f in self.base_schema]
        for name in self._not_null:
            self._check_not_null(table.column(name), name)
        cols.append(self._live(table.num_rows))
        batch = _one_batch(pa.Table.from_arrays(cols, schema=self.schema))
        self._check_vectors(batch)
        return batch

    def partial(self, data: WriteData) -> pa.Table:
        """A partial update's rows: the key columns and any other columns, cast to the table's
        types (unknown columns and nulls in a key or a non-nullable column refused).

        Example:
            >>> s = pa.schema([pa.field("id", pa.int64(), False), ("a", pa.int64()), ("b", pa.string())])
            >>> RowCoercer(s, ["id"]).partial({"id": [1], "b": ["x"]}).column_names
            ['id', 'b']
        """
        table = to_arrow_table(data)
        names = set(table.schema.names)
        self._check_keys(table, names)
        extra = sorted(names - set(self.base_schema.names))
        if extra or len(names) != table.num_columns:
            raise SchemaMismatchError(
                f"update columns do not match the table: unknown or repeated {extra or names} "
                f"(table columns: {self.base_schema.names})"
            )
        fields = [f for f in self.base_schema if f.name in names]
        cols = [self._cast(table.column(f.name), f) for f in fields]
        for f, col in zip(fields, cols):
            if f.name in self._not_null:
                self._check_not_null(col, f.name)
        return pa.Table.from_arrays(cols, schema=pa.schema(fields))

    def deletes(self, keys: Keys) -> pa.RecordBatch:
        """Tombstone rows: the key columns, every other column null, ``_tombstone = true``.

        ``keys`` is a table holding the key columns (other columns are ignored) or, for a
        single-column key, an array or list of key values.
        """
        table = self.keys(keys)
        n = table.num_rows
        cols = []
        for f in self.schema:
            if f.name in self.primary_key:
                cols.append(table.column(f.name))
            elif f.name == TOMBSTONE:
                cols.append(_constant_bool(True, n))
            else:
                cols.append(pa.nulls(n, f.type))
        return _one_batch(pa.Table.from_arrays(cols, schema=self.schema))

    def key_table(self, keys: Keys) -> pa.Table:
        """``keys`` as a table: a table as given, an array/list of a one-column key, one key
        value, or a composite key as a tuple (one key) or a list of tuples.

        Example:
            >>> schema = pa.schema([pa.field("a", pa.string(), False), pa.field("b", pa.int64(), False)])
            >>> RowCoercer(schema, ["a", "b"]).key_table([("x", 1), ("y", 2)]).to_pydict()
            {'a': ['x', 'y'], 'b': [1, 2]}
        """
        composite = len(self.primary_key) > 1
        if isinstance(keys, _SCALARS):
            if composite:
                raise PrimaryKeyError(
                    f"the primary key is composite {self.primary_key}: pass a key as a tuple "
                    f"of {len(self.primary_key)} values, or a table of key columns"
                )
            keys = [keys]
        if composite and isinstance(keys, tuple) and keys and isinstance(keys[0], _SCALARS):
            keys = [keys]  # one composite key
        if composite and isinstance(keys, list) and keys and isinstance(keys[0], tuple):
            wrong = next((k for k in keys if len(k) != len(self.primary_key)), None)
            if wrong is not None:
                raise PrimaryKeyError(
                    f"key {wrong!r} has {len(wrong)} value(s); the primary key has "
                    f"{len(self.primary_key)} columns {self.primary_key}"
                )
            return to_arrow_table(dict(zip(self.primary_key, zip(*keys))))
        if isinstance(keys, list) and keys and isinstance(keys[0], Mapping):
            return to_arrow_table(keys)
        if isinstance(keys, (pa.Array, pa.ChunkedArray, list, tuple)) or type(keys).__name__ in (
            "ndarray",
            "Series",
        ):
            if composite:
                raise PrimaryKeyError(
                    f"the primary key is composite {self.primary_key}: pass a table of key "
                    "columns, or tuples of key values"
                )
            return to_arrow_table({self.primary_key[0]: keys})
        return to_arrow_table(keys)

    def deletes_for_regions(
        self, keys: Keys, spec: RegionSpec | None, carry: Sequence[str] = ()
    ) -> tuple[pa.RecordBatch, pa.RecordBatch]:
        """Tombstones for ``keys``, and the batch to compute their region values on.

        Tombstones carry only keys, and the ``carry`` columns of ``keys`` (a sequence column)
        cast to the table's types. When ``spec`` reads other columns, the second batch is the
        tombstones with those columns taken from ``keys`` (which must hold them) too. It is
        for routing and region checks only; the WAL stores the first.
        """
        table = self.key_table(keys)
        rows = self.deletes(table)
        extra = (
            []
            if spec is None
            else [
                c
                for c in dict.fromkeys(c for f in spec.fields for c in f.source_columns)
                if c not in self.primary_key and c not in carry
            ]
        )
        for columns, why in (
            (carry, "this table orders each key's writes by it: a delete carries it too"),
            (
                extra,
                "the region spec reads it: include it with the keys, so the deletes reach "
                "their regions",
            ),
        ):
            missing = [c for c in columns if c not in table.column_names]
            if missing:
                raise InvalidInputError(f"column(s) {missing} missing from the deletes: {why}")
        rows = self._with_columns(rows, table, carry)
        return rows, self._with_columns(rows, table, extra)

    def _with_columns(
        self, rows: pa.RecordBatch, table: pa.Table, columns: Sequence[str]
    ) -> pa.RecordBatch:
        for c in columns:
            i = rows.schema.get_field_index(c)
            col = self._cast(table.column(c), self.base_schema.field(c)).combine_chunks()
            rows = rows.set_column(i, rows.schema.field(i), col)
        return rows

    def _live(self, n: int) -> pa.Array:
        """``_tombstone = false`` for ``n`` rows, cached: streams repeat batch sizes. Exactly
        ``n`` long, never a slice of a larger array, whose buffer every batch would pin."""
        live = self._live_rows
        if len(live) != n:
            live = self._live_rows = pa.array(np.zeros(n, dtype=bool))
        return live

    def keys(self, keys: Keys) -> pa.Table:
        """Key columns only, cast to the key types (an array/list for a one-column key).

        Example:
            >>> RowCoercer(pa.schema([pa.field("id", pa.int64(), False)]), ["id"]).keys([1]).schema
            id: int64 not null
        """
        table = self.key_table(keys)
        self._check_keys(table, set(table.column_names))
        return pa.table(
            [self._cast(table.column(k), self.base_schema.field(k)) for k in self.primary_key],
            schema=pa.schema([self.schema.field(k) for k in self.primary_key]),
        )

    def _check_keys(self, table: pa.Table, names: set[str]) -> None:
        missing = [k for k in self.primary_key if k not in names]
        if missing:
            raise PrimaryKeyError(f"primary-key column(s) {missing} missing from the input")
        for k in self.primary_key:
            self._check_not_null(table.column(k), k)

    def _check_vectors(self, batch: pa.RecordBatch) -> None:
        """Refuse the batch if a vector in it is unusable (see :func:`unusable_vectors`)."""
        for i, name in self._vectors:
            bad = unusable_vectors(batch.column(i))
            if bad is None:
                continue
            row, why = bad
            key = {k: batch.column(k)[row].as_py() for k in self.primary_key}
            raise InvalidInputError(
                f"column {name!r}: the vector of row {row} (key {key}) {why}; a vector must "
                f"be finite with a squared norm of at most {_max_squared_norm(batch.column(i)):.3g} "
                "(so that a vector index can place it and distances stay finite). Fix it, or "
                "write NULL for a row without a vector; nothing was written"
            )

    def _check_not_null(self, column: pa.Array | pa.ChunkedArray, name: str) -> None:
        nulls = column.null_count
        if not nulls:
            return
        if name in self.primary_key:
            raise PrimaryKeyError(
                f"primary-key column {name!r} holds {nulls} null(s); every row needs a key"
            )
        raise SchemaMismatchError(f"column {name!r} is not nullable but holds {nulls} null(s)")

    @staticmethod
    def _cast(column: pa.ChunkedArray, field: pa.Field) -> pa.ChunkedArray:
        """``column`` as ``field``'s type, or :class:`SchemaMismatchError` if that would change
        a value: another kind of data (a string is not parsed into a number), an overflow, a
        rounding, a lost time of day or a dropped struct field. Only float narrowing may lose
        precision (float64 vectors into a float32 column), never range."""
        if column.type == field.type:
            return column
        if pa.types.is_dictionary(column.type):
            column = pc.cast(column, column.type.value_type)
            if column.type == field.type:
                return column
        if column.null_count == len(column):  # no value to change (an empty pandas frame)
            return pa.chunked_array([pa.nulls(len(column), field.type)])
        _check_kinds(column.type, field.type, field.name)
        try:
            out = pc.cast(column, field.type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise SchemaMismatchError(
                f"column {field.name!r} has type {column.type}, which cannot be cast safely "
                f"to the table's {field.type}: {e}"
            ) from e
        _check_lossless(column, out, field.name)
        return out


def is_vector_type(t: pa.DataType) -> bool:
    """A vector column's type: a fixed-size list of floats.

    Example:
        >>> is_vector_type(pa.list_(pa.float32(), 8)), is_vector_type(pa.list_(pa.int8(), 8))
        (True, False)
    """
    return pa.types.is_fixed_size_list(t) and pa.types.is_floating(t.value_type)


def _max_squared_norm(column: pa.Array) -> float:
    # A quarter of the largest float (float32 for half floats, which distances are computed
    # in): then every squared distance between two such vectors, ||a||² + ||b||² + 2|a·b|,
    # and to an index centroid (a mean of them), stays finite.
    big = np.float64 if column.type.value_type == pa.float64() else np.float32
    return float(np.finfo(big).max) / 4


def unusable_vectors(column: pa.Array | pa.ChunkedArray) -> tuple[int, str] | None:
    """The first row of a vector ``column`` whose vector no index or search can use, and why
    (None if there is none): one with a missing element, a NaN or an infinity, or a squared
    norm above a quarter of the largest float (``[3e38, -3e38, 0, 0]``: Lance's IVF cannot
    place it, and its catch-up fails). NULL vectors are fine. Vectorised over the rows.

    Example:
        >>> v = pa.FixedSizeListArray.from_arrays(pa.array([1, 2, 3e38, 0], pa.float32()), 2)
        >>> unusable_vectors(v)
        (1, 'has a squared norm of inf')
    """
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n, dim = len(col), col.type.list_size
    if n == 0 or col.null_count == n:
        return None
    values = col.values.slice(col.offset * dim, n * dim)
    valid = np.ones(n, dtype=bool)
    if col.null_count:
        valid = col.is_valid().to_numpy(zero_copy_only=False)
    if values.null_count:
        missing = values.is_null().to_numpy(zero_copy_only=False).reshape(n, dim).any(axis=1)
        missing &= valid
        if missing.any():
            return int(np.argmax(missing)), "has a missing element"
    dtype = np.float64 if values.type == pa.float64() else np.float32
    matrix = values.to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(n, dim)
    with np.errstate(over="ignore", invalid="ignore"):
        squared = np.einsum("ij,ij->i", matrix, matrix)
    bad = ~(squared <= _max_squared_norm(col)) & valid  # NaN and inf elements make it NaN/inf
    if not bad.any():
        return None
    row = int(np.argmax(bad))
    if not np.isfinite(matrix[row]).all():
        return row, "holds a NaN or an infinity"
    return row, f"has a squared norm of {squared[row]:.3g}"


_KINDS = (
    (pa.types.is_integer, "integer"),
    (pa.types.is_floating, "float"),
    (pa.types.is_decimal, "decimal"),
    (pa.types.is_boolean, "bool"),
    (
        lambda t: (
            pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
        ),
        "string",
    ),
    (
        lambda t: (
            pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t)
        ),
        "binary",
    ),
    (pa.types.is_timestamp, "timestamp"),
    (pa.types.is_date, "date"),
    (pa.types.is_time, "time"),
    (pa.types.is_duration, "duration"),
    (
        lambda t: (
            pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
        ),
        "list",
    ),
    (pa.types.is_struct, "struct"),
    (pa.types.is_map, "map"),
    (pa.types.is_null, "null"),
)
# Kinds a value may change into without changing what it means (plus every kind into itself);
# the safe cast and _check_lossless refuse the values that would change (1.5 into an integer).
# Floats into integers: pandas holds an integer column with missing values as float64.
_CONVERTIBLE = {
    ("integer", "float"),
    ("float", "integer"),
    ("integer", "decimal"),
    ("decimal", "float"),
    ("date", "timestamp"),
    ("timestamp", "date"),
}
_EXACT = frozenset(["decimal", "timestamp", "date", "time", "duration"])


def _one_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _kind(t: pa.DataType) -> str:
    return next((k for test, k in _KINDS if test(t)), str(t))


def _check_kinds(src: pa.DataType, dst: pa.DataType, name: str) -> None:
    a, b = _kind(src), _kind(dst)
    if a != b and a != "null" and (a, b) not in _CONVERTIBLE:
        raise SchemaMismatchError(
            f"column {name!r} holds {src} values, but the table's column is {dst}; convert them "
            "explicitly (a value of another kind is never cast implicitly)"
        )
    if a == b == "struct" and {f.name for f in src} != {f.name for f in dst}:
        raise SchemaMismatchError(
            f"column {name!r} has struct fields {[f.name for f in src]}, the table's has "
            f"{[f.name for f in dst]}"
        )
    if a == b == "timestamp" and (src.tz is None) != (dst.tz is None):
        raise SchemaMismatchError(
            f"column {name!r} is {src}, the table's is {dst}: a timestamp with a time zone and "
            "one without are different things; convert explicitly"
        )
    for child_src, child_dst in _children(src, dst):
        _check_kinds(child_src, child_dst, name)


def _children(src: pa.DataType, dst: pa.DataType) -> list[tuple[pa.DataType, pa.DataType]]:
    if _kind(src) == _kind(dst) == "list":
        return [(src.value_type, dst.value_type)]
    if _kind(src) == _kind(dst) == "struct":
        return [(src.field(f.name).type, f.type) for f in dst]
    if _kind(src) == _kind(dst) == "map":
        return [(src.key_type, dst.key_type), (src.item_type, dst.item_type)]
    return []


def _check_lossless(before: pa.ChunkedArray, after: pa.ChunkedArray, name: str) -> None:
    """Refuse a cast that changed a value pyarrow's safe cast lets through; nested values are
    checked leaf by leaf, by the same rules."""
    src, dst = before.type, after.type
    if src == dst or _kind(src) == "null":
        return
    if _kind(src) == _kind(dst) == "list":
        _check_lossless(pc.list_flatten(before), pc.list_flatten(after), name)
    elif _kind(src) == _kind(dst) == "map":
        b, a = _one_array(before), _one_array(after)
        _check_lossless(b.keys, a.keys, name)
        _check_lossless(b.items, a.items, name)
    elif _kind(src) == _kind(dst) == "struct":
        for f in dst:
            _check_lossless(pc.struct_field(before, f.name), pc.struct_field(after, f.name), name)
    elif _kind(dst) == "float" and _kind(src) in ("float", "decimal"):
        # Narrowing may round (float64 vectors into float32), never overflow.
        grown = pc.sum(pc.is_inf(after)).as_py() or 0
        if grown and grown != (pc.sum(pc.is_inf(pc.cast(before, pa.float64()))).as_py() or 0):
            raise SchemaMismatchError(
                f"column {name!r}: a value is out of the range of the table's {dst}"
            )
    elif _kind(src) in _EXACT or _kind(dst) in _EXACT:
        try:
            same = pc.all(pc.equal(pc.cast(after, src, safe=False), before)).as_py() is not False
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            same = False
        if not same:
            raise SchemaMismatchError(
                f"column {name!r}: casting {src} to the table's {dst} would change values "
                "(rounded, truncated or dropped); convert them explicitly"
            )


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    """``table`` as one record batch (copying only when its columns are chunked)."""
    batches = table.to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return table.combine_chunks().to_batches()[0]


def _constant_bool(value: bool, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.bool_()), n) if n else pa.array([], pa.bool_())
