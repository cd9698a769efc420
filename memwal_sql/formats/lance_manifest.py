"""Read index metadata straight from the base table's Lance manifest.

pylance's ``mem_wal_index_details()`` leaves out ``merged_generations`` (Lance's
``compacted_sstables``), which readers need to skip generations already in the base table; and
its index descriptions leave out each segment's details and files, which a commit of the
segments must repeat (:func:`cover_fragments`). The manifest file ends in a footer (``i64
manifest offset, u16, u16, "LANC"``); at the offset sits a u32-length-prefixed ``Manifest``
message whose field 6 is the offset of a u32-length-prefixed ``IndexSection`` (field 1: repeated
``IndexMetadata``: uuid = 1, fields = 2, name = 3, dataset_version = 4, details = 6 as a
protobuf ``Any``, index_version = 7, base_id = 9, files = 10). Only those fields are decoded
here, with a minimal wire-format reader.
"""

from __future__ import annotations

import struct
import uuid as uuid_module
from collections.abc import Iterable, Iterator
from typing import Any

import lance
from google.protobuf.message import DecodeError
from lance.dataset import Index, IndexFile

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails
from memwal_sql.errors import CorruptManifestError
from memwal_sql.storage import ObjectStore

#: The MemWAL index's name in the base table's manifest (Lance 14's, and the spec's).
INDEX_NAME = "__lance_mem_wal"

_MAGIC = b"LANC"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of every top-level field of a message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = _varint(buf, pos)
            yield num, wt, val
        elif wt == 1:
            yield num, wt, struct.unpack_from("<Q", buf, pos)[0]
            pos += 8
        elif wt == 2:
            n, pos = _varint(buf, pos)
            yield num, wt, buf[pos : pos + n]
            pos += n
        elif wt == 5:
            yield num, wt, struct.unpack_from("<I", buf, pos)[0]
            pos += 4
        else:
            raise CorruptManifestError(f"unsupported protobuf wire type {wt}")


def _index_metadata(store: ObjectStore, version: int) -> Iterator[dict[int, list[int | bytes]]]:
    """Every ``IndexMetadata`` of base version ``version``: field number -> its values."""
    path = f"_versions/{(1 << 64) - 1 - version}.manifest"
    try:
        data = store.get(path)
        if data[-4:] != _MAGIC:
            raise CorruptManifestError(f"{path} has no Lance footer")
        (offset,) = struct.unpack_from("<q", data, len(data) - 16)
        (length,) = struct.unpack_from("<I", data, offset)
        manifest = data[offset + 4 : offset + 4 + length]
        section_at = next((v for n, _, v in _fields(manifest) if n == 6), None)
        if section_at is None:
            return
        assert isinstance(section_at, int)
        (length,) = struct.unpack_from("<I", data, section_at)
        section = data[section_at + 4 : section_at + 4 + length]
        metas = [m for num, _, m in _fields(section) if num == 1]
        out = []
        for meta in metas:
            assert isinstance(meta, bytes)
            fields: dict[int, list[int | bytes]] = {}
            for n, _, v in _fields(meta):
                fields.setdefault(n, []).append(v)
            out.append(fields)
    except (struct.error, IndexError, ValueError, AssertionError) as e:
        raise CorruptManifestError(f"cannot decode {path}: {e}") from e
    yield from out


def _message(value: int | bytes) -> dict[int, int | bytes]:
    """An embedded message's fields (the last value of each)."""
    assert isinstance(value, bytes)
    return {n: v for n, _, v in _fields(value)}


def _details(fields: dict[int, list[int | bytes]]) -> tuple[str, bytes]:
    """An index's details (field 6, a protobuf ``Any``) as (type url, value)."""
    any_msg = _message(fields.get(6, [b""])[0])
    type_url, value = any_msg.get(1, b""), any_msg.get(2, b"")
    assert isinstance(type_url, bytes) and isinstance(value, bytes)
    return type_url.decode(), value


def _files(fields: dict[int, list[int | bytes]]) -> list[IndexFile]:
    """An index's files (field 10: path = 1, size in bytes = 2)."""
    out = []
    for raw in fields.get(10, []):
        f = _message(raw)
        path, size = f.get(1, b""), f.get(2, 0)
        assert isinstance(path, bytes) and isinstance(size, int)
        out.append(IndexFile(path.decode(), size))
    return out


def _uuid(fields: dict[int, list[int | bytes]]) -> str:
    """An index's uuid (field 1: a ``UUID`` message holding 16 bytes in its field 1)."""
    raw = _message(fields[1][0]).get(1, b"")
    assert isinstance(raw, bytes)
    return str(uuid_module.UUID(bytes=raw))


def read_mem_wal_details(store: ObjectStore, version: int) -> MemWalIndexDetails | None:
    """The MemWAL index details of base version ``version``, or None if it has no MemWAL index.

    Example:
        ``read_mem_wal_details(tbl.store, tbl.dataset().version)``
    """
    for fields in _index_metadata(store, version):
        if fields.get(3) == [INDEX_NAME.encode()]:
            details = MemWalIndexDetails()
            try:
                details.ParseFromString(_details(fields)[1])
            except DecodeError as e:
                raise CorruptManifestError(f"cannot decode the MemWAL index details: {e}") from e
            return details
    return None


def cover_fragments(
    ds: lance.LanceDataset, store: ObjectStore, name: str, fragment_ids: Iterable[int]
) -> None:
    """Commit index ``name`` as covering ``fragment_ids`` too, adding no rows to it: for
    fragments whose indexed column holds no value at all (every vector NULL), which no search
    can find through an index anyway.

    Lance 14's ``optimize_indices`` cannot index such fragments: an IVF index over them looks
    for partition files it never wrote ("Not found: .../ivf_1.lance"), and the fragments stay
    uncovered for good. Here every segment of the index is committed again as it is, the
    newest with the fragments added to its coverage (a commit that loses a race to another
    one raises Lance's retryable conflict).

    Example:
        ``cover_fragments(tbl.dataset(), tbl.store, "vec_idx", [7])``
    """
    described = next(d for d in ds.describe_indices() if d.name == name)
    raw = {_uuid(f): f for f in _index_metadata(store, ds.version) if f.get(3) == [name.encode()]}
    described_segments = described.segments  # a new list of new objects on every access
    newest = max(described_segments, key=lambda s: s.dataset_version_at_last_update)
    segments: list[Any] = []
    for segment in described_segments:
        covered = segment.fragment_ids
        if segment is newest:
            covered = covered.union(fragment_ids)
        segments.append(
            Index(
                uuid=segment.uuid,
                name=name,
                fields=list(described.fields),
                dataset_version=segment.dataset_version_at_last_update,
                fragment_ids=covered,
                index_version=segment.index_version,
                base_id=segment.base_id,
                files=_files(raw[segment.uuid]),
                index_details=_details(raw[segment.uuid]),
            )
        )
    ds.commit_existing_index_segments(name, described.field_names[0], segments)
