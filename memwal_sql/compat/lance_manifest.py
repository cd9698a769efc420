"""Read the MemWAL index details straight from the base table's Lance manifest.

pylance's ``mem_wal_index_details()`` leaves out ``merged_generations`` (Lance's
``compacted_sstables``), which readers need to skip generations already in the base table. The
manifest file ends in a footer (``i64 manifest offset, u16, u16, "LANC"``); at the offset sits a
u32-length-prefixed ``Manifest`` message whose field 6 is the offset of a u32-length-prefixed
``IndexSection`` (field 1: repeated ``IndexMetadata``, name = 3, details = 6 as a protobuf
``Any``). Only those fields are decoded here, with a minimal wire-format reader.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails
from memwal_sql.errors import CorruptManifestError
from memwal_sql.index.details import INDEX_NAME
from memwal_sql.storage import ObjectStore

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


def read_mem_wal_details(store: ObjectStore, version: int) -> MemWalIndexDetails | None:
    """The MemWAL index details of base version ``version``, or None if it has no MemWAL index.

    Example:
        ``read_mem_wal_details(tbl.store, tbl.dataset().version)``
    """
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
            return None
        assert isinstance(section_at, int)
        (length,) = struct.unpack_from("<I", data, section_at)
        section = data[section_at + 4 : section_at + 4 + length]
        for num, _, meta in _fields(section):
            if num != 1:
                continue
            assert isinstance(meta, bytes)
            fields = {n: v for n, _, v in _fields(meta)}
            if fields.get(3) != INDEX_NAME.encode():
                continue
            any_msg = {n: v for n, _, v in _fields(fields.get(6, b""))}  # type: ignore[arg-type]
            details = MemWalIndexDetails()
            details.ParseFromString(any_msg.get(2, b""))
            return details
    except (struct.error, IndexError, ValueError) as e:
        raise CorruptManifestError(f"cannot decode {path}: {e}") from e
    return None
