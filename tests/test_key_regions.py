"""The primary key holds: one region per key, and each key once in the base table.

A key whose region columns change would have versions in two regions, and the region merged
last would win (the spec's data-corruption case). Region specs on non-key columns are refused
at create; a table that has one anyway (opted in, or made by Lance) refuses routed writes that
move a key too early, and reads, merges and ``verify`` detect a key in two regions.
"""

from __future__ import annotations

import datetime as dt
import uuid

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import (
    DuplicateKeyError,
    InvalidRegionSpecError,
    KeyInTwoRegionsError,
    KeyRegionChangeError,
)
from memwal_sql.partitioning.region_spec import RegionField, region_id_for
from tests.lsm import lance_latest_rows

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("ts", pa.timestamp("us")),
        pa.field("tenant", pa.string()),
        pa.field("day", pa.int32()),
        pa.field("v", pa.string()),
    ]
)
JAN1, JAN2 = dt.datetime(2024, 1, 1, 9), dt.datetime(2024, 1, 2, 9)
# The three specs, and a row of key 1 in two of their regions each.
SPECS = {
    "day": (lambda: mw.RegionSpec.day("ts"), {"ts": JAN1}, {"ts": JAN2}),
    "identity": (lambda: mw.RegionSpec.identity("tenant"), {"tenant": "a"}, {"tenant": "b"}),
    "bucket_of_a_non_key": (lambda: mw.RegionSpec.bucket("day", 4), {"day": 1}, {"day": 2}),
}


def row(key: int, v: str, **cols: object) -> pa.Table:
    values = {"id": key, "ts": JAN1, "tenant": "a", "day": 1, "v": v, **cols}
    return pa.Table.from_pylist([values], schema=SCHEMA)


def opted_in(tmp_path, spec: mw.RegionSpec) -> mw.MemWalTable:
    return mw.create_table(
        str(tmp_path / "t"),
        SCHEMA,
        primary_key="id",
        region_spec=spec,
        allow_non_key_region_spec=True,
    )


@pytest.mark.parametrize("name", sorted(SPECS))
def test_create_refuses_a_spec_on_columns_outside_the_key(tmp_path, name):
    spec = SPECS[name][0]()
    with pytest.raises(InvalidRegionSpecError, match="outside the primary key"):
        mw.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id", region_spec=spec)
    assert not (tmp_path / "t").exists()  # nothing was written
    if name == "day":
        return  # a timestamp cannot be part of a key (Lance 14 indexes no such key)
    # With the column in the key, the same spec is safe.
    tbl = mw.create_table(
        str(tmp_path / "k"), SCHEMA, primary_key=["id", *spec.source_columns], region_spec=spec
    )
    assert tbl.region_spec is not None
    tbl.close()


def test_enabling_memwal_refuses_a_spec_on_columns_outside_the_key(tmp_path):
    uri = str(tmp_path / "t")
    lance.write_dataset(row(1, "x"), uri)
    with pytest.raises(InvalidRegionSpecError):
        mw.create_table(uri, None, primary_key="id", region_spec=mw.RegionSpec.identity("tenant"))
    assert lance.dataset(uri).mem_wal_index_details() is None


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_routed_write_that_moves_a_key_is_refused(tmp_path, name):
    make, old, new = SPECS[name]
    tbl = opted_in(tmp_path, make())
    tbl.upsert(row(1, "first", **old))
    with pytest.raises(KeyRegionChangeError, match="id=1"):
        tbl.upsert(row(1, "second", **new))
    # Nothing of the refused call was written: one row, the first.
    assert tbl.to_arrow(["id", "v"]).to_pylist() == [{"id": 1, "v": "first"}]
    assert tbl.lookup([1], columns=["v"]).to_pylist() == [{"id": 1, "v": "first"}]
    # A delete routed to the wrong region is refused too.
    with pytest.raises(KeyRegionChangeError):
        tbl.delete(row(1, "", **new).select(["id", *tbl.region_spec.source_columns]))
    # Once the old region is merged, the key may move: its only other version is in the base.
    tbl.flush()
    tbl.merge()
    tbl.upsert(row(1, "second", **new))
    assert tbl.to_arrow(["id", "v"]).to_pylist() == [{"id": 1, "v": "second"}]
    tbl.flush()
    assert tbl.maintain().ok
    assert tbl.to_arrow(["id", "v"]).to_pylist() == [{"id": 1, "v": "second"}]
    tbl.close()
    assert lance_latest_rows(str(tmp_path / "t"), ["id"]).column("v").to_pylist() == ["second"]


def test_one_call_with_a_key_in_two_regions_is_refused(tmp_path):
    tbl = opted_in(tmp_path, mw.RegionSpec.day("ts"))
    with pytest.raises(KeyRegionChangeError):
        tbl.upsert(pa.concat_tables([row(1, "a", ts=JAN1), row(2, "b"), row(1, "c", ts=JAN2)]))
    assert tbl.count_rows() == 0
    tbl.close()


def test_a_deleted_key_moves_only_once_its_delete_is_merged(tmp_path):
    tbl = opted_in(tmp_path, mw.RegionSpec.day("ts"))
    tbl.upsert(row(1, "first", ts=JAN1))
    tbl.delete(row(1, "").select(["id", "ts"]))
    # Its tombstone is an unmerged version in the old region: merging both in either order
    # would decide whether the key exists.
    with pytest.raises(KeyRegionChangeError):
        tbl.upsert(row(1, "again", ts=JAN2))
    tbl.flush()
    tbl.merge()
    tbl.upsert(row(1, "again", ts=JAN2))
    assert tbl.to_arrow(["id", "v"]).to_pylist() == [{"id": 1, "v": "again"}]
    tbl.close()


def two_regions_hold_key_1(tmp_path) -> tuple[mw.MemWalTable, str, str]:
    """Versions of key 1 in two regions, through explicit region writers (not checked): the
    older one flushed, the newer one only in its WAL (its writer died); another key flushed
    in a third region."""
    tbl = opted_in(tmp_path, mw.RegionSpec.day("ts"))
    spec = tbl.region_spec
    old, new = region_id_for(spec, (1,)), region_id_for(spec, (2,))
    with tbl.writer(region_values=(1,)) as w:
        w.upsert(pa.concat_tables([row(1, "first", ts=JAN1), row(5, "five", ts=JAN1)]))
    w = tbl.writer(region_values=(2,))
    w.upsert(row(1, "second", ts=JAN2))
    w.release()  # as a dying process: no flush
    with tbl.writer(region_values=(3,)) as w:
        w.upsert(row(7, "seven", ts=dt.datetime(2024, 1, 3)))
    return tbl, old, new


def test_reads_of_a_key_in_two_regions_fail(tmp_path):
    tbl, _, _ = two_regions_hold_key_1(tmp_path)
    ctx = mw.connect()
    ctx.register("t", tbl)
    reads = {
        "to_arrow": lambda: tbl.to_arrow(),
        "lookup": lambda: tbl.lookup([1]),
        "count": lambda: tbl.count_rows(),
        # The filter prunes the newer version's region: the older must not be returned.
        "pruned": lambda: tbl.to_arrow(filter="ts < TIMESTAMP '2024-01-01 23:00:00'"),
        "sql": lambda: ctx.sql("SELECT * FROM t WHERE v <> 'x'").to_arrow_table(),
        "sql lookup": lambda: ctx.sql("SELECT * FROM t WHERE id IN (1, 5)").to_arrow_table(),
        "other_process": lambda: mw.open_table(tbl.uri).to_arrow(),
    }
    for name, read in reads.items():
        with pytest.raises(KeyInTwoRegionsError, match="id=1"):
            read()
            pytest.fail(name)
    # A lookup of other keys is unambiguous: it answers.
    assert tbl.lookup([5, 7], columns=["v"]).to_pylist() == [
        {"id": 5, "v": "five"},
        {"id": 7, "v": "seven"},
    ]
    tbl.close()


def test_a_merge_leaves_a_key_in_two_regions_unmerged_and_an_ordered_merge_repairs_it(tmp_path):
    tbl, old, new = two_regions_hold_key_1(tmp_path)
    w = tbl.writer(region_id=new)  # flushes the newer version's WAL tail
    w.close()
    with pytest.raises(KeyInTwoRegionsError):
        tbl.merge()
    # The third region merged; key 1's regions did not (their order is unknown).
    merged = tbl.merged_generations()
    assert old not in merged and new not in merged and len(merged) == 1
    report = tbl.verify()
    assert [p.error for p in report.problems] == ["KeyInTwoRegionsError"]
    # The user knows the order of the writes: the old region first, the newer last.
    tbl.merge(regions=[old, new])
    assert tbl.verify().ok
    got = tbl.to_arrow(["id", "v"]).sort_by("id").to_pylist()
    assert got == [{"id": 1, "v": "second"}, {"id": 5, "v": "five"}, {"id": 7, "v": "seven"}]
    tbl.close()


def test_an_ordered_merge_needs_the_versions_flushed(tmp_path, capsys):
    from memwal_sql.cli import main

    tbl, old, new = two_regions_hold_key_1(tmp_path)  # the newer version is unflushed
    with pytest.raises(mw.errors.InvalidInputError, match="unflushed"):
        tbl.merge(regions=[old, new])
    assert tbl.merged_generations() == {}
    tbl.writer(region_id=new).close()  # flushed
    with pytest.raises(SystemExit):
        main(["merge", tbl.uri])
    assert "--region" in capsys.readouterr().err  # the error says how to merge them
    main(["merge", tbl.uri, "--region", old, "--region", new])
    assert "merged 2 generation(s) from 2 region(s)" in capsys.readouterr().out
    assert tbl.lookup([1], columns=["v"]).to_pylist() == [{"id": 1, "v": "second"}]
    tbl.close()


def test_lance_written_regions_sharing_a_key_are_detected(tmp_path):
    """Lance 14 makes an identity spec on a non-key column, and its writer puts key 1 in two
    shards: our reads and verify see it."""
    uri = str(tmp_path / "t")
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False, {"lance-schema:unenforced-primary-key": "true"}),
            pa.field("tenant", pa.string()),
            pa.field("v", pa.string()),
        ]
    )
    ds = lance.write_dataset(pa.table({"id": [9], "tenant": ["z"], "v": ["base"]}, schema), uri)
    ds.initialize_mem_wal(identity_column="tenant")
    for shard, tenant, v in ((str(uuid.uuid4()), "a", "first"), (str(uuid.uuid4()), "b", "2nd")):
        with lance.dataset(uri).mem_wal_writer(shard) as w:
            w.put(pa.table({"id": [1], "tenant": [tenant], "v": [v]}, schema))
    tbl = mw.open_table(uri)
    with pytest.raises(KeyInTwoRegionsError):
        tbl.to_arrow()
    with pytest.raises(KeyInTwoRegionsError):
        tbl.lookup([1])
    assert [p.error for p in tbl.verify().problems] == ["KeyInTwoRegionsError"]


def test_key_routed_specs_never_check_every_key(tmp_path, monkeypatch):
    import exec_nodes.regions

    def boom(*a, **k):
        raise AssertionError("checked a key-routed table")

    monkeypatch.setattr(exec_nodes.regions.KeyRegions, "__init__", boom)
    spec = mw.RegionSpec.compose(
        RegionField.identity("tenant"), RegionField.bucket("id", 2, field_id="b")
    )
    tbl = mw.create_table(
        str(tmp_path / "t"), SCHEMA, primary_key=["tenant", "id"], region_spec=spec
    )
    tbl.upsert(pa.concat_tables([row(i, "x", tenant=t) for i in range(4) for t in "ab"]))
    tbl.flush()
    tbl.upsert(row(1, "y", tenant="b"))
    assert tbl.count_rows() == 8
    keys = pa.table({"tenant": ["a", "b", "a", "b"], "id": [0, 1, 2, 3]})
    assert tbl.lookup(keys).num_rows == 4  # found in several regions, each asked its own keys
    tbl.merge()
    tbl.close()


# ---- duplicate keys at create ------------------------------------------------------------------


def test_create_keeps_the_last_row_of_a_repeated_key(tmp_path):
    """The issue's case: the base held key 1 twice, and a merge then updated both rows."""
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, {"id": [1, 1, 2], "v": ["a", "b", "c"]}, primary_key="id")
    assert tbl.to_arrow().sort_by("id").to_pylist() == [{"id": 1, "v": "b"}, {"id": 2, "v": "c"}]
    tbl.upsert({"id": [1], "v": ["new"]})
    tbl.flush()
    assert tbl.maintain().ok
    assert tbl.dataset().to_table().sort_by("id").to_pylist() == [
        {"id": 1, "v": "new"},
        {"id": 2, "v": "c"},
    ]
    assert tbl.verify().ok
    tbl.close()


def test_enabling_memwal_on_a_table_with_repeated_keys_is_refused(tmp_path):
    uri = str(tmp_path / "t")
    lance.write_dataset(pa.table({"id": [1, 1, 2, 3, 3], "v": list("abcde")}), uri)
    with pytest.raises(DuplicateKeyError, match=r"2 primary key\(s\).*'id': 1"):
        mw.create_table(uri, None, primary_key="id")
    ds = lance.dataset(uri)  # untouched: no MemWAL, no key metadata
    assert ds.mem_wal_index_details() is None
    assert ds.lance_schema.unenforced_primary_key() == []


def test_verify_reports_keys_the_base_holds_twice(tmp_path):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, {"id": np.arange(10), "v": ["x"] * 10}, primary_key="id")
    assert tbl.verify().ok
    lance.write_dataset(tbl.dataset().to_table().slice(3, 2), uri, mode="append")
    report = tbl.verify()
    assert [(p.kind, p.error) for p in report.problems] == [("keys", "CorruptTableError")]
    assert "2 key(s) more than once" in report.problems[0].message
    tbl.close()


def test_searches_of_a_key_in_two_regions_fail(tmp_path):
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), False),
            pa.field("tenant", pa.string()),
            pa.field("body", pa.string()),
            pa.field("vec", pa.list_(pa.float32(), 2)),
        ]
    )

    def doc(key: int, tenant: str, body: str, x: float) -> pa.Table:
        return pa.table(
            {"id": [key], "tenant": [tenant], "body": [body], "vec": [[x, x]]}, schema=schema
        )

    tbl = mw.create_table(
        str(tmp_path / "t"),
        pa.concat_tables([doc(i, "a", f"filler {i}", 10.0 + i) for i in range(2, 20)]),
        primary_key="id",
        region_spec=mw.RegionSpec.identity("tenant"),
        allow_non_key_region_spec=True,
    )
    tbl.create_index("body", "INVERTED")
    with tbl.writer(region_values=("a",)) as w:
        w.upsert(doc(1, "a", "heron estuary", 0.0))
    with tbl.writer(region_values=("b",)) as w:
        w.upsert(doc(1, "b", "heron river", 0.1))
    with pytest.raises(KeyInTwoRegionsError):
        tbl.vector_search([0.0, 0.0], k=3)
    with pytest.raises(KeyInTwoRegionsError):
        tbl.fts("heron", k=3)
    tbl.close()


def test_a_merge_takes_only_the_generations_its_check_saw(tmp_path, monkeypatch):
    """A region that flushes a key after the merger's check (an explicit writer, another
    process) waits for the next pass: merged in this one, before a region the check saw
    holding the key, its newer version would lose."""
    import memwal_sql.maintenance.merger as merger

    tbl = opted_in(tmp_path, mw.RegionSpec.day("ts"))
    spec = tbl.region_spec
    # The older version's region sorts after the newer's, so a merge in region order would
    # let the older win.
    days = sorted(range(1, 29), key=lambda d: region_id_for(spec, (d,)))
    newer_day, older_day = days[0], days[-1]
    older_ts, newer_ts = dt.datetime(2024, 1, older_day), dt.datetime(2024, 1, newer_day)
    with tbl.writer(region_values=(older_day,)) as w:
        w.upsert(row(1, "older", ts=older_ts))
    with tbl.writer(region_values=(newer_day,)) as w:  # the region exists before the merge
        w.upsert(row(2, "other", ts=newer_ts))
    checked = merger.keys_in_two_regions_of

    def check_then_race(snapshot, spec):
        found = checked(snapshot, spec)
        with tbl.writer(region_values=(newer_day,)) as w:  # lands after the check
            w.upsert(row(1, "newer", ts=newer_ts))
        return found

    monkeypatch.setattr(merger, "keys_in_two_regions_of", check_then_race)
    tbl.merge()
    monkeypatch.undo()
    base = tbl.dataset().to_table(columns=["id", "v"]).sort_by("id").to_pylist()
    assert base == [{"id": 1, "v": "older"}, {"id": 2, "v": "other"}]
    tbl.merge()
    want = [{"id": 1, "v": "newer"}, {"id": 2, "v": "other"}]
    assert tbl.to_arrow(["id", "v"]).sort_by("id").to_pylist() == want
    assert tbl.dataset().to_table(columns=["id", "v"]).sort_by("id").to_pylist() == want
    tbl.close()


def test_the_write_check_asks_each_region_only_for_keys_the_write_routes_elsewhere(
    tmp_path, monkeypatch
):
    # A key its own region holds is no conflict: asking a region for it would only take its
    # rows. Each of four regions is asked for the three quarters of the keys routed elsewhere.
    from exec_nodes.lookup import CoalesceFirstExec

    tbl = opted_in(tmp_path, mw.RegionSpec.identity("tenant"))
    ids = list(range(100))
    data = pa.Table.from_pylist(
        [{"id": i, "ts": JAN1, "tenant": "abcd"[i % 4], "day": 1, "v": "x"} for i in ids],
        schema=SCHEMA,
    )
    tbl.upsert(data)
    asked: dict[str, set[int]] = {}
    probe = CoalesceFirstExec.probe

    def spy(self, keys):
        asked[self.region_id] = set(keys.column("id").to_pylist())
        return probe(self, keys)

    monkeypatch.setattr(CoalesceFirstExec, "probe", spy)
    tbl.upsert(data)  # the same tenants: allowed
    assert len(asked) == 4 and all(len(keys) == 75 for keys in asked.values())
    tenants = {frozenset("abcd"[i % 4] for i in ids if i not in keys) for keys in asked.values()}
    assert tenants == {frozenset(t) for t in "abcd"}  # each region: all but its own tenant's
    moved = data.slice(0, 1).set_column(2, "tenant", pa.array(["b"]))  # key 0: a -> b
    with pytest.raises(KeyRegionChangeError):
        tbl.upsert(moved)
    tbl.close()
