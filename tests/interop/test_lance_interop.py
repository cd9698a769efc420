"""Interop with Lance 14's own MemWAL implementation, both ways."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import lance
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from lance.mem_wal import LsmPointLookupPlanner, LsmScanner

import memwal_sql as mw
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.read_snapshot import take_read_snapshot
from memwal_sql.storage import layout
from tests.lsm import Model, lance_latest_rows, lance_snapshots

pytestmark = pytest.mark.interop

SCHEMA = pa.schema(
    [pa.field("id", pa.int64(), False), pa.field("v", pa.string()), pa.field("x", pa.float32())]
)


def rows(ids, tag):
    return pa.table(
        {
            "id": ids,
            "v": [f"{tag}{i}" for i in ids],
            "x": pa.array([i / 2 for i in ids], pa.float32()),
        },
        schema=SCHEMA,
    )


def write_round(tbl, model, ids: range, tag: str, delete_every: int) -> None:
    """Upsert ``ids``, then delete every ``delete_every``-th of them, in the table and model."""
    batch = rows(list(ids), tag)
    tbl.upsert(batch)
    model.upsert(batch)
    dels = pa.table({"id": list(ids[::delete_every])})
    tbl.delete(dels)
    model.delete(dels)


def test_lance_reads_what_our_writer_produced(table_root, monkeypatch):
    uri, opts = table_root
    tbl = mw.create_table(
        uri,
        rows(list(range(0, 300, 3)), "base"),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 4),
        storage_options=opts,
        writer_config=mw.WriterConfig(max_memtable_rows=120),
    )
    model = Model(["id"])
    model.upsert(rows(list(range(0, 300, 3)), "base"))
    for i in range(6):
        write_round(tbl, model, range(i * 40, i * 40 + 60), f"w{i}-", delete_every=7)
    tbl.close()
    assert len(tbl.regions()) == 4
    expected = model.table(SCHEMA)
    assert lance_latest_rows(uri, ["id"], opts) == expected

    ds = lance.dataset(uri, storage_options=opts)
    scanner = LsmScanner.from_snapshots(ds, lance_snapshots(uri, opts))
    assert scanner.filter("id < 100").count_rows() == sum(1 for k in model.rows if k[0] < 100)
    if opts:
        # Lance 14's point-lookup planner opens generations without the dataset's storage
        # options ("Failed to resolve region"); hand them over through the environment.
        for k, v in opts.items():
            monkeypatch.setenv(k.upper(), v)
    planner = LsmPointLookupPlanner(ds, lance_snapshots(uri, opts))
    for key in [0, 3, 7, 14, 41, 250, 299, 1000]:
        got = planner.plan_lookup(pa.array([key], pa.int64())).to_table().select(SCHEMA.names)
        want = model.rows.get((key,))
        assert got.to_pylist() == ([want] if want else []), key


@pytest.mark.parametrize("file_format", ["2.0", "2.2"])
def test_every_file_format_reads_the_same_through_both_readers(tmp_path, file_format):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(
        uri,
        rows(list(range(0, 200, 2)), "base"),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
        writer_config=mw.WriterConfig(max_memtable_rows=50),
        data_storage_version=file_format,
    )
    model = Model(["id"])
    model.upsert(rows(list(range(0, 200, 2)), "base"))
    for i in range(4):
        write_round(tbl, model, range(i * 30, i * 30 + 45), f"w{i}-", delete_every=11)
        if i == 1:
            tbl.flush()
            tbl.maintain()  # the base table gains merged rows and a deletion vector
    tbl.flush()
    expected = model.table(SCHEMA)
    generations = [g.uri for r in take_read_snapshot(tbl).regions for g in r.generations]
    assert generations
    for gen in generations:
        assert lance.dataset(gen).data_storage_version == file_format
    assert tbl.dataset().data_storage_version == file_format
    assert tbl.to_arrow().sort_by("id") == expected
    assert tbl.to_arrow(filter="x > 20").sort_by("id") == expected.filter(pc.field("x") > 20)
    tbl.close()
    assert lance_latest_rows(uri, ["id"]) == expected


def test_lance_shard_writer_replays_our_wal_tail(tmp_path):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, SCHEMA, primary_key="id")
    model = Model(["id"])
    w = tbl.writer()
    w.upsert(rows([1, 2, 3], "a"))
    w.flush()  # generation 1
    w.upsert(rows([2, 4], "b"))
    w.delete([1])
    model.upsert(rows([1, 2, 3], "a"))
    model.upsert(rows([2, 4], "b"))
    model.delete(pa.table({"id": [1]}))
    # Leave the tail unflushed, as a crashed writer would (with the temp files of puts it was
    # in the middle of), and let Lance claim the region.
    for d in (layout.wal_dir(w.region_id), layout.manifest_dir(w.region_id)):
        (tmp_path / "t" / d / f".{layout.bitrev64(9)}.arrow.0123456789ab.tmp").write_bytes(b"par")
    ds = lance.dataset(uri)
    with ds.mem_wal_writer(w.region_id) as lw:
        live = lw.lsm_scanner().to_table().select(SCHEMA.names).sort_by("id")
        assert live == model.table(SCHEMA)  # Lance's MemTable holds our replayed entries
        lw.put(rows([5], "lance"))
        model.upsert(rows([5], "lance"))
    m = RegionManifestStore(tbl.store, w.region_id).latest()
    assert [g.generation for g in m.flushed_generations] == [1, 2]
    assert m.writer_epoch == 2
    assert lance_latest_rows(uri, ["id"]) == model.table(SCHEMA)


LANCE_CHILD = textwrap.dedent("""
    import os, sys, lance, pyarrow as pa
    uri, rid = sys.argv[1], sys.argv[2]
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string()),
                        pa.field("x", pa.float32())])
    def rows(ids, tag):
        return pa.table({"id": ids, "v": [f"{tag}{i}" for i in ids],
                         "x": pa.array([i / 2 for i in ids], pa.float32())}, schema=schema)
    ds = lance.dataset(uri)
    with ds.mem_wal_writer(rid) as w:        # generation 1, flushed on close
        w.put(rows([1, 2, 3, 4], "l1-"))
        w.delete(pa.table({"id": [2]}))
    w = lance.dataset(uri).mem_wal_writer(rid)  # re-open: epoch 2 and a fence sentinel
    w.put(rows([3, 9], "l2-"))
    w.delete(pa.table({"id": [4]}))
    os._exit(0)                              # die with the tail only in the WAL
""")


def test_our_writer_continues_a_region_lance_wrote(tmp_path):
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, SCHEMA, primary_key="id")
    rid = str(uuid.uuid4())
    subprocess.run([sys.executable, "-c", LANCE_CHILD, uri, rid], check=True)
    model = Model(["id"])
    model.upsert(rows([1, 2, 3, 4], "l1-"))
    model.delete(pa.table({"id": [2]}))
    model.upsert(rows([3, 9], "l2-"))
    model.delete(pa.table({"id": [4]}))

    w = tbl.writer(region_id=rid)
    s = w.stats()
    assert s["writer_epoch"] == 3
    assert s["replayed_rows"] == 3  # Lance's tombstone and upserts; its sentinel is skipped
    w.upsert(rows([10, 1], "ours"))
    model.upsert(rows([10, 1], "ours"))
    w.close()
    m = RegionManifestStore(tbl.store, rid).latest()
    assert [g.generation for g in m.flushed_generations] == [1, 2]
    assert lance_latest_rows(uri, ["id"]) == model.table(SCHEMA)
    # And Lance can take the region back from us.
    with lance.dataset(uri).mem_wal_writer(rid) as lw:
        assert lw.lsm_scanner().to_table().select(SCHEMA.names).sort_by("id") == model.table(SCHEMA)


def test_lance_sees_our_mem_wal_index(tmp_path):
    uri = str(tmp_path / "t")
    mw.create_table(uri, SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 8))
    details = lance.dataset(uri).mem_wal_index_details()
    assert details["num_shards"] == 8
    (spec,) = details["sharding_specs"]
    assert spec["fields"][0]["transform"] == "bucket"
    assert spec["fields"][0]["parameters"] == {"num_buckets": "8"}
    # Lance accepts it as its own: its writer opens a shard on our table.
    with lance.dataset(uri).mem_wal_writer(str(uuid.uuid4())) as lw:
        lw.put(rows([1], "z"))
    assert lance_latest_rows(uri, ["id"]).num_rows == 1
