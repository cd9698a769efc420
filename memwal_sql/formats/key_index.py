"""The ``_pk_index/`` BTree sidecar of a flushed generation, byte-compatible with Lance 14.

Lance's ``LsmScanner`` refuses a generation without it and trusts it blindly (a wrong index
makes superseded base rows reappear), so it must hold every physical row of the generation's
single fragment 0, duplicates and ``_tombstone`` rows included. Layout (Lance file version 2.0):

- ``page_data.lance``: ``values: <pk type>`` (nullable), ``ids: uint64`` (row offset in fragment
  0), sorted by value then id, written one 8192-row batch (page) at a time;
- ``page_lookup.lance``: one row per page, ``min``/``max`` of the page's values,
  ``null_count: uint32``, ``page_idx: uint32``; schema metadata ``batch_size="8192"``,
  ``range_partitioned="false"``.

A single-column primary key is indexed with its own Arrow type. A composite key is indexed as
``binary`` in the order-preserving encoding of :func:`encode_composite_keys`.

Example:
    >>> import pyarrow as pa, tempfile
    >>> gen = tempfile.mkdtemp()
    >>> write_pk_index(gen, pa.table({"id": pa.array([3, 1, 2], pa.int64())}))
    >>> read_pk_index(gen).to_pydict()
    {'values': [1, 2, 3], 'ids': [1, 2, 0]}
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.errors import InvalidInputError, SchemaMismatchError, StorageError
from memwal_sql.formats.bloom import is_supported_pk_type

__all__ = [
    "PK_INDEX_DIR",
    "PK_INDEX_FILES",
    "PK_INDEX_PAGE_SIZE",
    "encode_composite_keys",
    "pk_index_schemas",
    "read_pk_index",
    "write_pk_index",
]

#: Directory of the sidecar inside a generation directory.
PK_INDEX_DIR = "_pk_index"
#: Values per BTree page; Lance records it as the ``batch_size`` metadata of page_lookup.lance.
PK_INDEX_PAGE_SIZE = 8192
_PAGE_DATA = "page_data.lance"
_PAGE_LOOKUP = "page_lookup.lance"
#: The files of the sidecar.
PK_INDEX_FILES = (_PAGE_DATA, _PAGE_LOOKUP)
# Lance writes BTree index files as file version 2.0 (on-disk 0.3), not the dataset's 2.x.
_FILE_VERSION = "2.0"

_SIGNED = frozenset([pa.int8(), pa.int16(), pa.int32(), pa.int64()])
_UNSIGNED = frozenset([pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()])
_BYTES = frozenset([pa.utf8(), pa.large_utf8(), pa.binary(), pa.large_binary()])
_SIGN_BIT = np.uint64(1 << 63)


def _as_table(keys: pa.Table | pa.RecordBatch) -> pa.Table:
    table = pa.Table.from_batches([keys]) if isinstance(keys, pa.RecordBatch) else keys
    if table.num_columns == 0:
        raise SchemaMismatchError("no primary-key columns given")
    for field in table.schema:
        if not is_supported_pk_type(field.type):
            raise SchemaMismatchError(
                f"primary-key column {field.name!r} has type {field.type}, which Lance 14 does "
                "not accept as a MemWAL primary key"
            )
    return table


def _fixed_part(arr: pa.Array) -> np.ndarray:
    """(n, 9) matrix: 0x01 then the value as 8 order-preserving big-endian bytes (nulls: junk)."""
    t = arr.type
    n = len(arr)
    rows = np.empty((n, 9), dtype=np.uint8)
    rows[:, 0] = 1
    filled = arr.fill_null(0) if arr.null_count else arr
    vals = filled.to_numpy(zero_copy_only=False)
    if t in _SIGNED:
        # Widen to i64 and flip the sign bit so unsigned big-endian byte order == numeric order.
        word = vals.astype(np.int64).view(np.uint64) ^ _SIGN_BIT
    else:
        word = vals.astype(np.uint64)
    rows[:, 1:] = word.astype(">u8").view(np.uint8).reshape(n, 8)
    return rows


def _matrix_as_binary(rows: np.ndarray) -> pa.LargeBinaryArray:
    n, w = rows.shape
    offsets = np.arange(n + 1, dtype=np.int64) * w
    data = np.ascontiguousarray(rows)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _bytes_part(arr: pa.Array) -> pa.LargeBinaryArray:
    """0x01, the bytes with each 0x00 escaped as 0x00 0xff, then the terminator 0x00 0x00."""
    # Escaping keeps the encoding order-preserving and prefix-free: the terminator 00 00 sorts
    # before any escaped byte 00 ff and before every other byte, so "a" < "a\0" < "ab".
    raw = arr.cast(pa.large_binary())
    escaped = pc.replace_substring(raw, pattern=b"\x00", replacement=b"\x00\xff")
    return pc.binary_join_element_wise(
        pa.scalar(b"\x01", pa.large_binary()),
        escaped,
        pa.scalar(b"\x00\x00", pa.large_binary()),
        pa.scalar(b"", pa.large_binary()),
    )


def _column_part(arr: pa.Array) -> pa.LargeBinaryArray:
    """This column's share of every row's composite key, as null-free large_binary."""
    t = arr.type
    if t in _BYTES:
        part = _bytes_part(arr)
    elif t == pa.bool_():
        rows = np.ones((len(arr), 2), dtype=np.uint8)
        rows[:, 1] = arr.fill_null(False).to_numpy(zero_copy_only=False)
        part = _matrix_as_binary(rows)
    else:
        part = _matrix_as_binary(_fixed_part(arr))
    if arr.null_count:
        # A null is the single byte 0x00: it sorts before every non-null (which starts 0x01).
        part = pc.if_else(arr.is_valid(), part, pa.scalar(b"\x00", pa.large_binary()))
    return part


def encode_composite_keys(keys: pa.Table | pa.RecordBatch) -> pa.BinaryArray:
    """Encode each row's primary-key tuple as order-preserving ``binary``, as Lance 14 does.

    Per column, in primary-key order: ``0x00`` if null; else ``0x01`` followed by
    signed ints (any width): the value widened to i64, sign bit flipped, 8 bytes big-endian;
    unsigned ints: widened to u64, 8 bytes big-endian; bool: one byte 0/1;
    utf8/large_utf8/binary/large_binary: the bytes with ``0x00`` escaped as ``0x00 0xff``,
    then ``0x00 0x00``. Byte-wise comparison of the encodings orders the tuples.

    Example:
        >>> enc = encode_composite_keys(pa.table({"a": pa.array([1], pa.int64()), "b": ["x"]}))
        >>> enc[0].as_py().hex(" ")
        '01 80 00 00 00 00 00 00 01 01 78 00 00'
    """
    table = _as_table(keys)
    # Column-at-a-time Arrow/numpy kernels; no Python code runs per row.
    parts = [_column_part(table.column(i).combine_chunks()) for i in range(table.num_columns)]
    if table.num_rows == 0:
        return pa.array([], pa.binary())
    joined = (
        parts[0]
        if len(parts) == 1
        else pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))
    )
    try:
        # Lance's index type is binary (32-bit offsets), so the encodings must fit in 2 GiB.
        return joined.cast(pa.binary())
    except pa.ArrowInvalid as e:
        raise InvalidInputError(
            f"the encoded composite primary keys do not fit one binary array ({e}); flush smaller generations"
        ) from e


def pk_index_schemas(value_type: pa.DataType) -> tuple[pa.Schema, pa.Schema]:
    """The (page_data, page_lookup) schemas Lance 14 uses for a key of ``value_type``.

    Example:
        >>> data, lookup = pk_index_schemas(pa.int64())
        >>> data.names, lookup.metadata[b"batch_size"]
        (['values', 'ids'], b'8192')
    """
    data = pa.schema([pa.field("values", value_type, True), pa.field("ids", pa.uint64(), False)])
    lookup = pa.schema(
        [
            pa.field("min", value_type, True),
            pa.field("max", value_type, True),
            pa.field("null_count", pa.uint32(), False),
            pa.field("page_idx", pa.uint32(), False),
        ],
        metadata={"batch_size": str(PK_INDEX_PAGE_SIZE), "range_partitioned": "false"},
    )
    return data, lookup


def _index_path(generation_uri: str, name: str) -> str:
    return f"{generation_uri.rstrip('/')}/{PK_INDEX_DIR}/{name}"


def key_values(keys: pa.Table | pa.RecordBatch) -> pa.Array:
    """The values a primary-key index orders: the key column itself, or, for a composite key,
    :func:`encode_composite_keys` of its columns.

    Example:
        >>> key_values(pa.table({"id": [3, 1]})).to_pylist()
        [3, 1]
    """
    table = _as_table(keys)
    if table.num_columns == 1:
        return table.column(0).combine_chunks()
    return encode_composite_keys(table)


def key_order(values: pa.Array) -> np.ndarray:
    """The stable ascending order of ``values``, nulls first: the (value, row id) order of
    Lance's primary-key index (equal values keep ascending row ids).

    Example:
        >>> key_order(pa.array([3, 1, 3, None])).tolist()
        [3, 1, 0, 2]
    """
    if pa.types.is_integer(values.type) and values.null_count == 0:
        # numpy's stable sort of integers is faster than Arrow's.
        return np.argsort(values.to_numpy(), kind="stable")
    order = pc.array_sort_indices(values, order="ascending", null_placement="at_start")
    return order.to_numpy()


@dataclass(frozen=True)
class SortedKeys:
    """Each row's :func:`key_values` and their :func:`key_order`: what a key index is written
    from. A flush finds them while deduplicating its rows and hands them on.

    Example:
        >>> SortedKeys.of(pa.table({"id": [3, 1]})).order.tolist()
        [1, 0]
    """

    values: pa.Array
    order: np.ndarray

    @classmethod
    def of(cls, keys: pa.Table | pa.RecordBatch) -> SortedKeys:
        values = key_values(keys)
        return cls(values, key_order(values))


def write_pk_index(
    generation_uri: str,
    keys: pa.Table | pa.RecordBatch | SortedKeys,
    storage_options: dict | None = None,
) -> None:
    """Write ``{generation_uri}/_pk_index/`` for a generation whose rows have these keys.

    ``keys`` holds the primary-key column(s), in primary-key order, of every physical row of the
    generation's fragment 0 in row-offset order (row i gets id i), including rows a deletion
    vector hides and ``_tombstone`` rows, exactly as Lance indexes them; or those keys already
    :class:`SortedKeys` (a flush sorts its keys once, to deduplicate them).

    Example:
        >>> import tempfile
        >>> gen = tempfile.mkdtemp()
        >>> write_pk_index(gen, pa.table({"a": pa.array([2, 1], pa.int32()), "b": ["y", "x"]}))
        >>> read_pk_index(gen).column("ids").to_pylist()
        [1, 0]
    """
    sorted_keys = keys if isinstance(keys, SortedKeys) else SortedKeys.of(keys)
    values, order = sorted_keys.values, sorted_keys.order
    n = len(values)
    data_schema, lookup_schema = pk_index_schemas(values.type)
    sorted_data = pa.Table.from_arrays(
        [values.take(pa.array(order)), pa.array(order.astype(np.uint64))], schema=data_schema
    )
    lookup: dict[str, list] = {"min": [], "max": [], "null_count": [], "page_idx": []}
    # Deferred import: pylance is heavy and only needed when files are really written.
    from lance.file import LanceFileWriter

    opts = dict(storage_options) if storage_options else None
    try:
        writer = LanceFileWriter(
            _index_path(generation_uri, _PAGE_DATA),
            data_schema,
            version=_FILE_VERSION,
            storage_options=opts,
        )
        for page_idx, start in enumerate(range(0, n, PK_INDEX_PAGE_SIZE)):
            page = sorted_data.slice(start, PK_INDEX_PAGE_SIZE)
            writer.write_batch(page)
            page_values = page.column("values")
            stats = pc.min_max(page_values)
            lookup["min"].append(stats["min"].as_py())
            lookup["max"].append(stats["max"].as_py())
            lookup["null_count"].append(page_values.null_count)
            lookup["page_idx"].append(page_idx)
        writer.close()
        lookup_writer = LanceFileWriter(
            _index_path(generation_uri, _PAGE_LOOKUP),
            lookup_schema,
            version=_FILE_VERSION,
            storage_options=opts,
        )
        lookup_writer.write_batch(pa.Table.from_pydict(lookup, schema=lookup_schema))
        lookup_writer.close()
    except (OSError, RuntimeError, ValueError) as e:
        raise StorageError(
            f"writing the primary-key index of {generation_uri!r} failed: {e}"
        ) from e


def read_pk_index(generation_uri: str, storage_options: dict | None = None) -> pa.Table:
    """Read ``{generation_uri}/_pk_index/page_data.lance`` as a table ``(values, ids)``.

    Example:
        >>> import tempfile
        >>> gen = tempfile.mkdtemp()
        >>> write_pk_index(gen, pa.table({"k": ["b", "a"]}))
        >>> read_pk_index(gen).to_pydict()
        {'values': ['a', 'b'], 'ids': [1, 0]}
    """
    from lance.file import LanceFileReader

    path = _index_path(generation_uri, _PAGE_DATA)
    try:
        reader = LanceFileReader(
            path, storage_options=dict(storage_options) if storage_options else None
        )
        return reader.read_all(batch_size=PK_INDEX_PAGE_SIZE).to_table()
    except (OSError, RuntimeError, ValueError) as e:
        raise StorageError(f"reading the primary-key index {path!r} failed: {e}") from e
