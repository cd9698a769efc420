"""One region per key, on the write side: refuse a write that would give a key unmerged
versions in two regions.

Only a table whose region spec reads non-key columns (Lance lets one be made; memwal-sql's
``create_table`` asks for ``allow_non_key_region_spec=True``) can get there: a write that
changes a key's region columns while its old region still holds an unmerged version of it.
Routed writes (``tbl.upsert``, ``tbl.delete``) first probe every region for their keys that
they route elsewhere (a key its own region holds is no conflict), as a point lookup does
without the base table: the MemTables of this process, the WAL tails of the
other regions, and the generations behind their bloom filters. A writer of another process
that has not stored its rows yet is not seen, nor are writes through an explicit region
writer; reads and merges check again (:mod:`planner.regions`).

Example:
    ``tbl.upsert(rows)  # KeyRegionChangeError if a key of rows moved region too early``
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from exec_nodes.lookup import HASH
from exec_nodes.regions import OTHER_REGION, REGION, KeyRegions
from memwal_sql.errors import KeyRegionChangeError
from memwal_sql.formats.bloom import pk_hashes
from memwal_sql.partitioning.region_spec import region_id_for
from memwal_sql.read_snapshot import take_read_snapshot
from memwal_sql.session import read_failures
from planner.lookup import region_lookups

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState


def _held_elsewhere(
    table: TableState, keys: pa.Table, routed: Mapping[str, np.ndarray] | None = None
) -> list[tuple[str, pa.Table]]:
    """Per region, the keys it holds an unmerged version of, among ``keys`` less the rows
    ``routed`` to it (a mask per region id). A region holding a key the write routes to it is
    no conflict: asked only for the keys routed elsewhere, a region mostly rules them out by
    its bloom filters and key indexes, and takes no rows."""
    pk = list(table.primary_key)
    snapshot = take_read_snapshot(table, "strong")
    if any(r.generations for r in snapshot.regions):  # hashed once for every bloom filter
        keys = keys.append_column(HASH, pa.array(pk_hashes(keys.select(pk))))
    out = []
    with read_failures(f"key check in {table.uri}"):
        for region in region_lookups(snapshot, table.store, table.region_spec, keys):
            rid = region.region_id
            assert rid is not None  # region_lookups names each region's node
            mask = (routed or {}).get(rid)
            asked = keys if mask is None else keys.filter(pa.array(~mask))
            if asked.num_rows:
                rows = region.probe(asked).rows.select(pk)
                if rows.num_rows:
                    out.append((rid, rows))
    return out


def refuse_region_changes(table: TableState, rows: pa.RecordBatch, routing: pa.RecordBatch) -> None:
    """:class:`KeyRegionChangeError` if ``rows`` (routed by ``routing``, the same rows with
    the region columns) would give a key versions in two regions: another region holds an
    unmerged version of it, or rows of one key go to two regions.

    Example:
        ``refuse_region_changes(tbl, rows, rows)``
    """
    spec = table.region_spec
    assert spec is not None  # a table without a spec writes one region
    pk = list(table.primary_key)
    keys = pa.Table.from_batches([rows]).select(pk)
    mine, routed = [], {}
    for values, idx in spec.group_rows(routing).items():
        rid = region_id_for(spec, tuple(values))
        mine.append((rid, keys.take(idx)))
        routed[rid] = np.zeros(keys.num_rows, dtype=bool)
        routed[rid][idx] = True
    theirs = _held_elsewhere(table, keys, routed)
    if not theirs and (len(mine) == 1 or _distinct(keys)):
        return  # no other region holds them, and each key goes to one region
    shared = KeyRegions([*mine, *theirs], pk).shared()
    if shared is None:
        return
    first = shared.slice(0, 1).to_pylist()[0]
    key = ", ".join(f"{k}={first[k]!r}" for k in pk)
    raise KeyRegionChangeError(
        f"key {key} would have versions in regions {first[REGION][:8]} and "
        f"{first[OTHER_REGION][:8]} ({shared.num_rows} such key(s) in this call): a key's "
        f"region columns ({', '.join(spec.source_columns)}) must not change while a region "
        "holds an unmerged version of it. Nothing was written. Keep the key's region values, "
        "or merge its region first (tbl.flush(); tbl.merge()); then it may move"
    )


def _distinct(keys: pa.Table) -> bool:
    """Whether no key occurs twice in ``keys``."""
    if keys.num_columns == 1 and pa.types.is_integer(keys.schema.field(0).type):
        # Sorted, not hashed: Arrow's hash table takes ~90 bytes a key (bench_memory's
        # 5M-row upsert), a sorted copy 8.
        ordered = np.sort(keys.column(0).to_numpy())
        return bool((ordered[1:] != ordered[:-1]).all())
    return keys.group_by(keys.column_names, use_threads=False).aggregate([]).num_rows == (
        keys.num_rows
    )
