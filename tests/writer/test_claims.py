"""Claims take bounded time: a new writer fences one that appends flat out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

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


def test_a_claim_fences_a_writer_doing_flat_out_durable_puts_within_a_second(tmp_path):
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
        t0 = time.perf_counter()
        claimer = mw.open_table(str(tmp_path)).writer(region_id=rid)
        claim_s = time.perf_counter() - t0
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    lines = out.split()
    assert lines[-1] == "FENCED"  # its next put met the sentinel
    acked += [int(x) for x in lines[:-1]]
    assert claim_s < 1.0, f"the claim took {claim_s:.2f} s"
    claimer.upsert({"id": [10**9], "v": ["claimer"]})
    claimer.close()
    ids = set(mw.open_table(str(tmp_path)).to_arrow().column("id").to_pylist())
    assert set(acked) | {-1, 10**9} <= ids


def test_a_claim_that_loses_races_leaps_ahead_and_leaves_no_hole(tmp_path, monkeypatch):
    # The previous writer wins the first three races for the sentinel's position (simulated:
    # its entry lands just before each attempt). The claim leaps 1, 2, then 4 positions
    # ahead, wins, and fills every position it leapt over with a sentinel.
    from memwal_sql.errors import WriterFencedError
    from memwal_sql.storage import ObjectStore, layout
    from memwal_sql.writer.rows import RowCoercer
    from memwal_sql.writer.wal import encode_wal_entry, wal_positions

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
    assert raced == [first, first + 1, first + 3]
    sentinel = claimer.stats()["next_wal_position"] - 1
    assert sentinel == first + 7
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
