"""Object names of a MemWAL table, in one place.

Layout under the base table's root (the seed spec's "Storage Layout", with Lance 14's choices where
the spec is silent or contradicts itself)::

    _mem_wal/{region_id}/manifest/{bitrev64(version)}.binpb
    _mem_wal/{region_id}/manifest/version_hint.json
    _mem_wal/{region_id}/wal/{bitrev64(position)}.arrow
    _mem_wal/{region_id}/{hex8}_gen_{generation}/
    _mem_wal/{region_id}/torn_wal/{bitrev64(position)}.{ns}.arrow  (memwal-sql: set aside)
    _mem_wal/merged_tombstones/  (memwal-sql: a Lance dataset, tables with a sequence column)

Bit-reversed names spread consecutive numbers over the key space of an object store (no hot
prefix) while staying parseable.

Example:
    >>> bitrev64(5)[:4]
    '1010'
    >>> parse_bitrev64(bitrev64(5))
    5
"""

from __future__ import annotations

import re
import secrets
import uuid

from memwal_sql.errors import InvalidInputError

MEM_WAL_DIR = "_mem_wal"
VERSIONS_DIR = "_versions"  # Lance's manifests of the base table
BASE_SYNCED = f"{MEM_WAL_DIR}/base_synced.json"  # GC: when base-table files were last fsynced
MERGED_TOMBSTONES = f"{MEM_WAL_DIR}/merged_tombstones"  # a sequence table's merged deletes
SNAPSHOT_TAGS = f"{MEM_WAL_DIR}/_tags"  # tagged pinned snapshots: {name}.json
WAL_SUFFIX = ".arrow"  # Lance 14 ignores `.lance` WAL entries and rejects IPC *file* format
MANIFEST_SUFFIX = ".binpb"
VERSION_HINT = "version_hint.json"

_GEN_DIR = re.compile(r"^([0-9a-f]{8})_gen_(\d+)$")


def region_id_of(region_id: object) -> str:
    """``region_id`` in its canonical form (a region id is a UUID);
    :class:`~memwal_sql.errors.InvalidInputError` if it is none (it names a directory).

    Example:
        >>> region_id_of("0B7C0000000000000000000000000000")
        '0b7c0000-0000-0000-0000-000000000000'
    """
    try:
        return str(uuid.UUID(str(region_id)))
    except ValueError:
        raise InvalidInputError(
            f"region id {region_id!r} is not a UUID; `memwal inspect` lists the table's regions"
        ) from None


def wal_position_of(position: object) -> int:
    """``position`` if it is a WAL position (an integer from 1 to 2**64 - 1);
    :class:`~memwal_sql.errors.InvalidInputError` otherwise.

    Example:
        >>> wal_position_of(17)
        17
    """
    if isinstance(position, bool) or not isinstance(position, int) or not 0 < position < 1 << 64:
        raise InvalidInputError(
            f"WAL position {position!r} is out of range: positions run from 1 to 2**64 - 1; "
            "`memwal inspect` shows each region's positions"
        )
    return position


def bitrev64(n: int) -> str:
    """Return the 64-character bit-reversed binary name of ``n``.

    Example:
        >>> bitrev64(1)
        '1000000000000000000000000000000000000000000000000000000000000000'
    """
    if not 0 <= n < 1 << 64:
        raise ValueError(f"{n} does not fit in 64 bits")
    return format(n, "064b")[::-1]


def parse_bitrev64(name: str) -> int:
    """Invert :func:`bitrev64`; accepts a name with or without a suffix.

    Example:
        >>> parse_bitrev64(bitrev64(42) + ".arrow")
        42
    """
    stem = name.rsplit("/", 1)[-1].split(".", 1)[0]
    if len(stem) != 64 or set(stem) - {"0", "1"}:
        raise ValueError(f"not a bit-reversed name: {name!r}")
    return int(stem[::-1], 2)


def region_dir(region_id: str) -> str:
    """Directory of one region, relative to the table root."""
    return f"{MEM_WAL_DIR}/{region_id}"


def manifest_dir(region_id: str) -> str:
    return f"{region_dir(region_id)}/manifest"


def manifest_path(region_id: str, version: int) -> str:
    """Path of region manifest ``version`` (versions start at 1)."""
    return f"{manifest_dir(region_id)}/{bitrev64(version)}{MANIFEST_SUFFIX}"


def version_hint_path(region_id: str) -> str:
    return f"{manifest_dir(region_id)}/{VERSION_HINT}"


def wal_dir(region_id: str) -> str:
    return f"{region_dir(region_id)}/wal"


def torn_wal_entry_path(region_id: str, position: int, moved_ns: int) -> str:
    """Where a torn WAL entry is kept once moved out of the WAL (outside ``wal/``, so that
    neither memwal-sql nor Lance reads it as an entry)."""
    return f"{region_dir(region_id)}/torn_wal/{bitrev64(position)}.{moved_ns}{WAL_SUFFIX}"


def wal_entry_path(region_id: str, position: int) -> str:
    """Path of the WAL entry at 1-based ``position`` (0 means "no entry", as in Lance 14)."""
    if position < 1:
        raise ValueError("WAL positions are 1-based")
    return f"{wal_dir(region_id)}/{bitrev64(position)}{WAL_SUFFIX}"


def new_generation_dir_name(generation: int) -> str:
    """A fresh ``{hex8}_gen_{n}`` name; every flush attempt gets its own, so a retry never
    collides with the debris of a failed one."""
    return f"{secrets.token_hex(4)}_gen_{generation}"


def parse_generation_dir_name(name: str) -> int | None:
    """Generation number of a ``{hex8}_gen_{n}`` directory name, or None for other names."""
    m = _GEN_DIR.match(name.rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(2)) if m else None
