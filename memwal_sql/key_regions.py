"""One region per key, on the write side: refuse a write that would give a key unmerged
versions in two regions.

Only a table whose region spec reads non-key columns (Lance lets one be made; memwal-sql's
``create_table`` asks for ``allow_non_key_region_spec=True``) can get there: a write that
changes a key's region columns while its old region still holds an unmerged version of it.
Routed writes (``tbl.upsert``, ``tbl.delete``) probe every region for their keys first, as a
point lookup does without the base table: the MemTables of this process, the WAL tails of the
other regions, and the generations behind their bloom filters. A writer of another process
that has not stored its rows yet is not seen, nor are writes through an explicit region
writer; reads and merges check again (:mod:`planner.regions`).

Example:
    ``tbl.upsert(rows)  # KeyRegionChangeError if a key of rows moved region too early``
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from exec_nodes.regions import OTHER_REGION, REGION, KeyRegions
from memwal_sql.errors import KeyRegionChangeError
from memwal_sql.partitioning.region_spec import region_id_for
from memwal_sql.read_snapshot import take_read_snapshot
from memwal_sql.session import read_failures
from planner.lookup import region_lookups

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState

REGION_ID = "region_id"


def unmerged_regions(table: TableState, keys: pa.Table) -> pa.Table:
    """The regions holding an unmerged version (a row or a tombstone) of each of ``keys`` (a
    table of the key columns): the key columns and ``region_id``, a row per key and region.

    Example:
        ``unmerged_regions(tbl, pa.table({"id": [1, 2]}))``
    """
    pk = list(table.primary_key)
    snapshot = take_read_snapshot(table, "strong")
    found = [keys.select(pk).slice(0, 0).append_column(REGION_ID, pa.array([], pa.string()))]
    with read_failures(f"key check in {table.uri}"):
        for region in region_lookups(snapshot, table.store, table.region_spec, keys.select(pk)):
            assert region.keys is not None  # region_lookups binds each region's keys
            rows = region.probe(region.keys).rows.select(pk)
            region_ids = pa.array([region.region_id] * rows.num_rows, pa.string())
            found.append(rows.append_column(REGION_ID, region_ids))
    return pa.concat_tables(found)


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
    mine = [
        (region_id_for(spec, tuple(values)), keys.take(idx))
        for values, idx in spec.group_rows(routing).items()
    ]
    held = unmerged_regions(table, keys)
    theirs = [
        (rid, held.filter(pc.equal(held[REGION_ID], rid)).select(pk))
        for rid in pc.unique(held[REGION_ID]).to_pylist()
    ]
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
