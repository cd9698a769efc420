"""The garbage collector: delete what no reader, recovering writer or fenced writer can need.

Per region, it removes:

* flushed generations already merged into the base table as of the *oldest retained* base
  version (a reader pinned to any retained version never lists them) and covered there by every
  base-table index (the indexed read plan reads the ones an index lags behind; an index whose
  catch-up is unknown keeps them all), both their directories and their manifest entries;
* WAL data entries at or below ``replay_after_wal_entry_position`` (their rows are in
  generations). Fence sentinels are never deleted: a fenced writer's next put lands exactly on
  one, and deleting it would let that put succeed where no one will ever replay it (the upstream
  warning about WAL GC weakening fencing);
* ``*_gen_*`` directories no manifest references, from failed or fenced flushes, once their
  generation is below the region's next generation (so no flush is still writing them);
* manifest versions older than the newest ``keep_manifest_versions``;
* on local disk, temporary files of puts a crash interrupted (older than a minute).

Lance writes base-table versions without fsync, and GC deletes on their word. So on local disk a
pass first fsyncs every base-table file written since the previous pass began (with a minute
of slack for clocks; the time is kept in ``_mem_wal/base_synced.json``): merges, index updates
and snapshots of any process, a merger that died right after its commit, commits made by Lance
directly. After reading which generations are collectable it syncs what was written since the
pass began, for a version committed meanwhile, and only then deletes.

Example:
    ``tbl.merge(); print(tbl.gc())``
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import CorruptWalEntryError, ObjectNotFoundError
from memwal_sql.index.catchup import index_coverage, min_caught_up
from memwal_sql.manifest import RegionManifestStore, commit_change
from memwal_sql.storage import layout
from memwal_sql.writer.wal import read_wal_entry, wal_positions

if TYPE_CHECKING:
    from memwal_sql.table import MemWalTable


_CLOCK_SLACK = 60.0


@dataclass
class GcResult:
    """What one GC pass deleted."""

    generations: dict[str, list[int]] = field(default_factory=dict)
    wal_entries: int = 0
    orphan_directories: int = 0
    manifest_versions: int = 0
    objects: int = 0


def collectable_generations(table: MemWalTable) -> dict[str, int]:
    """Per region, the newest generation no retained base version still needs: merged as of
    the oldest retained version, and covered there by every base-table index (the indexed read
    plan reads the generations an index has not caught up with)."""
    ds = table.dataset()
    oldest = table.dataset(min(v["version"] for v in ds.versions()))
    coverage = index_coverage(table.store, oldest)
    out = {}
    for rid, merged in table.merged_generations(oldest).items():
        caught_up = min_caught_up(coverage, rid)
        out[rid] = 0 if caught_up is None else min(merged, caught_up)
    return out


def _last_pass_began(table: MemWalTable) -> float:
    """When the previous pass began, less the slack; 0 (sync everything) without a marker."""
    try:
        return float(json.loads(table.store.get(layout.BASE_SYNCED))["started"]) - _CLOCK_SLACK
    except (ObjectNotFoundError, ValueError, KeyError, TypeError):
        return 0.0


def gc_table(
    table: MemWalTable,
    *,
    keep_manifest_versions: int = 10,
    base_versions_older_than: timedelta | None = None,
) -> GcResult:
    """One GC pass over every region (see the module docstring).

    Example:
        ``gc_table(tbl, base_versions_older_than=timedelta(hours=1)).generations``

    ``base_versions_older_than`` first removes base-table versions older than that (Lance's
    ``cleanup_old_versions``); otherwise generations wait until the base table's own retention
    drops the versions that still list them.
    """
    result = GcResult()
    local, started = table.store.is_local, time.time()
    if local:  # before the cleanup too: it may leave only the newest version
        table.store.sync_written_since(_last_pass_began(table))
    if base_versions_older_than is not None:
        table.dataset().cleanup_old_versions(older_than=base_versions_older_than)
    collectable = collectable_generations(table)
    if local:
        # A version committed while this pass ran may be the one just read: sync it too. The
        # marker comes after the syncs, so one that survives a power loss never claims more.
        table.store.sync_written_since(started)
        table.store.put(layout.BASE_SYNCED, json.dumps({"started": started}).encode())
    for rid in table.regions():
        _gc_region(table, rid, collectable.get(rid, 0), keep_manifest_versions, result)
    return result


def _gc_region(table: MemWalTable, rid: str, collectable: int, keep: int, result: GcResult) -> None:
    store = table.store
    manifests = RegionManifestStore(store, rid)
    manifest = manifests.latest()
    if manifest is None:
        return
    # 1. Merged generations: drop them from the manifest first (so no new reader lists them),
    #    then delete their files.
    dead = [g for g in manifest.flushed_generations if g.generation <= collectable]
    if dead:
        dead_paths = {g.path for g in dead}

        def drop(m: RegionManifest) -> bool:
            keep_gens = [g for g in m.flushed_generations if g.path not in dead_paths]
            if len(keep_gens) == len(m.flushed_generations):
                return False
            del m.flushed_generations[:]
            m.flushed_generations.extend(keep_gens)
            return True

        manifest = commit_change(manifests, drop) or manifests.latest()
        assert manifest is not None
        for g in dead:
            result.objects += store.delete_prefix(f"{layout.region_dir(rid)}/{g.path}/")
            result.generations.setdefault(rid, []).append(g.generation)
    # 2. Orphaned generation directories.
    referenced = {g.path for g in manifest.flushed_generations}
    for name in store.list_dirs(layout.region_dir(rid)):
        gen = layout.parse_generation_dir_name(name)
        if gen is None or name in referenced or gen >= manifest.current_generation:
            continue
        result.objects += store.delete_prefix(f"{layout.region_dir(rid)}/{name}/")
        result.orphan_directories += 1
    # 3. WAL data entries already in generations; sentinels stay.
    for pos in wal_positions(store, rid):
        if pos > manifest.replay_after_wal_entry_position:
            break
        try:
            entry = read_wal_entry(store, rid, pos)
        except CorruptWalEntryError:
            continue  # never delete what we cannot classify
        if entry is None or entry.is_sentinel:
            continue
        store.delete(layout.wal_entry_path(rid, pos))
        result.wal_entries += 1
        result.objects += 1
    # 4. Old manifest versions (the hint and the newest ``keep`` stay).
    versions = manifests.list_versions()
    for v in versions[:-keep] if keep > 0 else []:
        store.delete(layout.manifest_path(rid, v))
        result.manifest_versions += 1
        result.objects += 1
    # 5. Temporary files of crashed puts.
    for prefix in (layout.wal_dir(rid), layout.manifest_dir(rid)):
        result.objects += store.remove_temp_files(prefix)
