"""One maintenance pass end to end, on local disk and on S3 (SeaweedFS)."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.formats.region_snapshots import external_snapshot_path
from memwal_sql.maintenance.status import region_status
from tests.lsm import lance_latest_rows, layered_table

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])


def batch(ks, tag):
    return pa.table({"k": ks, "v": [f"{tag}{k}" for k in ks]}, schema=SCHEMA)


@pytest.mark.parametrize("inline", [True, False])
def test_a_maintenance_pass_leaves_the_latest_rows_on_every_store(table_root, inline, monkeypatch):
    if not inline:
        monkeypatch.setattr("memwal_sql.maintenance.index_builder.INLINE_THRESHOLD", 1)
    uri, opts = table_root
    tbl, model = layered_table(
        uri, batch, base=list(range(10)), width=8, step=4, deletes=[1, 5], storage_options=opts
    )
    tbl.upsert(batch([40], "live"))  # unflushed: survives maintenance in the MemTable
    model.upsert(batch([40], "live"))

    flushed_gens = sum(r.unmerged_generations for r in region_status(tbl))
    assert flushed_gens >= 7
    result = tbl.maintain(base_versions_older_than=timedelta(0))
    assert sum(len(g) for g in result.merge.merged.values()) == flushed_gens
    assert result.indexes.optimized == ["k_pk_btree"]
    # The merges replaced every base row (Lance drops the emptied fragment) and left one small
    # fragment per region: too few for a maintenance pass to compact.
    frags = tbl.dataset().get_fragments()
    assert result.compaction.fragments_removed == 0 and len(frags) == 2
    assert all(f.metadata.deletion_file is None for f in frags)
    assert result.snapshots.regions == 2 and result.snapshots.inline == inline
    assert sum(len(g) for g in result.gc.generations.values()) == flushed_gens
    assert all(
        r.flushed_generations == [] and r.index_catchup["k_pk_btree"] == r.merged_generation
        for r in region_status(tbl)
    )
    if not inline:
        assert tbl.store.exists(external_snapshot_path(tbl.mem_wal_details().snapshot_ts_millis))
    want = model.table(SCHEMA)
    assert tbl.to_arrow().sort_by("k") == want
    assert tbl.lookup(list(range(45))).sort_by("k") == want
    flushed = want.filter(pa.compute.field("k") != 40)
    assert tbl.to_arrow(consistency="eventual").sort_by("k") == flushed
    reopened = mw.open_table(uri, storage_options=opts)
    assert len(reopened.region_snapshots()) == 2
    assert lance_latest_rows(uri, ["k"], opts) == flushed  # Lance sees base + generations
    tbl.close()
    assert mw.open_table(uri, storage_options=opts).to_arrow().sort_by("k") == want
