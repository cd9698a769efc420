"""What ``memwal inspect`` reports: per region its generations, merge lag, index catch-up,
storage use, and the WAL rows no generation holds yet.

Everything comes from listings of the region's directory, its latest manifest, the base
table's MemWAL index details and index metadata, and the WAL entries after the manifest's
replay position (what a reader replays anyway); nothing else is read.

Example:
    ``for r in region_status(tbl): print(r.region_id, r.unmerged_rows, r.storage_bytes)``
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from memwal_sql.errors import CorruptManifestError
from memwal_sql.formats.index_catchup import index_coverage
from memwal_sql.formats.region_manifest import RegionManifestStore, check_not_behind_index
from memwal_sql.maintenance.recovery import wal_backlog
from memwal_sql.storage import layout

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState


@dataclass
class RegionStatus:
    """One region as maintenance sees it."""

    region_id: str
    manifest_version: int
    writer_epoch: int
    current_generation: int
    flushed_generations: list[int]
    merged_generation: int
    unmerged_generations: int
    unmerged_rows: int
    merge_lag_seconds: float  # age of the oldest unmerged generation (0: nothing to merge)
    replay_after_wal_entry_position: int
    wal_entries: int
    # WAL data entries after the replay position, and their rows: in no generation yet
    unflushed_wal_entries: int = 0
    unflushed_rows: int = 0
    wal_position: int = 0  # the newest WAL entry's position (0: none)
    idle_seconds: float = 0.0  # since the region's last WAL entry or manifest version
    # index name -> newest generation of the region it covers (None: unknown)
    index_catchup: dict[str, int | None] = field(default_factory=dict)
    storage_bytes: dict[str, int] = field(default_factory=dict)  # wal, generations, manifests
    problem: str | None = None  # lost or damaged state that refuses reads and writes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def index_catchup(table: TableState) -> dict[str, dict[str, int] | None]:
    """Per base-table index, the newest generation of each region it covers (None: unknown,
    see :mod:`memwal_sql.formats.index_catchup`).

    Example:
        ``index_catchup(tbl)  # {"id_pk_btree": {"<region id>": 3}}``
    """
    return {
        c.name: None if c.caught_up is None else dict(c.caught_up)
        for c in index_coverage(table.store, table.dataset())
    }


def region_status(table: TableState) -> list[RegionStatus]:
    """The status of every region of ``table``, in region-id order."""
    merged = table.merged_generations()
    catchup = index_catchup(table)
    now = time.time()
    out = []
    for rid in sorted(set(table.regions()) | set(merged)):
        done = merged.get(rid, 0)
        try:
            m = RegionManifestStore(table.store, rid).latest()
            check_not_behind_index(rid, m, done)
        except CorruptManifestError as e:
            out.append(_damaged(rid, done, str(e)))
            continue
        if m is None:
            continue
        unmerged = [g for g in m.flushed_generations if g.generation > done]
        prefix = f"{layout.region_dir(rid)}/"
        storage = {"wal": 0, "generations": 0, "manifests": 0, "other": 0}
        wal_entries = 0
        oldest_unmerged = now
        unmerged_dirs = {g.path for g in unmerged}
        backlog = wal_backlog(table.store, rid, m)
        for meta in table.store.list(prefix):
            top = meta.path[len(prefix) :].split("/", 1)[0]
            if top == "wal":
                storage["wal"] += meta.size
                wal_entries += 1
            elif top == "manifest":
                storage["manifests"] += meta.size
            elif layout.parse_generation_dir_name(top) is not None:
                storage["generations"] += meta.size
                if top in unmerged_dirs:
                    oldest_unmerged = min(oldest_unmerged, meta.last_modified)
            else:
                storage["other"] += meta.size
        out.append(
            RegionStatus(
                region_id=rid,
                manifest_version=m.version,
                writer_epoch=m.writer_epoch,
                current_generation=m.current_generation,
                flushed_generations=[g.generation for g in m.flushed_generations],
                merged_generation=done,
                unmerged_generations=len(unmerged),
                unmerged_rows=sum(g.physical_rows for g in unmerged),
                merge_lag_seconds=round(now - oldest_unmerged, 3) if unmerged else 0.0,
                replay_after_wal_entry_position=m.replay_after_wal_entry_position,
                wal_entries=wal_entries,
                unflushed_wal_entries=backlog.entries,
                unflushed_rows=backlog.rows,
                wal_position=backlog.newest_position,
                idle_seconds=round(max(0.0, now - backlog.last_write), 3),
                index_catchup={
                    name: None if gens is None else gens.get(rid, 0)
                    for name, gens in catchup.items()
                },
                storage_bytes=storage,
            )
        )
    return out


def _damaged(region_id: str, merged_generation: int, problem: str) -> RegionStatus:
    return RegionStatus(
        region_id=region_id,
        manifest_version=0,
        writer_epoch=0,
        current_generation=0,
        flushed_generations=[],
        merged_generation=merged_generation,
        unmerged_generations=0,
        unmerged_rows=0,
        merge_lag_seconds=0.0,
        replay_after_wal_entry_position=0,
        wal_entries=0,
        problem=problem,
    )
