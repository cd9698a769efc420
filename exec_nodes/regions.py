"""Keys in two regions: what a read checks on a table whose regions may share keys.

A region spec that reads only primary-key columns puts each key in exactly one region. Under any
other spec (or with manual regions) that holds only while no write changes a key's region
columns. If one does, two regions hold unmerged versions of the key: no read can tell which is
newer, and the region merged last wins, so an acknowledged write can be lost (the spec's
data-corruption case). Such a table is read only after this check finds no key with unmerged
versions in two regions.

The flushed generations' part is kept in the lookup cache per set of generations (they never
change); the MemTables and WAL tails are checked per query, against it.

Example:
    >>> import pyarrow as pa
    >>> a = RegionKeys("a", (), (pa.record_batch({"id": [1, 2]}),))
    >>> b = RegionKeys("b", (), (pa.record_batch({"id": [2, 3]}),))
    >>> keys_in_two_regions([a, b], ["id"], None).to_pylist()
    [{'id': 2, 'region': 'a', 'other_region': 'b'}]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.keyset import KeySet
from exec_nodes.lookup import CACHE
from memwal_sql.writer.generation import open_generation

REGION = "region"
OTHER_REGION = "other_region"


@dataclass(frozen=True)
class RegionKeys:
    """Where one region's unmerged versions are: its flushed generations (uris) and its
    unflushed rows (MemTables, WAL tail)."""

    region_id: str
    generations: Sequence[str]
    unflushed: Sequence[pa.RecordBatch]


def keys_in_two_regions(
    regions: Sequence[RegionKeys],
    primary_key: Sequence[str],
    storage_options: Mapping[str, str] | None,
) -> pa.Table | None:
    """The keys with versions (rows or tombstones) in more than one of ``regions``: the key
    columns, then two of the regions holding each; None when every key is in one region.

    Example:
        ``keys_in_two_regions([RegionKeys(rid, uris, batches), ...], ["id"], None)``
    """
    pk = list(primary_key)
    found = []
    in_gens = _generation_regions(regions, pk, storage_options)
    if in_gens is not None:
        found.append(_shared(in_gens.spread, pk))
    mems = [
        _tagged(pa.Table.from_batches([b]).select(pk), r.region_id)
        for r in regions
        for b in r.unflushed
        if b.num_rows
    ]
    if mems:
        in_mems = _spread(pa.concat_tables(mems), pk)
        found.append(_shared(in_mems, pk))
        if in_gens is not None:
            # A MemTable key the generations hold in another region.
            pos = in_gens.keyset.positions(in_mems.select(pk))
            hit = pos >= 0
            theirs = in_gens.spread.column("lo").take(pa.array(pos[hit]))
            mine = in_mems.column("lo").filter(pa.array(hit))
            moved = pa.array(pc.not_equal(theirs, mine).to_numpy(zero_copy_only=False))
            found.append(
                in_mems.select(pk)
                .filter(pa.array(hit))
                .filter(moved)
                .append_column(REGION, theirs.filter(moved))
                .append_column(OTHER_REGION, mine.filter(moved))
            )
    found = [t for t in found if t.num_rows]
    return pa.concat_tables(found) if found else None


@dataclass(frozen=True)
class _GenerationRegions:
    spread: pa.Table  # every distinct key of the generations, with its regions (see _spread)
    keyset: KeySet

    @property
    def nbytes(self) -> int:
        return self.spread.nbytes + self.keyset.nbytes


def _generation_regions(
    regions: Sequence[RegionKeys], pk: list[str], opts: Mapping[str, str] | None
) -> _GenerationRegions | None:
    gens = sorted((uri, r.region_id) for r in regions for uri in r.generations)
    if not gens:
        return None

    def load() -> tuple[_GenerationRegions, int]:
        tagged = [_tagged(_generation_keys(uri, pk, opts), rid) for uri, rid in gens]
        spread = _spread(pa.concat_tables(tagged), pk)
        got = _GenerationRegions(spread, KeySet(spread.select(pk)))
        return got, got.nbytes

    return CACHE.get("generation_regions", "\n".join(f"{u} {r}" for u, r in gens), load)


def _generation_keys(uri: str, pk: list[str], opts: Mapping[str, str] | None) -> pa.Table:
    def load() -> tuple[pa.Table, int]:
        keys = open_generation(uri, dict(opts or {}) or None).to_table(columns=pk)
        return keys, keys.nbytes

    return CACHE.get("generation_keys", uri, load)


def _tagged(keys: pa.Table, region_id: str) -> pa.Table:
    return keys.append_column(REGION, pa.array(np.full(keys.num_rows, region_id), pa.string()))


def _spread(tagged: pa.Table, pk: list[str]) -> pa.Table:
    """Per distinct key, the lowest and the highest region holding it (``lo``, ``hi``)."""
    out = tagged.group_by(pk, use_threads=False).aggregate([(REGION, "min"), (REGION, "max")])
    return out.select([*pk, f"{REGION}_min", f"{REGION}_max"]).rename_columns([*pk, "lo", "hi"])


def _shared(spread: pa.Table, pk: list[str]) -> pa.Table:
    """The keys of ``spread`` held by two regions."""
    two = spread.filter(pc.not_equal(spread.column("lo"), spread.column("hi")))
    return (
        two.select(pk)
        .append_column(REGION, two.column("lo"))
        .append_column(OTHER_REGION, two.column("hi"))
    )
