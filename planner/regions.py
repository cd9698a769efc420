"""One region per key: the check every plan of a table whose regions may share keys runs first.

See :mod:`exec_nodes.regions` for why. A spec whose fields read only primary-key columns keeps
each key in one region by construction, so its tables skip the check, unless a region the spec
does not govern (a manual region, as Lance's shard ids make) holds unmerged rows. The check
looks at every region of the snapshot, pruned or not: a filter on a region column that prunes
one of the two regions would otherwise return the other's version, possibly the older.

Example:
    ``check_one_region_per_key(take_snapshot(tbl), tbl.region_spec)  # or KeyInTwoRegionsError``
"""

from __future__ import annotations

import pyarrow as pa

from exec_nodes.regions import OTHER_REGION, REGION, RegionKeys, keys_in_two_regions
from memwal_sql.errors import KeyInTwoRegionsError
from memwal_sql.index.region_spec import RegionSpec
from memwal_sql.snapshot import TableSnapshot

_SHOWN = 5  # keys named in the error


def may_share_keys(snapshot: TableSnapshot, spec: RegionSpec | None) -> bool:
    """Whether two regions of ``snapshot`` could hold the same key: they have unmerged rows,
    and the spec does not route keys by key columns alone (or one of them is ungoverned)."""
    busy = [r for r in snapshot.regions if r.num_sources]
    if len(busy) < 2:
        return False
    if spec is None or not spec.routes_by_key(snapshot.primary_key):
        return True
    return any(r.region_values is None for r in busy)


def keys_in_two_regions_of(snapshot: TableSnapshot, spec: RegionSpec | None) -> pa.Table | None:
    """The keys of ``snapshot`` with unmerged versions in two regions (key columns,
    ``region``, ``other_region``), or None.

    Example:
        ``keys_in_two_regions_of(take_snapshot(tbl), tbl.region_spec)``
    """
    if not may_share_keys(snapshot, spec):
        return None
    regions = [
        RegionKeys(
            r.region_id,
            tuple(g.uri for g in r.generations),
            tuple(b for m in r.unflushed for b in m.batches),
        )
        for r in snapshot.regions
        if r.num_sources
    ]
    return keys_in_two_regions(regions, snapshot.primary_key, snapshot.storage_options)


def check_one_region_per_key(snapshot: TableSnapshot, spec: RegionSpec | None) -> None:
    """Raise :class:`KeyInTwoRegionsError` if a key has unmerged versions in two regions."""
    shared = keys_in_two_regions_of(snapshot, spec)
    if shared is not None:
        raise key_in_two_regions(shared, snapshot.primary_key, spec)


def key_in_two_regions(
    shared: pa.Table, primary_key: tuple[str, ...], spec: RegionSpec | None
) -> KeyInTwoRegionsError:
    """The error naming the first of ``shared`` (see :func:`keys_in_two_regions_of`)."""
    rows = shared.to_pylist()
    regions = sorted({r[REGION] for r in rows} | {r[OTHER_REGION] for r in rows})
    shown = "; ".join(
        ", ".join(f"{k}={r[k]!r}" for k in primary_key)
        + f" in regions {r[REGION][:8]} and {r[OTHER_REGION][:8]}"
        for r in rows[:_SHOWN]
    )
    more = f" (and {len(rows) - _SHOWN} more)" if len(rows) > _SHOWN else ""
    columns = f" (columns {', '.join(spec.source_columns)})" if spec is not None else ""
    return KeyInTwoRegionsError(
        f"key {shown}{more} has unmerged versions in two regions: its region values"
        f"{columns} changed between writes, so no read can tell which version is newer, and a "
        "merge would let the region merged last win. Merge the regions in the order their "
        f"writes happened, the newest last: tbl.merge(regions=[...]) with regions "
        f"{', '.join(regions)} (flush a region's unflushed rows first: "
        "`with tbl.writer(region_id=...): pass`)"
    )
