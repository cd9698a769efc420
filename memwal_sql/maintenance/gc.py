"""The garbage collector: delete what no reader, recovering writer or fenced writer can need.

Per region, it removes:

* flushed generations already merged into the base table as of the *oldest retained* base
  version (a reader pinned to any retained version never lists them) and covered there by every
  base-table index (the indexed read plan reads the ones an index lags behind; an index whose
  catch-up is unknown keeps them all), both their directories and their manifest entries;
* WAL data entries whose rows are in a generation collected above (the spec keeps an entry
  until the generation holding its rows is merged: GC section, Appendix 1 point 3). Each
  generation records, at flush, the last WAL position it holds; for a generation without that
  record (one Lance wrote) entries go only once every flushed generation of the region is
  collectable. Fence sentinels are never deleted: a fenced writer's next put lands exactly on
  one, and deleting it would let that put succeed where no one will ever replay it (the upstream
  warning about WAL GC weakening fencing);
* ``*_gen_*`` directories no manifest references, from failed or fenced flushes, once their
  generation is below the region's next generation (so no flush is still writing them);
* manifest versions older than the newest ``keep_manifest_versions``;
* base-table versions superseded longer ago than ``base_versions_older_than`` (an hour), first,
  through Lance's ``cleanup_old_versions``: counted from when the next version was committed,
  so a read that began on the latest version has the whole retention to finish, however old
  that version was. Tagged versions stay (a tag pins a version for as long as it exists);
* on local disk, temporary files of puts a crash interrupted (older than a minute);
* on a table with a sequence column, the merged deletes' small fragments, compacted, and their
  versions superseded longer ago than ``base_versions_older_than``.

Lance writes base-table versions without fsync, and GC deletes on their word. So on local disk a
pass first fsyncs every base-table file written since the previous pass began (with a minute
of slack for clocks; the time is kept in ``_mem_wal/base_synced.json``): merges, index updates
and snapshots of any process, a merger that died right after its commit, commits made by Lance
directly. After reading which generations are collectable it syncs what was written since the
pass began, for a version committed meanwhile, and only then deletes.

Every pass also says what it kept and why (``GcResult.kept``), and logs it on the
``memwal_sql`` logger.

Example:
    ``tbl.merge(); print(tbl.gc().summary())``
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import TYPE_CHECKING

import lance

from memwal_sql._proto.memwal_pb2 import FlushedGeneration, RegionManifest
from memwal_sql.compat.lance import is_not_found, is_version_gone
from memwal_sql.errors import (
    CommitConflictError,
    CorruptWalEntryError,
    MemWalError,
    ObjectNotFoundError,
)
from memwal_sql.formats.index_catchup import index_coverage, min_caught_up
from memwal_sql.formats.region_manifest import RegionManifestStore, commit_change
from memwal_sql.formats.snapshot_tags import read_tags
from memwal_sql.formats.snapshot_token import decode_token
from memwal_sql.formats.wal import read_wal_entry, wal_positions
from memwal_sql.maintenance.config import MaintenanceConfig
from memwal_sql.storage import ObjectStore, layout
from memwal_sql.storage.checksums import recorded_wal_entry_position

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState


_CLOCK_SLACK = 60.0
_VERSION_ATTEMPTS = 5
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcKept:
    """Something a GC pass left in place, and why."""

    region_id: str
    what: str
    reason: str


@dataclass
class GcResult:
    """What one GC pass deleted, and what it kept and why.

    Example:
        ``print(tbl.gc().summary())``
    """

    generations: dict[str, list[int]] = field(default_factory=dict)
    wal_entries: int = 0
    orphan_directories: int = 0
    manifest_versions: int = 0
    objects: int = 0
    merged_tombstone_fragments: int = 0  # compacted away (tables with a sequence column)
    kept: list[GcKept] = field(default_factory=list)

    def summary(self) -> str:
        """What was deleted, then each thing kept with its reason, one per line."""
        lines = [
            f"deleted {sum(len(g) for g in self.generations.values())} generation(s), "
            f"{self.wal_entries} WAL entries, {self.orphan_directories} orphan directories, "
            f"{self.manifest_versions} manifest versions ({self.objects} objects)"
            + (
                f"; compacted {self.merged_tombstone_fragments} fragments of merged deletes"
                if self.merged_tombstone_fragments
                else ""
            )
        ]
        lines += [f"kept {k.what} of region {k.region_id}: {k.reason}" for k in self.kept]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Collectable:
    """Per region: the newest generation GC may delete, and what holds back the next one."""

    generation: int
    merged_latest: int  # merge progress at the newest base version
    merged_oldest: int  # ... at the oldest retained one
    oldest_version: int
    lagging_index: str | None  # an index whose catch-up holds generations back
    index_caught_up: int | None


def _collectable(table: TableState) -> dict[str, _Collectable]:
    """Per region, what GC may delete, read from the latest and the oldest retained version.

    Another maintainer's cleanup of old versions may remove the oldest between its listing and
    its reading: a lost race, so it is read again from a new listing (a retryable
    :class:`CommitConflictError` if that keeps happening).
    """
    for _ in range(_VERSION_ATTEMPTS):
        try:
            return _collectable_once(table)
        except (ValueError, OSError, MemWalError) as e:
            if not is_version_gone(e):
                raise
    raise CommitConflictError(
        f"other maintainers' cleanups removed the oldest base version of {table.uri} "
        f"{_VERSION_ATTEMPTS} times while this gc pass read it; run it again"
    )


def _collectable_once(table: TableState) -> dict[str, _Collectable]:
    ds = table.dataset()
    # A Lance tag pins a base version for Lance's readers of the base table alone; MemWAL reads
    # start from the latest version or a pinned snapshot, so untagged retained versions and
    # the versions of tagged snapshots (formats/snapshot_tags.py) hold generations back.
    tagged = {t["version"] for t in ds.tags.list().values()}
    pinned = {decode_token(t).base_version for t in read_tags(table.store).values()}
    oldest_version = min(
        [
            v["version"]
            for v in ds.versions()
            if v["version"] not in tagged or v["version"] in pinned
        ]
        + [ds.version]
    )
    oldest = table.dataset(oldest_version)
    coverage = index_coverage(table.store, oldest)
    latest = table.merged_generations(ds)
    out = {}
    merged_oldest = table.merged_generations(oldest)
    for rid in latest.keys() | merged_oldest.keys():
        merged = merged_oldest.get(rid, 0)
        caught_up = min_caught_up(coverage, rid)
        lagging = next(
            (c.name for c in coverage if c.caught_up_generation(rid) in (None, caught_up)), None
        )
        out[rid] = _Collectable(
            generation=0 if caught_up is None else min(merged, caught_up),
            merged_latest=latest.get(rid, 0),
            merged_oldest=merged,
            oldest_version=oldest_version,
            lagging_index=lagging if caught_up is None or caught_up < merged else None,
            index_caught_up=caught_up,
        )
    return out


def collectable_generations(table: TableState) -> dict[str, int]:
    """Per region, the newest generation no retained base version still needs: merged as of
    the oldest retained version, and covered there by every base-table index (the indexed read
    plan reads the generations an index has not caught up with).

    Example:
        ``collectable_generations(tbl)  # {"5f1c...": 3}``
    """
    return {rid: c.generation for rid, c in _collectable(table).items()}


def _now() -> float:
    """The time retention is measured against (a function so tests can move it on)."""
    return time.time()


def _version_times(ds: lance.LanceDataset) -> list[tuple[int, float]]:
    """Each base version and when it was committed, oldest first (Lance's naive timestamps are
    local time, as ``timestamp()`` reads them)."""
    out = []
    for v in ds.versions():
        version, stamp = v["version"], v["timestamp"]
        assert isinstance(version, int) and isinstance(stamp, datetime)  # the stub's union
        out.append((version, stamp.timestamp()))
    return sorted(out)


def expire_base_versions(table: TableState, retention: timedelta) -> list[int]:
    """Remove the base-table versions superseded longer than ``retention`` ago (and the files
    only they use), keeping tagged ones; returns the versions removed.

    Example:
        ``expire_base_versions(tbl, timedelta(hours=1))  # [1, 2, 3]``
    """
    return _expire_versions(table.dataset(), retention)


def _expire_versions(ds: lance.LanceDataset, retention: timedelta) -> list[int]:
    versions = _version_times(ds)
    cutoff = _now() - retention.total_seconds()
    # Version v stopped being the latest when v+1 was committed.
    expired = [v for (v, _), (_, then) in pairwise(versions) if then <= cutoff]
    if expired:
        ds.cleanup_old_versions(versions=expired, error_if_tagged_old_versions=False)
    return expired


def tidy_merged_tombstones(table: TableState, retention: timedelta | None) -> int:
    """Compact a sequence table's merged deletes (each merge with deletes appends a fragment)
    into few fragments, and remove their versions superseded longer than ``retention`` ago;
    returns how many fragments the compaction replaced. Both are safe beside merges appending
    (Lance rebases an append onto a compaction) and beside writes reading the latest version
    (a version goes only ``retention`` after it was superseded).

    Example:
        ``tidy_merged_tombstones(tbl, timedelta(hours=1))  # 120``
    """
    uri, opts = table.store.uri_for(layout.MERGED_TOMBSTONES), table.storage_options or None
    try:
        ds = lance.dataset(uri, storage_options=opts)
    except (OSError, ValueError) as e:
        if is_not_found(e):
            return 0
        raise
    fragments = len(ds.get_fragments())
    compacted = 0
    if fragments > 1:
        ds.optimize.compact_files()
        ds = lance.dataset(uri, storage_options=opts)
        compacted = fragments - len(ds.get_fragments())
    if retention is not None:
        _expire_versions(ds, retention)
    return compacted


def _last_pass_began(table: TableState) -> float:
    """When the previous pass began, less the slack; 0 (sync everything) without a marker."""
    try:
        return float(json.loads(table.store.get(layout.BASE_SYNCED))["started"]) - _CLOCK_SLACK
    except (ObjectNotFoundError, ValueError, KeyError, TypeError):
        return 0.0


def gc_table(table: TableState, config: MaintenanceConfig | None = None) -> GcResult:
    """One GC pass over every region (see the module docstring), keeping
    ``config.keep_manifest_versions`` manifest versions per region.

    Example:
        ``gc_table(tbl, MaintenanceConfig(base_versions_older_than=timedelta(hours=1)))``

    ``config.base_versions_older_than`` first removes base-table versions superseded longer
    ago than that (:func:`expire_base_versions`); ``None`` keeps them all, and the generations
    they list stay.
    """
    config = config or MaintenanceConfig()
    result = GcResult()
    local, started = table.store.is_local, time.time()
    if local:  # before the cleanup too: it may leave only the newest version
        table.store.sync_written_since(_last_pass_began(table))
    if config.base_versions_older_than is not None:
        expire_base_versions(table, config.base_versions_older_than)
    collectable = _collectable(table)
    if local:
        # A version committed while this pass ran may be the one just read: sync it too. The
        # marker comes after the syncs, so one that survives a power loss never claims more.
        table.store.sync_written_since(started)
        table.store.put(layout.BASE_SYNCED, json.dumps({"started": started}).encode())
    for rid in table.regions():
        _gc_region(table, rid, collectable.get(rid), config.keep_manifest_versions, result)
    if table.sequence_column is not None:
        result.merged_tombstone_fragments = tidy_merged_tombstones(
            table, config.base_versions_older_than
        )
    _log.info("gc of %s: %s", table.uri, result.summary().replace("\n", "; "))
    return result


def _gc_region(
    table: TableState, rid: str, state: _Collectable | None, keep: int, result: GcResult
) -> None:
    store = table.store
    manifests = RegionManifestStore(store, rid)
    manifest = manifests.latest()
    if manifest is None:
        return
    collectable = state.generation if state is not None else 0
    listed = sorted(manifest.flushed_generations, key=lambda g: g.generation)
    dead = [g for g in listed if g.generation <= collectable]
    wal_bound = _wal_bound(store, rid, manifest, listed, dead)
    kept_gens = _explain_kept(rid, state, [g for g in listed if g.generation > collectable])
    if kept_gens is not None:
        result.kept.append(kept_gens)
    # 1. Merged generations: drop them from the manifest first (so no new reader lists them),
    #    then delete their files.
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
    # 3. WAL data entries whose generation is collected; sentinels stay.
    held = 0
    for pos in wal_positions(store, rid):
        if pos > manifest.replay_after_wal_entry_position:
            break
        if pos > wal_bound:
            held += 1
            continue
        try:
            entry = read_wal_entry(store, rid, pos)
        except CorruptWalEntryError:
            continue  # never delete what we cannot classify
        if entry is None or entry.is_sentinel:
            continue
        store.delete(layout.wal_entry_path(rid, pos))
        result.wal_entries += 1
        result.objects += 1
    if held:
        # The spec keeps a WAL entry while the generation holding its rows is kept: say why that
        # generation is kept, or that one Lance flushed recorded no WAL position.
        why = (
            f"their rows are in {kept_gens.what}, kept too: {kept_gens.reason}"
            if kept_gens is not None
            else "a collected generation recorded no WAL position at flush (Lance flushed "
            "it), so they wait until every listed generation is collectable"
        )
        result.kept.append(GcKept(rid, f"{held} flushed WAL entries", why))
    # 4. Old manifest versions (the hint and the newest ``keep`` stay).
    versions = manifests.list_versions()
    for v in versions[:-keep] if keep > 0 else []:
        store.delete(layout.manifest_path(rid, v))
        result.manifest_versions += 1
        result.objects += 1
    # 5. Temporary files of crashed puts.
    for prefix in (layout.wal_dir(rid), layout.manifest_dir(rid)):
        result.objects += store.remove_temp_files(prefix)


def _wal_bound(
    store: ObjectStore,
    rid: str,
    manifest: RegionManifest,
    listed: list[FlushedGeneration],
    dead: list[FlushedGeneration],
) -> int:
    """The last WAL position whose rows are only in generations this pass collects (or earlier
    passes did): every flushed entry once no listed generation survives, else the position the
    newest dead generation recorded at flush (0 when it recorded none)."""
    if len(dead) == len(listed):
        return manifest.replay_after_wal_entry_position
    for g in reversed(dead):
        position = recorded_wal_entry_position(store, f"{layout.region_dir(rid)}/{g.path}")
        if position is not None:
            return position
    return 0


def _explain_kept(
    rid: str, state: _Collectable | None, kept: list[FlushedGeneration]
) -> GcKept | None:
    """Why the generations ``kept`` stay: the first of them is the one held back."""
    if not kept:
        return None
    gens = [g.generation for g in kept]
    what = f"generation {gens[0]}" if len(gens) == 1 else f"generations {gens[0]}-{gens[-1]}"
    if state is None or gens[0] > state.merged_latest:
        reason = "not merged into the base table yet (merge, or maintain)"
    elif gens[0] > state.merged_oldest:
        reason = (
            f"base version {state.oldest_version} is retained and predates their merge "
            "(GC drops it once superseded for base_versions_older_than, or when its tag is "
            "deleted)"
        )
    else:
        reason = (
            f"index {state.lagging_index!r} covers only up to generation "
            f"{state.index_caught_up if state.index_caught_up is not None else '(unknown)'} "
            "(catch the indexes up: maintain)"
        )
    return GcKept(rid, what, reason)
