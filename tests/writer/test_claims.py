"""Claims take bounded time: a new writer fences one that appends flat out (how long it takes is
measured by ``benchmarks/bench_write.py``'s claim lines)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

import memwal_sql as mw

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])

# Single-row durable upserts as fast as they go; each id is printed once acknowledged.
_APPENDER = textwrap.dedent("""
    import sys
    import memwal_sql as mw
    from memwal_sql.errors import WriterFencedError
    w = mw.open_table(sys.argv[1]).writer(region_id=sys.argv[2], durable_write=True)
    i = 0
    try:
        while True:
            w.upsert({"id": [i], "v": ["a"]})
            print(i, flush=True)
            i += 1
    except WriterFencedError:
        print("FENCED", flush=True)
""")


def test_a_claim_fences_a_writer_doing_flat_out_durable_puts(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    with tbl.writer() as w:
        w.upsert({"id": [-1], "v": ["first"]})
        rid = w.region_id
    child = subprocess.Popen(
        [sys.executable, "-c", _APPENDER, str(tmp_path), rid], stdout=subprocess.PIPE, text=True
    )
    try:
        acked = []
        while len(acked) < 300:  # well into its stride
            line = child.stdout.readline()
            assert line, "the appending writer died"
            acked.append(int(line))
        claimer = mw.open_table(str(tmp_path)).writer(region_id=rid)
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    lines = out.split()
    assert lines[-1] == "FENCED"  # its next put met the sentinel
    acked += [int(x) for x in lines[:-1]]
    claimer.upsert({"id": [10**9], "v": ["claimer"]})
    claimer.close()
    ids = set(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist())
    assert set(acked) | {-1, 10**9} <= ids


def test_a_claim_that_loses_races_leaps_ahead_and_leaves_no_hole(tmp_path, monkeypatch):
    # The previous writer wins the first three races for the sentinel's position (simulated:
    # its entry lands just before each attempt). After each, the claim looks for the first
    # free position past it and leaps 1, 3, then 7 positions beyond, wins, and fills every
    # position it leapt over with a sentinel.
    from memwal_sql.errors import WriterFencedError
    from memwal_sql.formats.wal import encode_wal_entry, wal_positions
    from memwal_sql.storage import ObjectStore, layout
    from memwal_sql.writer.rows import RowCoercer

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    old = tbl.writer()
    old.upsert({"id": [1], "v": ["old"]})
    rid, first = old.region_id, old.stats()["next_wal_position"]
    coercer = RowCoercer(tbl.schema, ["id"])
    real_put = ObjectStore.put_if_not_exists
    raced = []

    def put(self, path, data, **kw):
        if path.startswith(layout.wal_dir(rid)) and len(raced) < 3:
            position = layout.parse_bitrev64(path)
            ids = [100 + len(raced)]
            raced.append(position)
            real_put(
                self,
                path,
                encode_wal_entry(
                    [coercer.upserts(pa.table({"id": ids, "v": ["raced"]}, schema=SCHEMA))],
                    coercer.schema,
                    writer_epoch=old.epoch,
                    generation=1,
                    position=position,
                ),
                checksummed=True,
            )
        return real_put(self, path, data, **kw)

    monkeypatch.setattr(ObjectStore, "put_if_not_exists", put)
    claimer = mw.open_table(str(tmp_path)).writer(region_id=rid)
    monkeypatch.undo()
    assert raced == [first, first + 2, first + 6]
    sentinel = claimer.stats()["next_wal_position"] - 1
    assert sentinel == first + 14
    assert wal_positions(tbl.store, rid)[-(sentinel - first + 1) :] == list(
        range(first, sentinel + 1)
    )  # no hole
    assert claimer.stats()["replayed_rows"] == 4
    with pytest.raises(WriterFencedError):
        old.upsert({"id": [2], "v": ["late"]})
    claimer.close()
    assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [
        1,
        100,
        101,
        102,
    ]


def _acked_writer(tmp_path, ids):
    """A table whose writer acknowledged one entry per id, then died (its WAL left as it was);
    returns the table, the region id and the writer's last WAL position."""
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    w = tbl.writer()
    for i in ids:
        w.upsert({"id": [i], "v": ["a"]})
    w.release()
    return tbl, w.region_id, w.stats()["next_wal_position"] - 1


def _unchecksummed_entry(tbl, rid, position, ids, epoch):
    """Put an entry as Lance's writer writes it: no memwal-sql checksum, never fsynced."""
    from memwal_sql.storage import layout
    from memwal_sql.writer.rows import RowCoercer

    batch = RowCoercer(tbl.schema, ["id"]).upserts(pa.table({"id": ids, "v": ["lance"] * len(ids)}))
    sink = pa.BufferOutputStream()
    schema = batch.schema.with_metadata({"writer_epoch": str(epoch), "generation": "1"})
    with pa.ipc.new_stream(sink, schema) as stream:
        stream.write_batch(batch)
    tbl.store.put(layout.wal_entry_path(rid, position), sink.getvalue().to_pybytes())


def test_a_claim_syncs_only_what_may_not_be_durable_before_it_appends(tmp_path, monkeypatch):
    # memwal-sql's writers fsync every entry they put, so of a previous writer only its last
    # entry may not be durable (it may have died between the rename and the fsync of its put);
    # Lance's writer never fsyncs, and a claim puts its sentinel without one. The claim syncs
    # those, and only those, before it records its sentinel in the manifest (and appends):
    # a few fsyncs however long the WAL tail, not one per entry.
    from memwal_sql.storage import layout

    tbl, rid, last = _acked_writer(tmp_path, range(1, 6))
    _unchecksummed_entry(tbl, rid, last + 1, [6], epoch=1)
    synced = []
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1]
    )
    w2 = mw.open_table(str(tmp_path)).writer(region_id=rid)
    monkeypatch.undo()
    sentinel = w2.stats()["next_wal_position"] - 1

    def path(p):
        return os.path.realpath(os.path.join(tbl.store.uri, layout.wal_entry_path(rid, p)))

    wal = [f for f in synced if "/wal/" in f]
    assert set(wal) == {path(last), path(last + 1), path(sentinel)}
    assert w2.stats()["claim_synced_entries"] == 3
    manifests = [i for i, f in enumerate(synced) if "/manifest/" in f]
    assert max(synced.index(f) for f in wal) < manifests[-1]  # then last_seen is recorded
    assert w2.stats()["replayed_rows"] == 6
    w2.close()


def _unfinished_claim(tbl, rid, sentinel):
    """A claim that put its sentinel at ``sentinel`` (leaping ahead of the previous writer) and
    was killed before it filled the positions it leapt over or recorded the sentinel."""
    from memwal_sql.formats.region_manifest import RegionManifestStore, claim_region
    from memwal_sql.formats.wal import encode_fence_sentinel
    from memwal_sql.storage import layout

    epoch = claim_region(RegionManifestStore(tbl.store, rid), region_spec_id=0).writer_epoch
    tbl.store.put_if_not_exists(
        layout.wal_entry_path(rid, sentinel), encode_fence_sentinel(epoch, sentinel)
    )


def test_holes_an_unfinished_claim_leapt_over_are_not_lost_writes(tmp_path):
    # The previous writer (still alive) acknowledged ids 1-3. A claim leapt two positions
    # ahead of it and was killed before it filled them. Readers read on, the previous writer
    # may still write into them (acknowledged, so the next claim replays it), and the next
    # claim fills the rest: nothing acknowledged is lost, and nothing after the fence is
    # acknowledged. Once that claim recorded its sentinel, a hole below it is a lost write.
    from memwal_sql.errors import MissingWalEntryError, WriterFencedError
    from memwal_sql.formats.wal import read_wal_entry, wal_positions
    from memwal_sql.storage import layout

    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="id")
    old = tbl.writer()
    for i in (1, 2, 3):
        old.upsert({"id": [i], "v": ["old"]})
    rid, last = old.region_id, old.stats()["next_wal_position"] - 1
    _unfinished_claim(tbl, rid, last + 3)
    reader = mw.open_table(str(tmp_path))
    assert sorted(reader.to_arrow().column("id").to_pylist()) == [1, 2, 3]
    assert mw.open_table(str(tmp_path)).verify().ok
    old.upsert({"id": [4], "v": ["old"]})  # into the first hole, acknowledged
    claimer = mw.open_table(str(tmp_path)).writer(region_id=rid)
    assert claimer.stats()["replayed_rows"] == 4
    filled = read_wal_entry(tbl.store, rid, last + 2)
    assert filled.is_sentinel and filled.writer_epoch == claimer.epoch
    with pytest.raises(WriterFencedError):
        old.upsert({"id": [5], "v": ["late"]})
    sentinel = claimer.stats()["next_wal_position"] - 1
    claimer.upsert({"id": [6], "v": ["new"]})
    claimer.release()  # its rows stay in the WAL tail
    assert set(range(last, sentinel + 2)) <= set(wal_positions(tbl.store, rid))  # no hole
    assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [
        1,
        2,
        3,
        4,
        6,
    ]
    # The finished claim recorded its sentinel: a hole below it now is a lost write.
    tbl.store.delete(layout.wal_entry_path(rid, last + 2))
    with pytest.raises(MissingWalEntryError):
        mw.open_table(str(tmp_path)).to_arrow()
    with pytest.raises(MissingWalEntryError):
        mw.open_table(str(tmp_path)).writer(region_id=rid)
    assert not mw.open_table(str(tmp_path)).verify().ok


def test_a_put_torn_by_a_machine_crash_during_a_claim_is_left_out(tmp_path):
    # The machine crashed while a claim was under way: the previous writer's last put (never
    # acknowledged) is torn, and the claim's sentinel after it survived. Readers leave the torn
    # entry out; the next claim sets it aside and takes its position.
    from memwal_sql.errors import TornWalEntryWarning
    from tests.formats.test_wal import torn

    tbl, rid, last = _acked_writer(tmp_path, (1, 2, 3, 4))
    torn(tbl.store, rid, last)
    _unfinished_claim(tbl, rid, last + 1)
    with pytest.warns(TornWalEntryWarning, match=f"position {last}"):
        assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [
            1,
            2,
            3,
        ]
    with pytest.warns(TornWalEntryWarning, match="moved it to .*torn_wal"):
        claimer = mw.open_table(str(tmp_path)).writer(region_id=rid)
    assert claimer.stats()["replayed_rows"] == 3
    claimer.upsert({"id": [5], "v": ["new"]})
    claimer.close()
    assert sorted(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist()) == [1, 2, 3, 5]
