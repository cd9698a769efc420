"""Writer fencing: the seed spec's Appendix 1, and a stale writer racing a new one."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql._proto.memwal_pb2 import RegionManifest
from memwal_sql.errors import WriterFencedError
from memwal_sql.formats.region_manifest import RegionManifestStore, region_uuid_bytes
from memwal_sql.formats.wal import encode_wal_entry, read_wal_entry
from memwal_sql.storage import layout
from memwal_sql.writer.rows import RowCoercer
from tests.lsm import Model, lance_latest_rows

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def rows(ids, tag):
    return pa.table({"id": ids, "v": [f"{tag}{i}" for i in ids]}, schema=SCHEMA)


def test_appendix_1_stale_writer_is_fenced_and_no_write_is_lost(table_root):
    uri, opts = table_root
    tbl = mw.create_table(uri, SCHEMA, primary_key="id", storage_options=opts)
    rid = str(uuid.uuid4())
    # Initial state of Appendix 1: manifest v1 at epoch 5, replay_after 10, last_seen 12, with
    # WAL entries 11 and 12 (epoch 5) not yet in a generation.
    manifests = RegionManifestStore(tbl.store, rid)
    m = RegionManifest(
        version=1,
        writer_epoch=5,
        replay_after_wal_entry_position=10,
        wal_entry_position_last_seen=12,
        current_generation=1,
    )
    m.region_id.uuid = region_uuid_bytes(rid)
    manifests.commit(m)
    model = Model(["id"])
    coercer = RowCoercer(tbl.schema, ["id"])
    for pos, ids in ((11, [1, 2]), (12, [3])):
        t = coercer.upserts(rows(ids, f"e5p{pos}"))
        model.upsert(rows(ids, f"e5p{pos}"))
        tbl.store.put(
            layout.wal_entry_path(rid, pos),
            encode_wal_entry([t], coercer.schema, writer_epoch=5, generation=1, position=pos),
        )

    a = tbl.writer(region_id=rid)  # steps 1-2: epoch 6, manifest v2
    assert a.epoch == 6 and a.stats()["replayed_rows"] == 3
    a.upsert(rows([4, 5], "A"))  # step 3: A's WAL entries
    a.upsert(rows([1], "A"))
    model.upsert(rows([4, 5], "A"))
    model.upsert(rows([1], "A"))

    b = tbl.writer(region_id=rid)  # steps 4-5: epoch 7
    assert b.epoch == 7 and b.stats()["replayed_rows"] == 6  # A's entries are replayed
    b.upsert(rows([6, 2], "B"))  # step 6
    model.upsert(rows([6, 2], "B"))

    with pytest.raises(WriterFencedError):  # A's next WAL put meets B's fence sentinel
        a.upsert(rows([7], "A-late"))
    with pytest.raises(WriterFencedError):  # steps 7-9: A's flush sees epoch 7 and aborts
        a.flush()
    with pytest.raises(WriterFencedError):
        a.close()
    b.upsert(rows([8], "B"))  # step 10: B continues normally
    model.upsert(rows([8], "B"))
    b.close()

    assert lance_latest_rows(uri, ["id"], opts) == model.table(SCHEMA)
    latest = manifests.latest()
    assert latest.writer_epoch == 7
    assert all(g.generation == 1 for g in latest.flushed_generations)


def test_fenced_flush_commit_leaves_the_manifest_to_the_new_writer(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    a = tbl.writer(durable_write=False, max_wal_flush_interval_ms=60_000)
    a.upsert(rows([1], "A"))
    a._wal.flush()  # A's row is in the WAL (acknowledged) but not in a generation
    b = tbl.writer(region_id=a.region_id)
    with pytest.raises(WriterFencedError):
        a.flush()
    b.close()
    assert lance_latest_rows(str(tmp_path), ["id"]).to_pylist() == [{"id": 1, "v": "A1"}]


def test_replay_refuses_entries_of_a_newer_epoch(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    w.upsert(rows([1], "x"))
    rid = w.region_id
    # Someone with a far newer epoch wrote the next entry: opening must refuse, not replay it.
    coercer = RowCoercer(tbl.schema, ["id"])
    pos = w.stats()["next_wal_position"]
    tbl.store.put(
        layout.wal_entry_path(rid, pos),
        encode_wal_entry(
            [coercer.upserts(rows([2], "y"))],
            coercer.schema,
            writer_epoch=99,
            generation=1,
            position=pos,
        ),
    )
    with pytest.raises(WriterFencedError):
        tbl.writer(region_id=rid)
    assert read_wal_entry(tbl.store, rid, pos).writer_epoch == 99  # nothing was deleted


def test_claim_alone_fences_the_previous_writer(table_root):
    # The new writer has not written anything yet: only its fence sentinel at the first free
    # WAL position stops the stale writer's next put from landing after the replayed tail,
    # where it would be acknowledged and yet belong to no writer.
    uri, opts = table_root
    tbl = mw.create_table(uri, SCHEMA, primary_key="id", storage_options=opts)
    a = tbl.writer()
    a.upsert(rows([1, 2], "A"))
    a.upsert(rows([3], "A"))
    b = tbl.writer(region_id=a.region_id)
    assert b.epoch == a.epoch + 1 and b.stats()["replayed_rows"] == 3
    sentinel = read_wal_entry(tbl.store, a.region_id, b.stats()["next_wal_position"] - 1)
    assert sentinel.is_sentinel and sentinel.writer_epoch == b.epoch
    with pytest.raises(WriterFencedError):
        a.upsert(rows([3, 4], "A-late"))
    with pytest.raises(WriterFencedError):
        a.close()
    b.close()
    # A later writer replays whatever the WAL still holds after B's generation: A's late rows
    # must not be there either.
    tbl.writer(region_id=a.region_id).close()
    assert lance_latest_rows(uri, ["id"], opts).to_pylist() == [
        {"id": 1, "v": "A1"},
        {"id": 2, "v": "A2"},
        {"id": 3, "v": "A3"},
    ]
