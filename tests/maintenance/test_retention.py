"""Default maintenance keeps storage proportional to the live data, and keeps what reads need."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.maintenance import gc

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])
PASS_SECONDS = 600  # `memwal maintain --watch 600`
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", np.uint8)


def rows(keys, seed, payload="x"):
    """``{seed:04d}-{key:08d}-`` and 80 letters: random ones (text-like, ~60% of its size as
    Lance), or ``x`` repeated (far more compressible, the worst case for the ratio: the key
    index and the WAL's Arrow files do not shrink with it)."""
    keys = np.asarray(keys, np.int64)
    if payload == "letters":
        fill = LETTERS[np.random.default_rng(seed).integers(0, 26, (len(keys), 80))]
    else:
        fill = np.full((len(keys), 80), ord("x"), np.uint8)
    prefix = np.char.add(np.char.mod("%04d-", np.full(len(keys), seed)), np.char.mod("%08d-", keys))
    text = np.char.add(prefix.astype("S14"), fill.view("S80").ravel())
    return pa.table({"k": keys, "v": pa.array(text).cast(pa.string())}, SCHEMA)


def disk_bytes(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


class SimulatedClock:
    """Time as a maintainer running a pass every PASS_SECONDS sees it: ``now`` moves on a pass at
    a time, and each base version is dated by the pass that committed it (one not dated yet
    was committed now)."""

    def __init__(self, monkeypatch):
        self.now, self.dated = time.time(), {}
        real = gc._version_times
        monkeypatch.setattr(gc, "_now", lambda: self.now)
        monkeypatch.setattr(
            gc, "_version_times", lambda ds: [(v, self.dated.get(v, self.now)) for v, _ in real(ds)]
        )

    def tick(self, tbl):
        for v in tbl.dataset().versions():
            self.dated.setdefault(v["version"], self.now)
        self.now += PASS_SECONDS


@pytest.mark.parametrize(
    ("payload", "table_rows", "bound"),
    [("letters", 200_000, 3.0), ("x", 20_000, 8.0)],
)
def test_thirty_default_passes_over_upserts_stay_within_a_bound_of_the_live_size(
    tmp_path, monkeypatch, payload, table_rows, bound
):
    """docs/maintenance.md#retention gives the figures: a table of text-like rows stays within
    3x its live size as plain Lance (2.7x at most); one of rows whose payload compresses 40x
    within 8x (6.2x), as its key index and WAL entries do not compress with it. A tag keeps
    the files of its version on top of that: here the table as created."""
    uri = str(tmp_path / "t")
    tbl = mw.create_table(uri, rows(range(table_rows), 0, payload), primary_key="k")
    clock = SimulatedClock(monkeypatch)
    rng = np.random.default_rng(7)
    churn = table_rows // 100
    expected = {k: f"0000-{k:08d}-" for k in range(table_rows)}
    sizes, pinned = [], None
    tagged = disk_bytes(uri)
    tbl.dataset().tags.create("release", tbl.dataset().version)  # pinned: kept past retention
    for n in range(1, 31):
        keys = np.sort(rng.choice(table_rows, churn, replace=False))
        with tbl.writer() as w:
            w.upsert(rows(keys, n, payload))
        expected.update({k: f"{n:04d}-{k:08d}-" for k in keys.tolist()})
        clock.tick(tbl)
        result = tbl.maintain()
        assert result.ok, result.failures
        sizes.append(disk_bytes(uri))
        if n == 25:  # reads begun now, finished at the end: within the retention
            pinned = (tbl.dataset().version, tbl.dataset().to_table().sort_by("k"))
            reader, expected_then = tbl.scan(), dict(expected)
    live = tbl.to_arrow().sort_by("k")
    assert {k: v[:14] for k, v in zip(live["k"].to_pylist(), live["v"].to_pylist())} == expected
    lance.write_dataset(live, str(tmp_path / "live"))
    live_size = disk_bytes(tmp_path / "live")
    ratios = [round((size - tagged) / live_size, 2) for size in sizes]
    assert max(ratios) <= bound, ratios
    version, table = pinned
    assert lance.dataset(uri, version=version).to_table().sort_by("k").equals(table)
    assert lance.dataset(uri, version="release").count_rows() == table_rows
    then = reader.read_all()
    assert {k: v[:14] for k, v in zip(then["k"].to_pylist(), then["v"].to_pylist())} == (
        expected_then
    )
    assert len(tbl.dataset().versions()) < 30 * 3  # old versions were expired


def test_a_version_expires_an_hour_after_it_was_superseded_not_after_it_was_written(
    tmp_path, monkeypatch
):
    tbl = mw.create_table(str(tmp_path), rows([1], 0), primary_key="k")
    clock = SimulatedClock(monkeypatch)
    clock.tick(tbl)
    latest = tbl.dataset().version
    clock.now += 2 * 3600  # the table sits idle: its latest version grows old
    tbl.upsert(rows([2], 1))
    tbl.flush()
    tbl.merge()
    clock.tick(tbl)  # the merge's versions, 10 minutes ago

    def versions():
        return [v["version"] for v in tbl.dataset().versions()]

    tbl.gc()
    # Written 2h10m ago but superseded 10 minutes ago: a read that began on it while it was
    # the latest has the rest of the hour to finish.
    assert latest in versions()
    clock.now += 3600
    tbl.gc()
    assert latest not in versions()
    assert gc.expire_base_versions(tbl, timedelta(0)) == versions()[:-1]
    assert versions() == [tbl.dataset().version]


def test_a_writer_gone_without_close_is_flushed_after_the_idle_time_and_a_live_one_is_not(
    tmp_path, monkeypatch
):
    from memwal_sql.maintenance import recovery

    now = [time.time()]
    monkeypatch.setattr(recovery, "_now", lambda: now[0])
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="k")
    w = tbl.writer()
    w.upsert(rows([1, 2, 3], 1))
    w.release()  # what a process exiting without close() does
    (status,) = tbl.maintenance.status()
    assert (status.unflushed_rows, status.unflushed_wal_entries) == (3, 1)
    now[0] += 29 * 60  # not idle long enough: left to its writer
    r = tbl.maintain()
    assert r.recovery.recovered == {} and status.region_id in r.recovery.waiting
    assert r.merge.rows_upserted == 0
    now[0] += 2 * 60
    r = tbl.maintain()
    assert r.recovery.recovered == {status.region_id: 3}
    assert r.merge.rows_upserted == 3
    (status,) = tbl.maintenance.status()
    assert (status.unflushed_rows, status.unmerged_rows) == (0, 0)
    # A live writer that wrote within the idle time keeps its region.
    live = mw.open_table(str(tmp_path)).writer()
    live.upsert(rows([4], 2))
    now[0] = time.time() + 29 * 60  # 29 minutes after its write
    assert tbl.maintain().recovery.recovered == {}
    live.upsert(rows([5], 2))  # not fenced
    live.close()
    assert sorted(tbl.to_arrow()["k"].to_pylist()) == [1, 2, 3, 4, 5]


def test_gc_says_why_it_keeps_the_wal_entries_of_merged_generations(tmp_path):
    tbl = mw.create_table(str(tmp_path), SCHEMA, primary_key="k")
    with tbl.writer() as w:
        w.upsert(rows([1, 2], 1))
    tbl.merge()
    gens, wal = tbl.gc().kept  # merged, but the version before the merge is retained
    assert gens.what == "generation 1" and wal.what == "1 flushed WAL entries"
    assert "predates their merge" in gens.reason
    assert wal.reason == f"their rows are in generation 1, kept too: {gens.reason}"
