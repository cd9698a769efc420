"""Base-table compaction: deletion vectors materialized at the threshold, small fragments merged,
indexes caught up first, every read path (and Lance's LsmScanner) unchanged."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import CommitConflictError, InvalidInputError
from memwal_sql.formats.index_catchup import index_coverage
from memwal_sql.maintenance.compaction import SMALL_FRAGMENT_TRIGGER
from memwal_sql.maintenance.status import region_status
from tests.lsm import Model, lance_latest_rows

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])
BASE = 4_000
TARGET = 1_000  # the base fragment (4,000 rows) is not small; merged fragments are


def batch(ks, tag):
    ks = list(ks)
    return pa.table({"k": ks, "v": [f"{tag}{k}" for k in ks]}, schema=SCHEMA)


def new_table(uri: str) -> tuple[mw.MemWalTable, Model]:
    tbl = mw.create_table(
        uri, batch(range(BASE), "base"), primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    model = Model(["k"])
    model.upsert(batch(range(BASE), "base"))
    return tbl, model


def upsert(tbl, model, rows) -> None:
    tbl.upsert(rows)
    model.upsert(rows)


def check(tbl: mw.MemWalTable, model: Model) -> None:
    want = model.table(SCHEMA)
    assert tbl.to_arrow().sort_by("k") == want
    assert tbl.lookup(list(range(BASE + 100))).sort_by("k") == want
    ctx = mw.connect()
    ctx.register("t", tbl)
    assert ctx.sql("SELECT count(*) AS n FROM t WHERE k % 3 = 0").to_pydict()["n"] == [
        sum(1 for (k,) in model.rows if k % 3 == 0)
    ]
    tbl.flush()
    assert lance_latest_rows(tbl.uri, ["k"]) == want  # Lance 14 reads the compacted base too


def fragments(tbl: mw.MemWalTable) -> list:
    return tbl.dataset().get_fragments()


def deleted_share(fragment) -> float:
    return 1 - fragment.count_rows() / fragment.metadata.physical_rows


def test_compaction_materializes_deletions_at_the_threshold_and_merges_small_fragments(
    tmp_path,
):
    tbl, model = new_table(str(tmp_path))
    upsert(tbl, model, batch(range(0, 200, 2), "u1"))  # 2.5% of the base fragment superseded
    upsert(tbl, model, batch(range(BASE, BASE + 60), "new"))
    tbl.flush()
    tbl.merge()
    before = fragments(tbl)
    big = [f for f in before if f.metadata.physical_rows >= TARGET]
    small = [f for f in before if f.metadata.physical_rows < TARGET]
    assert len(big) == 1 and deleted_share(big[0]) == pytest.approx(0.025)
    assert len(small) >= 2  # one merge per region
    check(tbl, model)

    # 2.5% deleted is below 5%: the big fragment keeps its deletion vector; the small ones merge.
    r = tbl.compact(target_rows_per_fragment=TARGET, deletion_threshold=0.05)
    after = fragments(tbl)
    assert r.fragments_removed == len(small) and r.fragments_added == 1
    assert r.base_version == tbl.dataset().version
    assert len(after) == 2
    assert after[0].fragment_id == big[0].fragment_id and after[0].metadata.deletion_file
    check(tbl, model)

    # At 2% it is rewritten, with its small neighbour.
    r = tbl.compact(target_rows_per_fragment=TARGET, deletion_threshold=0.02)
    assert r.fragments_removed == 2
    assert all(f.metadata.deletion_file is None for f in fragments(tbl))
    assert sum(f.metadata.physical_rows for f in fragments(tbl)) == len(model.rows)
    check(tbl, model)

    version = tbl.dataset().version
    r = tbl.compact(target_rows_per_fragment=TARGET, deletion_threshold=0.0)
    assert (r.fragments_removed, r.fragments_added) == (0, 0)
    assert tbl.dataset().version == version  # a compact table: nothing committed

    # Writers, merges and the merge progress carry on over the rewritten fragments.
    upsert(tbl, model, batch(range(1, 400, 3), "u2"))
    tbl.delete(list(range(3000, 3100)))
    model.delete(pa.table({"k": list(range(3000, 3100))}))
    check(tbl, model)
    tbl.flush()
    tbl.merge()
    tbl.compact(deletion_threshold=0.0)
    assert all(f.metadata.deletion_file is None for f in fragments(tbl))
    check(tbl, model)
    assert all(r.unmerged_generations == 0 and r.merged_generation >= 2 for r in region_status(tbl))
    tbl.close()


def test_a_maintenance_pass_waits_for_small_fragments_to_gather(tmp_path):
    tbl, model = new_table(str(tmp_path))  # one base fragment, small (below 1M rows)
    (base,) = fragments(tbl)
    counts = []
    for i in range(8):
        upsert(tbl, model, batch(range(BASE + 10 * i, BASE + 10 * i + 10), f"n{i}"))  # no deletes
        tbl.flush()
        r = tbl.maintain()
        assert r.ok, r.failures
        counts.append((len(fragments(tbl)), r.compaction.fragments_removed))
        if r.compaction.fragments_removed:
            break
    *waiting, (after, removed) = counts
    assert waiting and all(n < SMALL_FRAGMENT_TRIGGER and not r for n, r in waiting)
    # The small fragments of one size tier became one; the bigger base fragment, small too
    # (below Lance's target), was not rewritten with them.
    assert removed >= SMALL_FRAGMENT_TRIGGER and after == 2
    assert fragments(tbl)[0].fragment_id == base.fragment_id
    assert fragments(tbl)[1].metadata.physical_rows == 10 * len(counts)  # every new row
    check(tbl, model)
    tbl.close()


def test_a_pass_rewrites_a_worn_small_fragment_without_the_bigger_ones(tmp_path):
    tbl, model = new_table(str(tmp_path))
    (base,) = fragments(tbl)
    upsert(tbl, model, batch(range(BASE, BASE + 100), "new"))
    tbl.flush()
    assert tbl.maintain().compaction.fragments_removed == 0
    (_, *news) = fragments(tbl)
    worn = next(f for f in news if f.metadata.physical_rows >= 40)  # the bigger region's share
    keys = worn.to_table(columns=["k"])["k"].to_pylist()
    upsert(tbl, model, batch(keys[: len(keys) // 4], "again"))  # 25% of it superseded
    tbl.flush()
    r = tbl.maintain()
    assert r.ok, r.failures
    assert r.compaction.fragments_removed >= 1
    ids = [f.fragment_id for f in fragments(tbl)]
    assert base.fragment_id in ids and worn.fragment_id not in ids
    assert fragments(tbl)[0].metadata.deletion_file is None  # the base was never touched
    check(tbl, model)
    tbl.close()


def test_compaction_catches_up_lagging_indexes_first(tmp_path):
    tbl, model = new_table(str(tmp_path))
    for i in range(3):
        upsert(tbl, model, batch(range(i, 900, 7), f"r{i}"))
        tbl.flush()
        tbl.merge()
    assert not all(c.complete for c in index_coverage(tbl.store, tbl.dataset()))
    tbl.compact(deletion_threshold=0.0)
    coverage = index_coverage(tbl.store, tbl.dataset())
    assert coverage and all(c.complete for c in coverage)
    merged = {r.region_id: r.merged_generation for r in region_status(tbl)}
    assert all(dict(c.caught_up or {}) == merged for c in coverage)
    check(tbl, model)
    tbl.close()


def test_compaction_racing_merges_loses_nothing(tmp_path):
    tbl, model = new_table(str(tmp_path))
    errors: list[BaseException] = []
    stop = threading.Event()
    passes = {"done": 0, "lost": 0}

    def compact_until_stopped() -> None:
        while not stop.is_set():
            try:
                passes["done"] += tbl.compact(deletion_threshold=0.0).fragments_removed > 0
            except CommitConflictError:
                passes["lost"] += 1  # lost to a merge: retryable, and the next pass retries
            except BaseException as e:  # reported below
                errors.append(e)
                return

    compactor = threading.Thread(target=compact_until_stopped)
    compactor.start()
    try:
        for i in range(6):
            upsert(tbl, model, batch(range(i, BASE, 11), f"r{i}"))
            doomed = list(range(BASE - 10 * (i + 1), BASE - 10 * i))
            tbl.delete(doomed)
            model.delete(pa.table({"k": doomed}))
            tbl.flush()
            assert tbl.maintain().ok  # merge and compaction retry a lost commit race
    finally:
        stop.set()
        compactor.join()
    assert not errors, errors
    assert passes["done"] >= 1, passes
    tbl.maintain(deletion_threshold=0.0)
    assert all(f.metadata.deletion_file is None for f in fragments(tbl))
    check(tbl, model)
    tbl.close()


@pytest.mark.parametrize(
    "options",
    [{"target_rows_per_fragment": 0}, {"deletion_threshold": -0.1}, {"deletion_threshold": 1.5}],
)
def test_bad_compaction_options_are_refused(tmp_path, options):
    tbl, _ = new_table(str(tmp_path))
    version = tbl.dataset().version
    with pytest.raises(InvalidInputError):
        tbl.compact(**options)
    assert tbl.dataset().version == version
    tbl.close()
