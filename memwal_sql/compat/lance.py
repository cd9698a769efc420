"""pylance 14 behaviour memwal-sql depends on but pylance does not document.

Example:
    >>> is_not_found(ValueError("Dataset at path x was not found"))
    True
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from memwal_sql._proto.memwal_pb2 import SchemaField

# Lance's merge_insert with `mark_sstables_as_compacted` refuses a stale MemWAL commit with
# this text; other lost races say "conflict". Both are a retry, not a failure.
STALE_COMPACTION = "Stale SSTable compaction"


def take_rows(
    dataset: lance.LanceDataset, row_addresses: pa.Array, columns: Sequence[str]
) -> pa.Table:
    """The rows at ``row_addresses`` (``fragment_id << 32 | offset``), in that order.

    pylance has no public call that takes row addresses (``take`` takes positions in the
    filtered table, ``LanceFragment.take`` offsets within one fragment); ``_take_rows`` does.
    """
    return dataset._take_rows(row_addresses, columns=list(columns))


def storage_options_of(dataset: lance.LanceDataset) -> dict[str, str] | None:
    """The storage options ``dataset`` was opened with (pylance keeps them privately)."""
    return getattr(dataset, "_storage_options", None)


def data_file_paths(fragment: lance.LanceFragment | lance.FragmentMetadata) -> list[str]:
    """The paths of a fragment's (or its metadata's) data files, relative to the dataset's ``data/``.

    pylance 14's ``DataFile.path`` defines a class on every access (it once was a method), which
    is slow next to a point lookup (under a millisecond: ``benchmarks/bench_lookup.py``), and a
    point lookup names fragments by their files on every probe.
    """
    return [getattr(f, "_path", None) or f.path for f in fragment.data_files()]


def single_data_file(dataset: lance.LanceDataset, fragment: lance.LanceFragment) -> str | None:
    """The URI of the one data file that holds every stored column of ``fragment``, or None
    (several files, after columns were added; or a file under another base path).

    Lance keeps a fragment's data files under ``<dataset>/data/``, named relative to it.
    """
    files = fragment.data_files()
    if len(files) != 1 or files[0].base_id is not None:
        return None
    return f"{dataset.uri.rstrip('/')}/data/{data_file_paths(fragment)[0]}"


def index_directory(dataset: lance.LanceDataset, uuid: str) -> str:
    """The URI of the directory holding the files of index segment ``uuid``."""
    return f"{dataset.uri.rstrip('/')}/_indices/{uuid}"


def row_addr_treemap(rows: Mapping[int, np.ndarray | range | None]) -> bytes:
    """Row addresses as a scanner's ``row_addr_allowlist``/``row_addr_blocklist`` takes them:
    per fragment id, its row offsets (sorted, or a ``range``; None: the whole fragment).

    pylance documents the argument as ``RowAddrTreeMap::serialize_into`` output and offers no
    encoder. That format (lance-core ``utils/mask.rs``): u32 number of fragments, then per
    fragment, by id, u32 id, u32 bitmap size (0: the whole fragment) and the bitmap in the
    portable Roaring format (written here without run containers).

    Example:
        >>> row_addr_treemap({3: None}).hex()
        '010000000300000000000000'
    """
    out = [struct.pack("<I", len(rows))]
    for fragment_id in sorted(rows):
        offsets = rows[fragment_id]
        if offsets is not None and not len(offsets):
            raise ValueError(f"fragment {fragment_id}: an empty bitmap would mean all rows")
        bitmap = b"" if offsets is None else _roaring_bitmap(offsets)
        out.append(struct.pack("<II", fragment_id, len(bitmap)) + bitmap)
    return b"".join(out)


_NO_RUN_CONTAINERS = 12346  # the portable Roaring format's cookie (RoaringFormatSpec)
_ARRAY_MAX = 4096  # more values than this in a container: a bitmap of 2^16 bits


def _roaring_bitmap(offsets: np.ndarray | range) -> bytes:
    """One portable Roaring bitmap: per block of 2^16 offsets (its key: the high 16 bits), an
    array container of the low 16 bits, or a bitmap container when more than 4096 are set."""
    blocks: list[tuple[int, np.ndarray]] = []  # key, the block's 2^16 bits
    if isinstance(offsets, range):  # built block by block, never materialised
        for key in range(offsets.start >> 16, ((offsets.stop - 1) >> 16) + 1):
            bits = np.zeros(1 << 16, dtype=bool)
            bits[max(offsets.start - (key << 16), 0) : offsets.stop - (key << 16)] = True
            blocks.append((key, bits))
    else:
        values = np.asarray(offsets, dtype=np.uint32)
        high = values >> 16
        starts = np.flatnonzero(np.diff(high, prepend=np.uint32(0xFFFFFFFF)))  # sorted values
        for start, stop in zip(starts, [*starts[1:], len(values)]):
            bits = np.zeros(1 << 16, dtype=bool)
            bits[values[start:stop] & 0xFFFF] = True
            blocks.append((int(high[start]), bits))
    header = np.empty(2 * len(blocks), dtype="<u2")
    containers = []
    for i, (key, bits) in enumerate(blocks):
        count = int(np.count_nonzero(bits))
        header[2 * i], header[2 * i + 1] = key, count - 1
        containers.append(
            np.packbits(bits, bitorder="little").tobytes()
            if count > _ARRAY_MAX
            else np.flatnonzero(bits).astype("<u2").tobytes()
        )
    first = 8 + header.nbytes + 4 * len(blocks)
    positions = first + np.cumsum([0, *map(len, containers[:-1])], dtype=np.int64)
    return b"".join(
        [
            struct.pack("<II", _NO_RUN_CONTAINERS, len(blocks)),
            header.tobytes(),
            positions.astype("<u4").tobytes(),
            *containers,
        ]
    )


def is_not_found(error: BaseException) -> bool:
    """Whether a pylance error opening a dataset means there is none."""
    text = str(error).lower()
    return isinstance(error, FileNotFoundError) or "not found" in text or "does not exist" in text


def is_io_error(error: BaseException) -> bool:
    """Whether a pylance error is a failure of its object store (pylance raises those as a
    plain ``ValueError`` or ``OSError`` whose text starts ``LanceError(IO)``).

    Example:
        >>> is_io_error(ValueError("LanceError(IO): Generic S3 error: ..."))
        True
    """
    return isinstance(error, (ValueError, OSError, RuntimeError)) and "LanceError(IO)" in str(error)


def is_unanswered(error: BaseException) -> bool:
    """Whether an object-store error (Lance's or obstore's: both are Rust ``object_store``)
    means the endpoint never answered: a connection failed or a request timed out.

    Example:
        >>> is_unanswered(OSError("Generic S3 error: ... HTTP error: error sending request"))
        True
    """
    text = str(error)
    return any(mark in text for mark in _UNANSWERED)


# object_store's words for a request that got no response (reqwest's connect or timeout
# errors), in pylance's and obstore's error text alike.
_UNANSWERED = ("error sending request", "operation timed out")


def is_version_gone(error: BaseException) -> bool:
    """Whether a pylance error is a base-table version (its manifest) missing: listed, then
    removed by a cleanup of old versions before it was read.

    Example:
        >>> is_version_gone(ValueError("Not found: t/_versions/18446744073709551613.manifest"))
        True
    """
    return is_not_found(error) and "_versions/" in str(error)


# Lance's commit retry gave up: another writer kept committing first.
_RETRIES_EXHAUSTED = "Too many concurrent writers"


def is_commit_conflict(error: BaseException) -> bool:
    """Whether a pylance commit failed because another writer committed first ("Retryable
    commit conflict", a stale compaction, or another lost race)."""
    text = str(error)
    return STALE_COMPACTION in text or "conflict" in text.lower() or _RETRIES_EXHAUSTED in text


def vector_index_statistics(
    index_dir: str, storage_options: dict[str, str] | None = None
) -> dict[str, object] | None:
    """What ``index_statistics`` says of an IVF_PQ or IVF_FLAT index segment at ``index_dir``
    (``index_type``; per segment ``metric_type``, ``num_partitions`` and the PQ
    ``sub_index``), read from its files' metadata, without the IVF centroids: pylance 14
    serializes every centroid as JSON (36 ms at 790 partitions) and its switch to leave them
    out (``LANCE_INCLUDE_VECTOR_CENTROIDS``) is process-wide. None for any other layout (the
    caller asks ``index_statistics``).

    Lance 14 writes ``index.idx`` with schema metadata ``lance:index`` (type and distance)
    and ``lance:flat`` (a list of one entry per IVF partition); an IVF_PQ index's
    ``auxiliary.idx`` keeps its PQ parameters in ``storage_metadata``.

    Example:
        ``vector_index_statistics(index_directory(ds, uuid))["indices"][0]["num_partitions"]``
    """
    import json

    from lance.file import LanceFileReader

    def metadata(name: str) -> Mapping[bytes, bytes]:
        reader = LanceFileReader(f"{index_dir}/{name}", storage_options=storage_options)
        return reader.metadata().schema.metadata or {}

    try:
        meta = metadata("index.idx")
        index = json.loads(meta[b"lance:index"])
        kind, partitions = index["type"], len(json.loads(meta[b"lance:flat"]))
        segment: dict[str, object] = {
            "metric_type": str(index["distance_type"]).lower(),
            "num_partitions": partitions,
        }
        if kind == "IVF_PQ":
            pq = json.loads(json.loads(metadata("auxiliary.idx")[b"storage_metadata"])[0])
            segment["sub_index"] = {
                "index_type": "PQ",
                "num_sub_vectors": int(pq["num_sub_vectors"]),
                "dimension": int(pq["dimension"]),
            }
        elif kind != "IVF_FLAT":
            return None
    except (KeyError, ValueError, TypeError, IndexError, OSError):
        return None
    return {"index_type": kind, "indices": [segment]}


def ivf_pq_model(
    index_uri: str, storage_options: dict[str, str] | None = None
) -> tuple[np.ndarray, int]:
    """The PQ codebook of an IVF_PQ index, as ``create_index(pq_codebook=...)`` takes it
    (``num_sub_vectors x 2^nbits x dim / num_sub_vectors``), and ``nbits``.

    pylance reports an index's IVF centroids (``index_statistics``) but not its PQ codebook.
    Lance 14 keeps it in the index directory's ``auxiliary.idx``: the schema metadata
    ``storage_metadata`` names the global buffer (``codebook_position``), which holds a
    ``Tensor`` message (1: data type, 2: packed shape, 3: float32 values, sub-vector by
    sub-vector).
    """
    import json

    from google.protobuf.internal.decoder import _DecodeVarint
    from lance.file import LanceFileReader

    reader = LanceFileReader(
        f"{index_uri.rsplit('/', 1)[0]}/auxiliary.idx", storage_options=storage_options
    )
    meta = json.loads(json.loads(reader.metadata().schema.metadata[b"storage_metadata"])[0])
    message = bytes(reader.read_global_buffer(int(meta["codebook_position"])))
    fields: dict[int, bytes | int] = {}
    pos = 0
    while pos < len(message):
        key, pos = _DecodeVarint(message, pos)
        if key & 7 == 0:
            fields[key >> 3], pos = _DecodeVarint(message, pos)
        elif key & 7 == 2:
            size, pos = _DecodeVarint(message, pos)
            fields[key >> 3], pos = message[pos : pos + size], pos + size
        else:
            raise ValueError(f"unexpected wire type in a Lance tensor: {key & 7}")
    shape, pos, dims = fields[2], 0, []
    assert isinstance(shape, bytes)
    while pos < len(shape):
        d, pos = _DecodeVarint(shape, pos)
        dims.append(d)
    data = np.frombuffer(fields[3], dtype=np.float32)  # type: ignore[arg-type]
    m, dim, nbits = int(meta["num_sub_vectors"]), int(meta["dimension"]), int(meta["nbits"])
    if dims != [1 << nbits, dim] or data.size != (1 << nbits) * dim:
        raise ValueError(f"unexpected PQ codebook layout: shape {dims}, {data.size} values")
    # The stored shape reads [2^nbits, dim], but the values run sub-vector by sub-vector:
    # the layout create_index takes (checked by a round trip in tests/compat).
    return data.reshape(m, 1 << nbits, dim // m).copy(), nbits


# ---- field ids -------------------------------------------------------------------------------
# A Lance column is its field id, not its name: Lance 14's LsmScanner reads a generation's
# columns by the base table's field ids. pylance assigns ids by position and has no public call
# that sets them; `LanceSchema` pickles as `_from_protos(metadata, *lance.file.Field)`, through
# which the two calls below give columns the ids they must keep.


_PLACEHOLDER = "_memwal_unused_field_id_"


def _schema_fields(schema: lance.LanceSchema) -> tuple[str, list[SchemaField]]:
    metadata, *protos = schema.__reduce__()[1]
    return metadata, [SchemaField.FromString(p) for p in protos]


def _lance_schema(metadata: str, fields: Sequence[SchemaField]) -> lance.LanceSchema:
    return lance.schema.LanceSchema._from_protos(metadata, *(f.SerializeToString() for f in fields))


def field_ids(schema: lance.LanceSchema, columns: Sequence[str]) -> tuple[int, ...]:
    """The field ids of ``columns`` of ``schema``, nested ones included, each field before its
    children: the order in which pylance assigns ids by position (``0, 1, 2, ...``).

    Example:
        >>> field_ids(lance.schema.LanceSchema.from_pyarrow(pa.schema([("a", pa.int8())])), ["a"])
        (0,)
    """

    def walk(field: Any) -> Iterator[int]:
        yield field.id()
        for child in field.children():
            yield from walk(child)

    top = {f.name(): f for f in schema.fields()}
    return tuple(i for name in columns for i in walk(top[name]))


def replace_field(schema: lance.LanceSchema, old: str, new: str) -> lance.LanceSchema:
    """``schema`` with the top-level column ``new`` renamed ``old``, in ``old``'s place and
    with ``old``'s nullability and metadata; ``old`` (a primitive column) is gone. A ``Project`` commit of it
    swaps a column for another of a new type in one atomic step.

    Example:
        >>> s = lance.schema.LanceSchema.from_pyarrow(
        ...     pa.schema([("a", pa.int32()), ("b", pa.int8()), ("tmp", pa.int64())])
        ... )
        >>> [(f.name(), f.id()) for f in replace_field(s, "a", "tmp").fields()]
        [('a', 2), ('b', 1)]
    """
    metadata, fields = _schema_fields(schema)
    by_name = {f.name: f for f in fields if f.parent_id == -1}
    gone, kept = by_name[old], by_name[new]
    if any(f.parent_id in (gone.id, kept.id) for f in fields):
        raise ValueError(f"only primitive columns can be swapped, not {old!r} or {new!r}")
    swapped = SchemaField()
    swapped.CopyFrom(kept)
    swapped.name, swapped.nullable = old, gone.nullable
    swapped.metadata.clear()
    swapped.metadata.update(gone.metadata)
    out = [swapped if f is gone else f for f in fields if f is not kept]
    return _lance_schema(metadata, out)


def write_dataset_with_field_ids(
    rows: pa.Table,
    uri: str,
    ids: Sequence[int],
    *,
    data_storage_version: str,
    storage_options: dict[str, str] | None,
) -> None:
    """Create a dataset of ``rows`` at ``uri`` whose columns have field ids ``ids`` (in
    :func:`field_ids` order; a trailing column without one gets a new id), not the positions
    ``lance.write_dataset`` gives them.

    Lance renumbers the ids of a new dataset and refuses a commit that remaps them, but keeps
    those a ``Project`` names: so the columns are written in id order, an all-NULL placeholder
    at each unused id, then projected to their own order without the placeholders.

    Example:
        ``write_dataset_with_field_ids(rows, uri, (0, 3, 2), data_storage_version="2.1",
        storage_options=None)``
    """
    widths = [
        len(field_ids(lance.schema.LanceSchema.from_pyarrow(pa.schema([f])), [f.name]))
        for f in rows.schema
    ]
    top = max(ids, default=-1)
    ids = [*ids, *range(top + 1, top + 1 + sum(widths) - len(ids))]
    starts = list(itertools.accumulate(widths, initial=0))
    first = [ids[at] for at in starts[:-1]]
    for i, width in enumerate(widths):  # a nested column's ids: its own, then its children's
        if ids[starts[i] : starts[i + 1]] != list(range(first[i], first[i] + width)):
            raise ValueError(f"column {rows.schema.names[i]!r} has non-consecutive field ids")
    fields: list[pa.Field] = []
    arrays: list[pa.ChunkedArray | pa.Array] = []
    next_id = 0
    for i in sorted(range(len(first)), key=first.__getitem__):
        for unused in range(next_id, first[i]):
            fields.append(pa.field(f"{_PLACEHOLDER}{unused}", pa.bool_()))
            arrays.append(pa.nulls(rows.num_rows, pa.bool_()))
        fields.append(rows.schema.field(i))
        arrays.append(rows.column(i))
        next_id = first[i] + widths[i]
    written = lance.write_dataset(
        pa.Table.from_arrays(arrays, schema=pa.schema(fields)),
        uri,
        mode="create",
        data_storage_version=data_storage_version,  # type: ignore[arg-type]
        storage_options=storage_options,
    )
    metadata, written_fields = _schema_fields(written.lance_schema)
    by_id = {f.id: f for f in written_fields}
    own = [by_id[i] for i in ids]
    lance.LanceDataset.commit(
        uri,
        lance.LanceOperation.Project(_lance_schema(metadata, own)),
        read_version=written.version,
        storage_options=storage_options,
    )
