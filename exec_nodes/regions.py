"""Keys in two regions: what a read checks on a table whose regions may share keys.

A region spec that reads only primary-key columns puts each key in exactly one region. Under any
other spec (or with manual regions) that holds only while no write changes a key's region
columns. If one does, two regions hold unmerged versions of the key: no read can tell which is
newer, and the region merged last wins, so an acknowledged write can be lost (the spec's
data-corruption case). Reads of such a table fail instead:

* a point lookup or a search probes every region for its keys anyway, and fails when two
  regions resolve one key (:func:`raise_if_shared`, at no cost);
* a scan may prune regions by a filter, so it checks every key of every region first
  (:mod:`planner.regions`, with :class:`KeyRegions`).

Example:
    >>> import pyarrow as pa
    >>> held = KeyRegions([("a", pa.table({"id": [1, 2]})), ("b", pa.table({"id": [2, 3]}))], ["id"])
    >>> held.shared().to_pylist()
    [{'id': 2, 'region': 'a', 'other_region': 'b'}]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.errors import KeyInTwoRegionsError
from memwal_sql.structures.keyset import KeySet

REGION = "region"
OTHER_REGION = "other_region"
_SHOWN = 5  # keys named in the error


def _number(region_id: str) -> int:
    """A region's number in the aggregation, a 64-bit hash of the id: grouping by a number
    instead of the id string keeps a scan after a write cheap (benchmarks/bench_key_regions.py)."""
    digest = hashlib.blake2b(region_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class KeyRegions:
    """The distinct keys of some regions' rows, each with the lowest and the highest region
    holding it (by :func:`_number`): ``parts`` are ``(region id, table of key columns)``."""

    def __init__(self, parts: Sequence[tuple[str, pa.Table]], primary_key: Sequence[str]) -> None:
        self.primary_key = list(primary_key)
        self.region_ids = {_number(rid): rid for rid, _ in parts}
        tagged = [
            keys.select(self.primary_key).append_column(
                REGION, pa.array(np.full(keys.num_rows, _number(rid), dtype=np.int64))
            )
            for rid, keys in parts
            if keys.num_rows
        ]
        self.keys: pa.Table | None = None
        if tagged:
            self.keys = _regions_per_key(pa.concat_tables(tagged), self.primary_key)
        self._keyset: KeySet | None = None

    @property
    def nbytes(self) -> int:
        held = 0 if self.keys is None else self.keys.nbytes
        return held + (0 if self._keyset is None else self._keyset.nbytes)

    def shared(self) -> pa.Table | None:
        """The keys held by two regions: key columns, ``region`` and ``other_region``."""
        if self.keys is None:
            return None
        lo, hi = self.keys.column(f"{REGION}_min"), self.keys.column(f"{REGION}_max")
        two = pc.not_equal(lo, hi)
        keys = self.keys.select(self.primary_key).filter(two)
        return _named(keys, lo.filter(two), hi.filter(two), self.region_ids)

    def shared_with(self, other: KeyRegions) -> pa.Table | None:
        """The keys of ``other`` that these regions hold in another region."""
        if self.keys is None or other.keys is None:
            return None
        if self._keyset is None:
            self._keyset = KeySet(self.keys.select(self.primary_key))
        pos = self._keyset.positions(other.keys.select(self.primary_key))
        hit = pa.array(pos >= 0)
        mine = self.keys.column(f"{REGION}_min").take(pa.array(pos[pos >= 0]))
        theirs = other.keys.column(f"{REGION}_min").filter(hit)
        moved = pc.not_equal(mine, theirs)
        keys = other.keys.select(self.primary_key).filter(hit).filter(moved)
        ids = {**self.region_ids, **other.region_ids}
        return _named(keys, mine.filter(moved), theirs.filter(moved), ids)


def _regions_per_key(tagged: pa.Table, primary_key: list[str]) -> pa.Table:
    """The distinct keys of ``tagged`` (key columns and ``region``) with the lowest and highest
    region of each. One integer key column is sorted in numpy: a large write's keys often come
    in order, which a stable sort merges in a pass (0.05-0.2 s on 5M keys written in order,
    against 0.9-2.3 s for Acero's hash aggregate; about even on keys in random order).

    Example:
        >>> t = pa.table({"id": [2, 1, 2], REGION: [7, 5, 3]})
        >>> _regions_per_key(t, ["id"]).to_pylist()[1]
        {'id': 2, 'region_min': 3, 'region_max': 7}
    """
    col = tagged.column(primary_key[0])
    if len(primary_key) > 1 or not pa.types.is_integer(col.type) or col.null_count:
        out = tagged.group_by(primary_key, use_threads=False).aggregate(
            [(REGION, "min"), (REGION, "max")]
        )
        return out.select([*primary_key, f"{REGION}_min", f"{REGION}_max"])
    values = col.to_numpy()
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    regions = tagged.column(REGION).to_numpy()[order]
    differs = ordered[1:] != ordered[:-1]
    lo = hi = regions  # every key once: its one region
    if not differs.all():
        starts = np.flatnonzero(np.r_[True, differs])
        ordered = ordered[starts]
        lo, hi = np.minimum.reduceat(regions, starts), np.maximum.reduceat(regions, starts)
    return pa.table(
        {
            primary_key[0]: pa.array(ordered, col.type),
            f"{REGION}_min": lo,
            f"{REGION}_max": hi,
        }
    )


def _named(
    keys: pa.Table, region: pa.Array, other: pa.Array, ids: dict[int, str]
) -> pa.Table | None:
    """``keys`` with the ids of the two regions holding each (few: the error's keys)."""
    if keys.num_rows == 0:
        return None
    first = [ids[n] for n in region.to_pylist()]
    second = [ids[n] for n in other.to_pylist()]
    return keys.append_column(REGION, pa.array(first, pa.string())).append_column(
        OTHER_REGION, pa.array(second, pa.string())
    )


def raise_if_shared(
    found: Sequence[tuple[str | None, pa.Table, bool]], primary_key: Sequence[str]
) -> None:
    """:class:`KeyInTwoRegionsError` if two regions' probe results hold one key: ``(region
    id, rows, routed)``, each region's newest version of the keys it holds, and whether it was
    asked only the keys its spec routes to it (two such regions share none: nothing to check
    unless a region asked every key found some)."""
    parts = [(rid, rows) for rid, rows, _ in found if rid is not None and rows.num_rows]
    if len(parts) > 1 and any(not routed and rows.num_rows for _, rows, routed in found):
        shared = KeyRegions(parts, primary_key).shared()
        if shared is not None:
            raise key_in_two_regions(shared, primary_key)


def key_in_two_regions(shared: pa.Table, primary_key: Sequence[str]) -> KeyInTwoRegionsError:
    """The error naming the keys of ``shared`` (as :meth:`KeyRegions.shared` gives them) and
    how to repair the table."""
    rows = shared.to_pylist()
    regions = sorted({r[REGION] for r in rows} | {r[OTHER_REGION] for r in rows})
    shown = "; ".join(
        ", ".join(f"{k}={r[k]!r}" for k in primary_key)
        + f" in regions {r[REGION][:8]} and {r[OTHER_REGION][:8]}"
        for r in rows[:_SHOWN]
    )
    more = f" (and {len(rows) - _SHOWN} more)" if len(rows) > _SHOWN else ""
    return KeyInTwoRegionsError(
        f"key {shown}{more} has unmerged versions in two regions: its region values changed "
        "between writes, so no read can tell which version is newer, and a merge would let "
        "the region merged last win. Merge the regions in the order their writes happened, the "
        "newest last: tbl.merge(regions=[older, newer]) or `memwal merge URI --region OLDER "
        f"--region NEWER`, of regions {', '.join(regions)} (flush a region's unflushed rows "
        "first: `with tbl.writer(region_id=...): pass`)"
    )
