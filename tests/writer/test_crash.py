"""Crash recovery: a writer process killed with SIGKILL loses no acknowledged durable write."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import lance
import pytest

import memwal_sql as mw
from memwal_sql._proto.memwal_pb2 import FlushedGeneration
from memwal_sql.formats.generation import BLOOM_FILTER
from memwal_sql.formats.key_index import read_pk_index
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.formats.wal import wal_positions
from memwal_sql.storage import layout
from tests.lsm import lance_latest_rows
from tests.writer.crash_plan import SCHEMA, apply_batch, model_after

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_and_kill(
    uri: str,
    mode: str,
    until: str,
    timeout: float = 60,
    *,
    times: int = 1,
    then: float = 0.0,
    options: dict | None = None,
) -> int:
    """Start the child, SIGKILL it ``then`` seconds after the ``times``-th stdout line starting
    with ``until``; return acks seen."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.writer.crash_child", uri, mode, json.dumps(options)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked = seen = 0
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ACK"):
            acked = int(line.split()[1]) + 1
        seen += line.startswith(until)
        if seen >= times or time.monotonic() > deadline:
            break
    time.sleep(then)  # the child goes on meanwhile: the kill lands wherever it has got to
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
    return acked


def assert_whole_generation(tbl: mw.MemWalTable, rid: str, g: FlushedGeneration) -> None:
    """Generation ``g`` is complete: every row readable, its ``_pk_index`` and bloom filter
    there and covering every row."""
    path = f"{layout.region_dir(rid)}/{g.path}"
    uri = tbl.store.uri_for(path)
    options = tbl.storage_options or None
    assert lance.dataset(uri, storage_options=options).to_table().num_rows == g.physical_rows
    assert read_pk_index(uri, options).num_rows == g.physical_rows
    assert tbl.store.exists(f"{path}/{BLOOM_FILTER}")


def recover_and_check(uri: str, acked: int, options: dict | None = None) -> None:
    tbl = mw.open_table(uri, options)
    (rid,) = tbl.regions()
    for m_version in RegionManifestStore(tbl.store, rid).list_versions():
        m = RegionManifestStore(tbl.store, rid).read(m_version)
        for g in m.flushed_generations:  # no manifest references a partial generation
            assert_whole_generation(tbl, rid, g)
    with tbl.writer():  # claim, replay the WAL, flush everything to a generation
        pass
    got = {r["id"]: r["v"] for r in lance_latest_rows(uri, ["id"], options).to_pylist()}
    # The child goes on writing until the signal lands, so batches after the last ACK the
    # parent read may have landed too; the state must be a whole prefix that holds every
    # acknowledged batch (nothing lost, nothing half-applied, nothing out of order).
    state, landed = model_after(acked), acked
    while state != got and landed < acked + 10_000:
        apply_batch(state, landed)
        landed += 1
    assert state == got, (acked, len(got))


def fresh_tables(table_root: tuple[str, dict | None], rounds: int = 3):
    """A new empty table per crash round: ``(uri, storage_options)``."""
    root, options = table_root
    for round_ in range(rounds):
        uri = f"{root}{round_}"
        mw.create_table(uri, SCHEMA, primary_key="id", storage_options=options)
        yield uri, options


def test_sigkill_during_durable_puts_loses_no_acknowledged_write(table_root):
    rng = random.Random(7)
    for uri, options in fresh_tables(table_root):
        acked = run_and_kill(uri, "puts", until=f"ACK {rng.randint(5, 60)}", options=options)
        assert acked > 0
        recover_and_check(uri, acked, options)


def test_sigkill_during_memtable_flush_leaves_no_partial_generation(tmp_path):
    uri = str(tmp_path / "t")
    mw.create_table(uri, SCHEMA, primary_key="id")
    acked = run_and_kill(uri, "flush", until="FLUSHING")
    tbl = mw.open_table(uri)
    (rid,) = tbl.regions()
    m = RegionManifestStore(tbl.store, rid).latest()
    assert len(m.flushed_generations) == 0  # the killed flush never committed
    orphans = [d for d in tbl.store.list_dirs(layout.region_dir(rid)) if "_gen_" in d]
    assert len(orphans) == 1  # its directory is there, complete or not, and unreferenced
    recover_and_check(uri, acked)


def test_sigkill_while_generations_are_committed_references_only_whole_ones(table_root):
    # Flushes running back to back, none stalled: the kill lands at a random moment after the
    # n-th flush got halfway (so n-1 generations are committed), inside a generation write,
    # its manifest commit or a later flush.
    rng = random.Random(11)
    for uri, options in fresh_tables(table_root):
        n = rng.randint(3, 8)
        acked = run_and_kill(
            uri, "flushes", until="FLUSHING", times=n, then=rng.uniform(0, 0.05), options=options
        )
        tbl = mw.open_table(uri, options)
        (rid,) = tbl.regions()
        gens = RegionManifestStore(tbl.store, rid).latest().flushed_generations
        assert len(gens) >= n - 1
        assert [g.generation for g in gens] == list(range(1, len(gens) + 1))
        for g in gens:
            assert_whole_generation(tbl, rid, g)
        dirs = [d for d in tbl.store.list_dirs(layout.region_dir(rid)) if "_gen_" in d]
        assert len(set(dirs) - {g.path for g in gens}) <= 1  # only the flush the kill cut short
        recover_and_check(uri, acked, options)


def test_sigkill_of_a_claim_after_its_sentinel_leapt_loses_nothing(table_root):
    # The writer is killed while it appends; a new writer claims the region, its sentinel
    # leaping two positions ahead, and is killed right after that put: the positions it leapt
    # over stay empty, its sentinel unsynced and unrecorded. The next claim reads that as the
    # end of the WAL, fills the holes and loses no acknowledged write.
    for uri, options in fresh_tables(table_root, rounds=2):
        acked = run_and_kill(uri, "puts", until="ACK 20", options=options)
        run_and_kill(uri, "claim", until="SENTINEL", options=options)
        tbl = mw.open_table(uri, options)
        (rid,) = tbl.regions()
        positions = wal_positions(tbl.store, rid)
        assert len(positions) < positions[-1] - positions[0] + 1  # the claim left holes
        recover_and_check(uri, acked, options)
