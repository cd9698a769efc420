"""``tbl.maintenance`` and MaintenanceConfig: one config, given to the table or to a call."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import InvalidInputError
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.maintenance import MaintenanceConfig, MergeResult, RegionStatus, region_status

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])


def batch(ks: list[int], seed: int) -> pa.Table:
    return pa.table({"k": ks, "v": [f"v{k}-{seed}" for k in ks]}, schema=SCHEMA)


@pytest.mark.parametrize(
    "setting",
    [
        {"keep_manifest_versions": -1},
        {"base_versions_older_than": 3600},
        {"target_rows_per_fragment": 0},
        {"deletion_threshold": 1.5},
        {"small_fragment_trigger": 0},
        {"max_generations_per_region": 0},
    ],
)
def test_a_config_refuses_a_setting_out_of_range(setting):
    with pytest.raises(InvalidInputError, match=next(iter(setting))):
        MaintenanceConfig(**setting)


def test_updated_changes_only_the_settings_given():
    cfg = MaintenanceConfig(keep_manifest_versions=3)
    changed = cfg.updated(deletion_threshold=0.0, keep_manifest_versions=None)
    assert changed == MaintenanceConfig(keep_manifest_versions=3, deletion_threshold=0.0)
    assert cfg.deletion_threshold == MaintenanceConfig().deletion_threshold  # frozen: unchanged
    with pytest.raises(InvalidInputError, match="no setting"):
        cfg.updated(keep_versions=2)
    with pytest.raises(InvalidInputError, match="deletion_threshold"):
        cfg.updated(deletion_threshold=-0.1)


def test_the_short_entries_keep_their_one_default():
    assert MaintenanceConfig().keep_manifest_versions == 10
    assert mw.MaintenanceConfig is MaintenanceConfig


def three_generations(uri: str, **open_args: object) -> mw.MemWalTable:
    tbl = mw.create_table(uri, SCHEMA, primary_key="k", **open_args)
    with tbl.writer() as w:
        for i in range(3):
            w.upsert(batch([i, 10 + i], i))
            w.flush()
    return tbl


def test_the_tables_config_governs_every_call_unless_one_brings_its_own(tmp_path):
    cfg = MaintenanceConfig(max_generations_per_region=1, keep_manifest_versions=2)
    tbl = three_generations(str(tmp_path), maintenance=cfg)
    assert tbl.maintenance.config is cfg
    (rid,) = tbl.regions()
    manifests = RegionManifestStore(tbl.store, rid)

    first = tbl.merge()  # the short entry: the table's config, one generation per region
    assert isinstance(first, MergeResult) and first.merged == {rid: [1]}
    assert tbl.maintenance.merge().merged == {rid: [2]}
    rest = tbl.maintenance.merge(MaintenanceConfig())  # a call's own config: no limit
    assert rest.merged == {rid: [3]}

    tbl.catch_up_indexes()
    before = len(manifests.list_versions())
    assert before > 3
    # keep_manifest_versions=0 keeps them all; the table's 2 applies to the next call.
    assert tbl.maintenance.gc(cfg.updated(keep_manifest_versions=0)).manifest_versions == 0
    assert len(manifests.list_versions()) == before
    assert tbl.gc().manifest_versions == before - 2
    assert len(manifests.list_versions()) == 2

    tbl.maintenance.config = MaintenanceConfig(deletion_threshold=0.0)
    assert tbl.maintain(base_versions_older_than=timedelta(0)).ok
    assert tbl.maintenance.config == MaintenanceConfig(deletion_threshold=0.0)  # unchanged
    tbl.close()

    reopened = mw.open_table(str(tmp_path))
    assert reopened.maintenance.config == MaintenanceConfig()  # not stored with the table
    assert reopened.to_arrow().sort_by("k") == pa.concat_tables(
        [batch([i], i) for i in range(3)] + [batch([10 + i], i) for i in range(3)]
    ).sort_by("k")


def test_status_and_verify_come_through_the_namespace(tmp_path):
    tbl = three_generations(str(tmp_path))
    (status,) = tbl.maintenance.status()
    assert isinstance(status, RegionStatus)
    (direct,) = region_status(tbl)
    assert (status.region_id, status.flushed_generations) == (
        direct.region_id,
        direct.flushed_generations,
    )
    assert (status.unmerged_generations, status.unmerged_rows) == (3, 6)
    tbl.maintenance.run()
    (after,) = tbl.maintenance.status()
    assert (after.unmerged_generations, after.merged_generation) == (0, 3)
    seen: list[int] = []
    report = tbl.maintenance.verify(seen.append)
    assert report.ok and sum(seen) > 0
