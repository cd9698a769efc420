"""Rows stranded in a WAL: find them, and fold them into generations when their writer is gone.

A writer that exits without ``close()`` (killed, or released) leaves its acknowledged writes
only in its region's WAL. Readers replay them on every read, and nothing merges them until a
writer claims the region again. So a maintenance pass takes such a region over: one whose WAL
holds data entries after the manifest's replay position (:func:`wal_backlog`) and whose WAL and
manifest directories saw no write for ``recover_regions_idle_for`` (30 minutes). It claims the
region as any new writer does, which fences whatever writer may be left (its next write fails
and loses nothing acknowledged), replays, flushes a generation and releases the region; the
merge of the same pass then takes the rows in.

"Gone" is judged from storage, the only thing every process sees: the newest WAL entry or
manifest version is older than the idle time, so a live writer that writes at least that often
is never fenced, however slowly it writes. A writer holding unflushed rows that does not write
for that long is taken for gone. :func:`flush_regions` (``memwal flush``) does the same at once,
without waiting.

Example:
    ``recover_regions(tbl, MaintenanceConfig()).recovered  # {"5f1c...": 1417}``
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import CorruptWalEntryError, UnknownRegionError, WriterFencedError
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.formats.wal import decode_wal_runs, read_wal_entry
from memwal_sql.maintenance.config import MaintenanceConfig
from memwal_sql.storage import ObjectStore, layout

if TYPE_CHECKING:
    from collections.abc import Sequence

    from memwal_sql.table_state import TableState


@dataclass(frozen=True)
class WalBacklog:
    """A region's WAL entries after its manifest's replay position (not in any generation):
    data entries and their rows (fence sentinels not counted), when the region was last
    written (its newest WAL entry or manifest version, seconds since the epoch; 0: never), and
    its newest WAL entry's position (0: none; GC's deletions do not lower it)."""

    entries: int
    rows: int
    last_write: float
    newest_position: int = 0


@dataclass
class RecoveryResult:
    """What a recovery did: per region taken over, the WAL rows it flushed; per region whose
    WAL has entries past its replay position but was written too recently to take over, how
    long (seconds) it has been idle."""

    recovered: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)


def _now() -> float:
    """The time idleness is measured against (a function so tests can move it on)."""
    return time.time()


def _activity(store: ObjectStore, rid: str) -> tuple[list[int], float]:
    """The region's WAL positions, and its newest WAL entry or manifest version's write time:
    two listings, nothing read."""
    positions, last = [], 0.0
    for meta in store.list(f"{layout.wal_dir(rid)}/"):
        try:
            positions.append(layout.parse_bitrev64(meta.path))
        except ValueError:
            continue  # not an entry (a set-aside file)
        last = max(last, meta.last_modified)
    for meta in store.list(f"{layout.manifest_dir(rid)}/"):
        last = max(last, meta.last_modified)
    return sorted(positions), last


def _count(store: ObjectStore, rid: str, positions: list[int]) -> tuple[int, int]:
    """Data entries and rows at ``positions`` (consecutive), read in one batch of gets."""
    if not positions:
        return 0, 0
    first = positions[0]
    datas = store.get_many([layout.wal_entry_path(rid, p) for p in range(first, positions[-1] + 1)])
    entries = rows = 0
    runs = decode_wal_runs(datas, first)
    position = first
    for run in runs:
        if run is None:  # one position decoded alone: missing, damaged or Lance's
            try:
                entry = read_wal_entry(store, rid, position)
            except CorruptWalEntryError:
                entry = None  # the claim reports it
            if entry is not None and not entry.is_sentinel:
                entries, rows = entries + 1, rows + entry.num_rows
            position += 1
            continue
        if not run.is_sentinel:
            entries += run.count
            rows += sum(b.num_rows for b in run.batches)
        position += run.count
    return entries, rows


def wal_backlog(store: ObjectStore, rid: str, manifest: RegionManifest | None = None) -> WalBacklog:
    """What ``rid``'s WAL holds beyond its flushed generations (see :class:`WalBacklog`).

    Example:
        ``wal_backlog(tbl.store, rid).rows  # rows a claim would replay``
    """
    if manifest is None:
        manifest = RegionManifestStore(store, rid).latest()
    positions, last = _activity(store, rid)
    after = manifest.replay_after_wal_entry_position if manifest is not None else 0
    entries, rows = _count(store, rid, [p for p in positions if p > after])
    # The replay position stands in for entries GC deleted, so the position never goes back.
    return WalBacklog(entries, rows, last, max([after, *positions[-1:]]))


def flush_region(table: TableState, rid: str) -> None:
    """Claim ``rid`` (fencing any writer of it), replay its WAL, flush and release it.

    Example:
        ``flush_region(tbl, rid)  # its WAL rows are now a generation, ready to merge``
    """
    table.writer(region_id=rid).close()


def recover_regions(
    table: TableState,
    config: MaintenanceConfig | None = None,
    *,
    regions: Sequence[str] | None = None,
    force: bool = False,
) -> RecoveryResult:
    """Flush the WAL rows of every region (or of ``regions``) whose writer is gone: unflushed
    entries and no write for ``config.recover_regions_idle_for``. ``force`` flushes every region
    with unflushed entries at once, fencing its writer if it has one.

    Example:
        ``recover_regions(tbl, force=True).recovered  # what `memwal flush` does``
    """
    config = config or MaintenanceConfig()
    idle = config.recover_regions_idle_for
    result = RecoveryResult()
    if idle is None and not force:
        return result
    now = _now()
    for rid in regions if regions is not None else table.regions():
        rid = layout.region_id_of(rid)
        manifest = RegionManifestStore(table.store, rid).latest()
        if manifest is None:
            if regions is not None:
                raise UnknownRegionError(
                    f"no region {rid} in {table.uri}; `memwal inspect` lists its regions"
                )
            continue
        positions, last = _activity(table.store, rid)
        pending = [p for p in positions if p > manifest.replay_after_wal_entry_position]
        if not pending:
            continue
        quiet = now - last
        if not force and idle is not None and quiet < idle.total_seconds():
            result.waiting[rid] = round(quiet, 3)  # its writer's to flush: not read
            continue
        entries, rows = _count(table.store, rid, pending)
        if not entries:
            continue  # only the sentinel of the last claim
        try:
            flush_region(table, rid)
        except WriterFencedError:
            continue  # another maintainer (or a writer) claimed it meanwhile: it replays them
        result.recovered[rid] = rows
    return result
