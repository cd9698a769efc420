"""Snapshot tokens: a pinned snapshot as a short string that survives processes.

A pinned snapshot is the base table's version plus, per region, where its writes stood: the
flushed generations it reads (those newer than what that base version has merged), the WAL
position they cover, and the last WAL entry it reads. Everything it names stays readable while
garbage collection keeps the base version (``maintenance/gc.py``), so the token is all a later
reader needs. The token is ``mw1.`` and the ``SnapshotToken`` protobuf, zlib-compressed and
base64url-encoded: a few dozen bytes per region.

Example:
    >>> cut = SnapshotCut(7, (RegionCut("00000000-0000-0000-0000-000000000001", (3,), 10, 12, 4),), 0)
    >>> decode_token(cut.token) == cut
    True
"""

from __future__ import annotations

import base64
import binascii
import uuid
import zlib
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from memwal_sql._proto.memwal_pb2 import RegionCut as RegionCutProto
from memwal_sql._proto.memwal_pb2 import SnapshotToken
from memwal_sql.errors import InvalidSnapshotError

_PREFIX = "mw1."


@dataclass(frozen=True)
class RegionCut:
    """Where one region's writes stood when a snapshot was taken."""

    region_id: str
    generations: tuple[int, ...]
    """The flushed generations the snapshot reads: newer than the base version's merged one."""
    flushed_position: int
    """The WAL position the region's flushed generations cover."""
    wal_position: int
    """The last WAL entry the snapshot reads; entries after ``flushed_position`` up to it are
    its unflushed rows (none when equal)."""
    memtable_generation: int
    """The generation those unflushed rows belong to."""


@dataclass(frozen=True)
class SnapshotCut:
    """A pinned snapshot's content: the base version and each region's :class:`RegionCut`
    (a region absent had no WAL entry then)."""

    base_version: int
    regions: tuple[RegionCut, ...]
    taken_at_millis: int

    @property
    def token(self) -> str:
        """The snapshot as a string (``mw1.`` ...)."""
        msg = SnapshotToken(base_version=self.base_version, taken_at_millis=self.taken_at_millis)
        for r in self.regions:
            msg.regions.append(
                RegionCutProto(
                    region_id=uuid.UUID(r.region_id).bytes,
                    generations=r.generations,
                    flushed_position=r.flushed_position,
                    wal_position=r.wal_position,
                    memtable_generation=r.memtable_generation,
                )
            )
        packed = zlib.compress(msg.SerializeToString(), 9)
        return _PREFIX + base64.urlsafe_b64encode(packed).decode().rstrip("=")

    def region(self, region_id: str) -> RegionCut | None:
        """The cut of ``region_id``, or None if the region had no WAL entry then."""
        return next((r for r in self.regions if r.region_id == region_id), None)

    def wal_position_of(self, region_id: str) -> int:
        """The last WAL position the snapshot reads of ``region_id`` (0: a region it has not)."""
        cut = self.region(region_id)
        return 0 if cut is None else cut.wal_position


def decode_token(token: str) -> SnapshotCut:
    """The :class:`SnapshotCut` a token (from :attr:`SnapshotCut.token`) stands for.

    Raises :class:`~memwal_sql.errors.InvalidSnapshotError` for anything else.
    """
    if not isinstance(token, str) or not token.startswith(_PREFIX):
        raise InvalidSnapshotError(
            f"not a snapshot token: {str(token)[:40]!r} (tokens come from tbl.snapshot().token "
            "and start with 'mw1.')"
        )
    body = token[len(_PREFIX) :]
    try:
        raw = zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        msg = SnapshotToken.FromString(raw)
        regions = tuple(
            RegionCut(
                str(uuid.UUID(bytes=r.region_id)),
                tuple(r.generations),
                r.flushed_position,
                r.wal_position,
                r.memtable_generation,
            )
            for r in msg.regions
        )
    except (binascii.Error, zlib.error, DecodeError, ValueError) as e:
        raise InvalidSnapshotError(f"a damaged snapshot token ({e}): {token[:40]!r}...") from e
    return SnapshotCut(msg.base_version, regions, msg.taken_at_millis)
