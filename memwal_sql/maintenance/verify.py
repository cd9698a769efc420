"""A scrub of a MemWAL table: every region manifest version, WAL entry and generation file.

Reads and merges already refuse damaged state as they meet it; ``verify`` looks at everything
at once, so that damage is found (and restored from a backup) before anything needs it:

* manifests: every stored version decodes, the version hint is not ahead of them, and the
  region is not behind the MemWAL index (a region the index merged from has its manifests);
* WAL: every entry decodes and passes its checksum, with no hole after the replay position;
* generations: every flushed generation's files match the checksums recorded at flush (a
  generation Lance's writer flushed has none: it is opened and counted instead);
* keys: no key has unmerged versions in two regions (possible only when the region spec reads
  non-key columns, or with manual regions), and the base table holds each key once.

Example:
    ``report = tbl.verify(); print(report.summary()); assert report.ok``
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from exec_nodes.regions import key_in_two_regions
from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import CorruptTableError, MemWalError, StorageError
from memwal_sql.formats.generation import open_generation
from memwal_sql.formats.region_manifest import RegionManifestStore, check_not_behind_index
from memwal_sql.formats.wal import (
    decode_wal_entry,
    missing_wal_entry,
    only_sentinels_after,
    wal_positions,
)
from memwal_sql.read_snapshot import take_read_snapshot
from memwal_sql.storage import layout
from memwal_sql.storage.checksums import verify_generation
from memwal_sql.writer.memtable import duplicate_keys
from planner.regions import keys_in_two_regions_of

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState


@dataclass(frozen=True)
class Problem:
    """One damaged or lost object."""

    region_id: str  # "" for the table as a whole
    kind: str  # "manifest", "wal", "generation" or "keys"
    error: str  # the typed error's class name
    message: str


@dataclass
class VerifyReport:
    """What :func:`verify_table` checked and found."""

    regions: int = 0
    manifest_versions: int = 0
    wal_entries: int = 0
    generations: int = 0
    unverifiable_generations: int = 0  # flushed without checksums (by Lance's writer)
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (
            f"checked {self.regions} region(s): {self.manifest_versions} manifest "
            f"version(s), {self.wal_entries} WAL entries, {self.generations} "
            f"generation(s) ({self.unverifiable_generations} without checksums)"
        )
        if self.ok:
            return f"{head}; no damage found"
        lines = [f"{head}; {len(self.problems)} problem(s):"]
        lines += [
            f"  {f'region {p.region_id} ' if p.region_id else ''}{p.kind}: {p.error}: {p.message}"
            for p in self.problems
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def verify_table(
    table: TableState, progress: Callable[[int], object] | None = None
) -> VerifyReport:
    """Scrub ``table`` (see the module docstring); ``progress(n)`` is called as objects are
    checked. Damage is reported, not raised.

    Example:
        ``verify_table(tbl).problems``
    """
    report = VerifyReport()
    merged = table.merged_generations()
    tick = progress or (lambda n: None)
    for rid in sorted(set(table.regions()) | set(merged)):
        report.regions += 1
        manifest = _check_manifests(table, rid, merged.get(rid, 0), report, tick)
        _check_wal(table, rid, manifest, report, tick)
        for gen in manifest.flushed_generations if manifest is not None else []:
            path = f"{layout.region_dir(rid)}/{gen.path}"
            report.generations += 1
            try:
                if not verify_generation(table.store, path):
                    report.unverifiable_generations += 1
                    open_generation(
                        table.store.uri_for(path), table.storage_options or None
                    ).count_rows()
            except MemWalError as e:
                _found(report, rid, "generation", e)
            except Exception as e:
                _found(report, rid, "generation", StorageError(f"{path}: {e}"))
            tick(1)
    _check_keys(table, report)
    return report


def _check_keys(table: TableState, report: VerifyReport) -> None:
    """Keys in two regions, and keys the base table holds twice."""
    pk = list(table.primary_key)
    repeated = duplicate_keys(table.dataset().to_table(columns=pk), pk)
    if repeated.num_rows:
        _found(
            report,
            "",
            "keys",
            CorruptTableError(
                f"the base table holds {repeated.num_rows} key(s) more than once, e.g. "
                f"{repeated.slice(0, 5).to_pylist()}: every read returns each of their rows. "
                "Delete all but one row of each with Lance (the base table is a Lance dataset)"
            ),
        )
    try:
        shared = keys_in_two_regions_of(take_read_snapshot(table, "strong"), table.region_spec)
    except MemWalError:
        return  # a damaged or lost object, reported above: the keys cannot all be read
    if shared is not None:
        _found(report, "", "keys", key_in_two_regions(shared, table.primary_key))


def _check_manifests(
    table: TableState, rid: str, merged: int, report: VerifyReport, tick: Callable[[int], object]
) -> Any:
    manifests = RegionManifestStore(table.store, rid)
    for version in manifests.list_versions():
        report.manifest_versions += 1
        try:
            manifests.read(version)
        except MemWalError as e:
            _found(report, rid, "manifest", e)
        tick(1)
    try:
        manifest = manifests.latest()
        check_not_behind_index(rid, manifest, merged)
        return manifest
    except MemWalError as e:
        _found(report, rid, "manifest", e)
        return None


def _check_wal(
    table: TableState,
    rid: str,
    manifest: RegionManifest | None,
    report: VerifyReport,
    tick: Callable[[int], object],
) -> None:
    tail = manifest.replay_after_wal_entry_position if manifest is not None else 0
    last_seen = manifest.wal_entry_position_last_seen if manifest is not None else tail
    positions = wal_positions(table.store, rid)
    after = [p for p in positions if p > tail]
    for hole in sorted(set(range(tail + 1, max(after, default=tail))) - set(after)):
        if hole > last_seen and only_sentinels_after(table.store, rid, hole):
            break  # where a claim that did not finish leapt: the next claim fills it
        _found(report, rid, "wal", missing_wal_entry(rid, hole, max(after)))
    for position in positions:
        report.wal_entries += 1
        try:
            decode_wal_entry(table.store.get(layout.wal_entry_path(rid, position)), position)
        except MemWalError as e:
            _found(report, rid, "wal", e)
        tick(1)


def _found(report: VerifyReport, rid: str, kind: str, e: Exception) -> None:
    report.problems.append(Problem(rid, kind, type(e).__name__, str(e)))
