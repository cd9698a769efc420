"""tbl.metrics() against known activity, the same numbers through OpenTelemetry's SDK (an
in-memory reader), and ``memwal inspect --watch``."""

from __future__ import annotations

import json
import subprocess
import sys
import weakref
from pathlib import Path

import pyarrow as pa
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import memwal_sql as mw
from memwal_sql import metrics
from memwal_sql.cli import main
from memwal_sql.metrics import instrument

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), ("v", pa.string())])


def rows(*ids: int) -> dict[str, list]:
    return {"id": list(ids), "v": [f"v{i}" for i in ids]}


def table(path: Path) -> mw.MemWalTable:
    # Caches of its own, so their numbers are this table's alone.
    return mw.create_table(
        str(path), SCHEMA, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 2),
        cache=64 << 20,
    )  # fmt: skip


def keys(bucket: int) -> list[int]:
    """Keys of ``bucket`` (of 2), in order."""
    ids = pa.record_batch({"id": pa.array(range(100), pa.int64())})
    return [int(i) for i in sorted(mw.RegionSpec.bucket("id", 2).group_rows(ids)[(bucket,)])]


K0, K1 = keys(0), keys(1)


def test_metrics_follow_writes_flushes_and_merges(tmp_path):
    tbl = table(tmp_path / "t")
    assert tbl.metrics().regions == ()
    with tbl.writer(region_values=(0,)) as w:
        for i in range(3):
            w.upsert(rows(K0[2 * i], K0[2 * i + 1]))  # one WAL entry each: an upsert waits
        w.delete([K0[10]])  # a tombstone row
        r0 = w.region_id
        m = tbl.metrics().region(r0)
        assert (m.entries_written, m.rows_written, m.wal_position) == (4, 7, 4)
        assert (m.unflushed_wal_entries, m.unflushed_rows) == (4, 7)
        assert (m.generations, m.unmerged_generations, m.unmerged_rows) == (0, 0, 0)
        w.flush()
        m = tbl.metrics().region(r0)
        assert (m.unflushed_wal_entries, m.unflushed_rows) == (0, 0)
        assert (m.generations, m.unmerged_generations, m.unmerged_rows) == (1, 1, 7)
        assert m.merge_lag_seconds >= 0
    with tbl.writer(region_values=(1,)) as w1:
        w1.upsert(rows(K1[0]))
    tbl.merge()
    m = tbl.metrics()
    assert [r.region_id for r in m.regions] == sorted([r0, w1.region_id])
    r = m.region(r0)
    assert (r.unmerged_generations, r.unmerged_rows, r.merge_lag_seconds) == (0, 0, 0.0)
    assert r.generations == 1  # merged, listed until GC
    assert (m.region(w1.region_id).entries_written, m.region(w1.region_id).rows_written) == (1, 1)

    # A new writer of the region adds to the counts of the one it replaced.
    with tbl.writer(region_values=(0,)) as w:
        w.upsert(rows(K0[20], K0[21]))
    r = tbl.metrics().region(r0)
    assert (r.entries_written, r.rows_written) == (5, 9)
    assert r.wal_position > 4  # every writer's entries, this claim's fence too

    # Another table object sees the same storage, and writes of its own only.
    other = mw.open_table(str(tmp_path / "t"))
    o = other.metrics().region(r0)
    assert (o.entries_written, o.rows_written) == (0, 0)
    assert o.wal_position == r.wal_position and o.unmerged_rows == 2
    with pytest.raises(mw.errors.InvalidInputError, match="no region"):
        other.metrics().region("not-a-region")


def test_cache_metrics_are_the_tables_cache_counters(tmp_path):
    tbl = table(tmp_path / "t")
    tbl.upsert(rows(*range(50)))
    tbl.flush()
    tbl.merge()
    before = tbl.metrics().cache
    assert before.shared is False and before.max_bytes == 64 << 20
    tbl.lookup([1, 2, 3])
    first = tbl.metrics().cache
    tbl.lookup([1, 2, 3])
    second = tbl.metrics().cache
    stats = tbl.caches.stats()
    assert (second.hits, second.misses, second.evictions) == (
        stats.hits,
        stats.misses,
        stats.evictions,
    )
    assert first.misses > before.misses  # the first lookup loaded
    assert second.misses == first.misses and second.hits > first.hits  # the second did not
    assert second.nbytes == tbl.caches.nbytes > 0


def points(reader: InMemoryMetricReader, uri: str) -> dict[tuple[str, str], float]:
    """(instrument, region or caches) -> value of the points of table ``uri``."""
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "memwal_sql"
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    a = dict(p.attributes)
                    if a.get("memwal.table") == uri:
                        out[metric.name, a["memwal.region"]] = p.value
                    elif a.get("memwal.caches") == uri:
                        out[metric.name, "cache"] = p.value
    return out


def test_opentelemetry_instruments_report_the_snapshot(tmp_path, monkeypatch):
    # Only this test's tables: those other tests left open (some on a stopped S3 server) are
    # observed too, and would make the collection slow.
    monkeypatch.setattr(metrics, "_tables", weakref.WeakKeyDictionary())
    reader = InMemoryMetricReader()
    instrument(MeterProvider(metric_readers=[reader]))
    tbl = table(tmp_path / "t")
    with tbl.writer(region_values=(0,)) as w:
        w.upsert(rows(K0[1], K0[2]))
        w.upsert(rows(K0[3]))
        rid = w.region_id
        seen = points(reader, tbl.uri)
        assert seen["memwal.region.entries_written", rid] == 2
        assert seen["memwal.region.rows_written", rid] == 3
        assert seen["memwal.region.unflushed_wal_entries", rid] == 2
        assert seen["memwal.region.unflushed_rows", rid] == 3
        assert seen["memwal.region.generations", rid] == 0
        w.flush()
    tbl.lookup([K0[1]])
    # A second collection takes a new snapshot.
    seen = points(reader, tbl.uri)
    m = tbl.metrics()
    r = m.region(rid)
    assert seen["memwal.region.unflushed_rows", rid] == 0
    assert seen["memwal.region.generations", rid] == 1
    assert seen["memwal.region.unmerged_generations", rid] == 1
    assert seen["memwal.region.unmerged_rows", rid] == r.unmerged_rows == 3
    assert seen["memwal.region.wal_position", rid] == r.wal_position
    assert ("memwal.region.merge_lag", rid) in seen and ("memwal.region.idle", rid) in seen
    assert seen["memwal.cache.hits", "cache"] == m.cache.hits
    assert seen["memwal.cache.misses", "cache"] == m.cache.misses > 0
    assert seen["memwal.cache.evictions", "cache"] == m.cache.evictions
    # A closed table is no longer observed.
    tbl.close()
    assert points(reader, tbl.uri) == {}


def test_inspect_watch_shows_the_metrics(tmp_path, capsys):
    tbl = table(tmp_path / "t")
    with tbl.writer(region_values=(0,)) as w:
        w.upsert(rows(*K0[:3]))
        w.flush()
        w.upsert(rows(K0[3]))
        rid = w.region_id
        main(["inspect", tbl.uri, "--watch", "0.01", "--iterations", "2"])
        out = capsys.readouterr().out
        assert out.count(tbl.uri) == 2 and out.count("cache: ") == 2  # two views
        line = next(x for x in out.splitlines()[::-1] if x.startswith(rid))
        cells = [c.strip() for c in line.split("|")]
        # region, WAL position, entries/s, unflushed, idle, gens, unmerged, unmerged rows
        assert cells[1] == "2" and cells[2] == "0.0" and cells[3] == "1 rows/1 entries"
        assert cells[5:8] == ["1", "1", "3"]
        main(["inspect", tbl.uri, "--watch", "0.01", "--iterations", "1", "--json"])
        (doc,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        (region,) = doc["regions"]
        assert (region["region_id"], region["unflushed_rows"], region["unmerged_rows"]) == (
            rid,
            1,
            3,
        )


GLOBAL_PROVIDER = """
import sys, pyarrow as pa, memwal_sql as mw
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
tbl = mw.create_table(sys.argv[1], pa.schema([pa.field("id", pa.int64(), False)]),
                      primary_key="id")
tbl.upsert({"id": [1, 2, 3]})
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))  # after the table opened
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            if m.name == "memwal.region.unflushed_rows":
                print(sm.scope.name, [p.value for p in m.data.data_points])
"""


def test_a_table_is_observed_by_the_global_meter_provider_set_after_it_opened(tmp_path):
    # Its own process: the global provider can be set once per process.
    out = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDER, str(tmp_path / "t")],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    assert out.stdout.split("\n") == ["memwal_sql [3]", ""], out.stderr


def test_a_table_whose_snapshot_fails_is_tried_once_per_collection(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "_tables", weakref.WeakKeyDictionary())
    reader = InMemoryMetricReader()
    instrument(MeterProvider(metric_readers=[reader]))
    good, bad = table(tmp_path / "good"), table(tmp_path / "bad")
    with good.writer(region_values=(0,)) as w:
        w.upsert(rows(K0[0]))
    tries = []

    def failing() -> None:
        tries.append(1)
        raise mw.errors.StorageError("the object store did not answer")

    monkeypatch.setattr(bad, "metrics", failing)
    seen = points(reader, good.uri)
    assert seen["memwal.region.rows_written", w.region_id] == 1  # the others still reported
    assert len(tries) == 1  # not once per instrument
    points(reader, good.uri)
    assert len(tries) == 2


NO_OPENTELEMETRY = """
import sys, pyarrow as pa, memwal_sql as mw
tbl = mw.create_table(sys.argv[1], pa.schema([pa.field("id", pa.int64(), False)]),
                      primary_key="id")
tbl.upsert({"id": [1]})
print(tbl.metrics().regions[0].unflushed_rows, "opentelemetry" in sys.modules)
"""


def test_a_process_that_does_not_use_opentelemetry_does_not_import_it(tmp_path):
    """Importing OpenTelemetry costs a cold query tens of milliseconds: opening a table creates
    no instruments unless the application imported it; the snapshot works all the same."""
    out = subprocess.run(
        [sys.executable, "-c", NO_OPENTELEMETRY, str(tmp_path / "t")],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    assert out.stdout.split() == ["1", "False"], out.stderr
