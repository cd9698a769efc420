"""Hand a MemWAL table to Lance 14's own readers (``LsmScanner``, ``LsmPointLookupPlanner``).

Lance's readers take explicit shard snapshots and do not consult the merge progress, so the
snapshots built here list, per region, only the flushed generations newer than what the base
table has merged (an older one would outrank newer base rows).

Example:
    ``LsmScanner.from_snapshots(tbl.dataset(), lance_shard_snapshots(tbl)).to_table()``
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lance.mem_wal import LsmScanner, ShardSnapshot

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState


def lance_shard_snapshots(table: TableState) -> list[ShardSnapshot]:
    """One Lance ``ShardSnapshot`` per region, from the region manifests."""
    merged = table.merged_generations()
    snaps = []
    for rid, m in table.region_manifests():
        snap = (
            ShardSnapshot(rid)
            .with_spec_id(m.region_spec_id)
            .with_current_generation(m.current_generation)
        )
        for g in m.flushed_generations:
            if g.generation > merged.get(rid, 0):
                snap = snap.with_sstable(g.generation, g.path)
        snaps.append(snap)
    return snaps


def lance_scanner(table: TableState) -> LsmScanner:
    """Lance's ``LsmScanner`` over the base table and every region's flushed generations."""
    return LsmScanner.from_snapshots(table.dataset(), lance_shard_snapshots(table))
