"""Index catch-up: how far each base-table index covers the merged generations.

After a merge, the base table holds rows its indexes do not cover yet, until an index builder
rebuilds or optimizes them. Lance records what each index covers exactly, as the fragments in its
metadata, atomically with the index commit. The catch-up progress of the spec
(``index_catchup``: per index and region, the newest merged generation the index covers) is
derived from that record and the base table's history, so it is never stale and needs no
separate commit:

* an index that covers every live fragment is caught up with the version's merge progress;
* otherwise the version that created the oldest uncovered fragment is found by walking the
  transactions back. If every uncovered fragment was created by a MemWAL merge (a commit that
  advanced ``merged_generations``), the index is caught up with the merge progress just before
  that version: the uncovered rows are exactly those of the generations after it, which is what
  the indexed read plan relies on. If any uncovered fragment came from another kind of write, or
  the history is gone (base versions cleaned up while the index lagged), catch-up is unknown
  (``None``): readers read the whole base table (Lance scans the uncovered fragments) and the
  garbage collector keeps the generations, until the index builder catches the index up.

Lance 14's ``optimize_indices`` also records ``index_catchup`` in the MemWAL index details, but
as of its own commit: an index optimized from an older version and rebased over a merge would
claim rows it does not cover, so that record is not what reads rely on.

Example:
    ``{c.name: c.caught_up for c in index_coverage(tbl.store, tbl.dataset())}``
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import lance

from memwal_sql.compat.lance import data_file_paths
from memwal_sql.errors import MemWalError
from memwal_sql.formats.lance_manifest import INDEX_NAME, read_mem_wal_details
from memwal_sql.formats.memwal_index import region_generations
from memwal_sql.storage import ObjectStore

_MAX_HISTORY = 1000  # versions walked back at most before catch-up counts as unknown
_CACHE_ENTRIES = 64


@dataclass(frozen=True)
class IndexCoverage:
    """What one base-table index covers at one base version.

    ``caught_up`` maps a region id to the newest merged generation the index covers (regions
    absent: 0); ``None`` means unknown.
    """

    name: str
    columns: tuple[str, ...]
    fragment_ids: frozenset[int]
    complete: bool  # covers every live fragment of the version
    caught_up: Mapping[str, int] | None

    def caught_up_generation(self, region_id: str) -> int | None:
        """The newest generation of ``region_id`` the index covers, None if unknown."""
        return None if self.caught_up is None else self.caught_up.get(region_id, 0)


def merged_generations_at(store: ObjectStore, version: int) -> dict[str, int]:
    """The merge progress recorded in base version ``version`` (region id -> generation)."""
    details = read_mem_wal_details(store, version)
    return {} if details is None else region_generations(details.merged_generations)


_cache: OrderedDict[tuple[str, int], list[IndexCoverage]] = OrderedDict()
_cache_lock = threading.Lock()


def index_coverage(store: ObjectStore, ds: lance.LanceDataset) -> list[IndexCoverage]:
    """Coverage and catch-up of every index of ``ds`` (the MemWAL index aside), at its version.

    A version never changes, so the answer is cached per (table, version).
    """
    key = (ds.uri, ds.version)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    out = _compute(store, ds)
    with _cache_lock:
        _cache[key] = out
        while len(_cache) > _CACHE_ENTRIES:
            _cache.popitem(last=False)
    return out


def _compute(store: ObjectStore, ds: lance.LanceDataset) -> list[IndexCoverage]:
    indexes = [d for d in ds.describe_indices() if d.name != INDEX_NAME and d.field_names]
    if not indexes:
        return []
    fragments = {f.fragment_id: f for f in ds.get_fragments()}
    merged_now = merged_generations_at(store, ds.version)
    out = []
    for d in indexes:
        covered = frozenset(i for s in d.segments for i in s.fragment_ids)
        uncovered = set(fragments) - covered
        if not uncovered:
            caught_up: Mapping[str, int] | None = merged_now
        else:
            caught_up = _caught_up_before(
                store,
                ds,
                {p: fid for fid in uncovered for p in data_file_paths(fragments[fid].metadata)},
            )
        out.append(IndexCoverage(d.name, tuple(d.field_names), covered, not uncovered, caught_up))
    return out


def _caught_up_before(
    store: ObjectStore, ds: lance.LanceDataset, uncovered: dict[str, int]
) -> dict[str, int] | None:
    """The merge progress just before the oldest version that created one of the ``uncovered``
    fragments (data file path -> fragment id), or None if one came from anything but a merge."""
    remaining = set(uncovered.values())
    version = ds.version
    merged_after = merged_generations_at(store, version)
    while remaining:
        if version <= 1 or ds.version - version >= _MAX_HISTORY:
            return None
        try:
            merged_before = merged_generations_at(store, version - 1)
            try:
                txn = ds.read_transaction(version)
                op = txn.operation if txn else None
                op_name, paths = type(op).__name__, set(_created_paths(op))
            except TypeError:
                # pylance 14 cannot decode a compaction that remapped indexes (tests/compat):
                # what the version created is what its fragments add to the previous ones.
                op_name, paths = "Rewrite", _added_paths(ds, version)
        except (MemWalError, OSError, ValueError, RuntimeError):
            return None  # cleaned up: the history needed is gone
        created = {uncovered[p] for p in paths if p in uncovered}
        if created:
            is_merge = op_name == "Update" and merged_before != merged_after
            if not is_merge:
                return None
            remaining -= created
        version -= 1
        merged_after = merged_before
    return merged_after


def _added_paths(ds: lance.LanceDataset, version: int) -> set[str]:
    """Data files of the fragments of ``version`` that ``version - 1`` does not have."""

    def paths(v: int) -> set[str]:
        return {
            p for f in ds.checkout_version(v).get_fragments() for p in data_file_paths(f.metadata)
        }

    return paths(version) - paths(version - 1)


def _created_paths(op: Any) -> Iterable[str]:
    """Data files of the fragments an operation created (any operation type)."""
    if op is None:
        return []
    groups = getattr(op, "groups", None) or []
    frags = [
        *(getattr(op, "new_fragments", None) or []),
        *(getattr(op, "fragments", None) or []),
        *(f for g in groups for f in getattr(g, "new_fragments", [])),
    ]
    return [p for f in frags for p in data_file_paths(f)]


def min_caught_up(coverages: Iterable[IndexCoverage], region_id: str) -> int | None:
    """The generation of ``region_id`` every index in ``coverages`` covers; None if unknown for
    one of them, ``sys.maxsize`` for no index at all (nothing to wait for)."""
    gens = [c.caught_up_generation(region_id) for c in coverages]
    if any(g is None for g in gens):
        return None
    return min((g for g in gens if g is not None), default=sys.maxsize)


__all__ = ["IndexCoverage", "index_coverage", "merged_generations_at", "min_caught_up"]
