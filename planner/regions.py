"""One region per key: the check a scan of a table whose regions may share keys runs first.

See :mod:`exec_nodes.regions` for why. A spec whose fields read only primary-key columns keeps
each key in one region by construction, so its tables skip the check, unless a region the spec
does not govern (a manual region, as Lance's shard ids make) holds unmerged rows. The check
looks at every region of the snapshot, pruned or not: a filter on a region column that prunes
one of the two regions would otherwise return the other's version, possibly the older. Point
lookups and searches probe every region for their keys and check there.

Example:
    ``check_one_region_per_key(take_read_snapshot(tbl), tbl.region_spec)  # or KeyInTwoRegionsError``
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from exec_nodes.regions import KeyRegions, key_in_two_regions
from memwal_sql.formats.generation import ROW_FILES, open_generation
from memwal_sql.partitioning.region_spec import RegionSpec
from memwal_sql.read_snapshot import ReadSnapshot, RegionSources


def regions_may_share_keys(
    spec: RegionSpec | None,
    primary_key: Sequence[str],
    region_values: Iterable[tuple[Any, ...] | None],
) -> bool:
    """Whether regions of these values (None: a region the spec does not govern) could hold
    one key: the spec does not route keys by key columns alone, or a region is ungoverned.

    Example:
        >>> regions_may_share_keys(RegionSpec.bucket("id", 2), ["id"], [(0,), (1,)])
        False
    """
    if spec is None or not spec.routes_by_key(primary_key):
        return True
    return any(values is None for values in region_values)


def may_share_keys(snapshot: ReadSnapshot, spec: RegionSpec | None) -> bool:
    """Whether two regions of ``snapshot`` with unmerged rows could hold the same key."""
    busy = [r for r in snapshot.regions if r.num_sources]
    return len(busy) > 1 and regions_may_share_keys(
        spec, snapshot.primary_key, (r.region_values for r in busy)
    )


def keys_in_two_regions_of(snapshot: ReadSnapshot, spec: RegionSpec | None) -> pa.Table | None:
    """The keys of ``snapshot`` with unmerged versions in two regions (key columns,
    ``region``, ``other_region``), or None.

    The flushed generations' part is kept per set of generations (they never change); the
    MemTables' part per set of MemTable batches (a MemTable only ever gains batches), against
    it. A WAL tail is read anew by each snapshot: its query checks anew.

    Example:
        ``keys_in_two_regions_of(take_read_snapshot(tbl), tbl.region_spec)``
    """
    if not may_share_keys(snapshot, spec):
        return None
    pk = list(snapshot.primary_key)
    in_gens = _generation_regions(snapshot)
    unflushed = [r for r in snapshot.regions if r.unflushed]
    firsts = [m.batches[0] for r in unflushed for m in r.unflushed if m.batches]

    def check() -> pa.Table | None:
        in_mems = KeyRegions(
            [
                (r.region_id, pa.Table.from_batches(b for m in r.unflushed for b in m.batches))
                for r in unflushed
            ],
            pk,
        )
        found = [
            t
            for t in (in_gens.shared(), in_mems.shared(), in_gens.shared_with(in_mems))
            if t is not None
        ]
        return pa.concat_tables(found) if found else None

    if any(m.origin != "memtable" for r in unflushed for m in r.unflushed):
        return check()

    def load() -> tuple[tuple[pa.Table | None, KeyRegions, list[pa.RecordBatch]], int]:
        shared = check()
        return (shared, in_gens, firsts), 64 if shared is None else shared.nbytes

    key = "\n".join(
        [f"{g.uri}" for r in snapshot.regions for g in r.generations]
        + [f"{r.region_id} {id(r.unflushed[0].batches[0])}:{_batches(r)}" for r in unflushed]
    )
    shared, *_ = snapshot.caches.lookup.get(
        "keys_in_two_regions",
        key,
        load,
        # the ids in the key are of batches the entry holds: never reused
        lambda entry: entry[1] is in_gens and all(a is b for a, b in zip(entry[2], firsts)),
    )
    return shared


def _batches(region: RegionSources) -> int:
    return sum(len(m.batches) for m in region.unflushed)


def _generation_regions(snapshot: ReadSnapshot) -> KeyRegions:
    gens = sorted((g.uri, r.region_id) for r in snapshot.regions for g in r.generations)
    opts = dict(snapshot.storage_options or {}) or None
    pk = list(snapshot.primary_key)

    def keys_of(uri: str) -> pa.Table:
        def load() -> tuple[pa.Table, int]:
            keys = open_generation(uri, opts, ROW_FILES).to_table(columns=pk)
            return keys, keys.nbytes

        return snapshot.caches.lookup.get("generation_keys", uri, load)

    def load() -> tuple[KeyRegions, int]:
        held = KeyRegions([(rid, keys_of(uri)) for uri, rid in gens], pk)
        return held, held.nbytes + 64

    key = "\n".join(f"{u} {r}" for u, r in gens)
    return snapshot.caches.lookup.get("generation_regions", key, load)


def check_one_region_per_key(snapshot: ReadSnapshot, spec: RegionSpec | None) -> None:
    """Raise :class:`~memwal_sql.errors.KeyInTwoRegionsError` if a key has unmerged versions
    in two regions of ``snapshot``."""
    shared = keys_in_two_regions_of(snapshot, spec)
    if shared is not None:
        raise key_in_two_regions(shared, snapshot.primary_key)
