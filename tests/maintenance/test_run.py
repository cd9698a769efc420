"""One maintenance pass, and maintenance runs racing each other."""

from __future__ import annotations

import threading

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import CommitConflictError, RetryableError, StorageError
from memwal_sql.maintenance import run
from memwal_sql.storage import storage_failures


def test_a_lost_race_is_retried_and_anything_else_is_not(monkeypatch):
    monkeypatch.setattr(run.time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError("Retryable commit conflict for version 7: preempted")
        return "done"

    assert run._retrying(flaky) == "done" and len(calls) == 3

    def always():
        raise CommitConflictError("lost")

    with pytest.raises(CommitConflictError, match="lost 6 commit races"):
        run._retrying(always)

    def broken():
        calls.append(1)
        raise ValueError("not a race")

    calls.clear()
    with pytest.raises(ValueError):
        run._retrying(broken)
    assert len(calls) == 1


def test_a_lance_commit_conflict_is_a_retryable_error():
    with pytest.raises(CommitConflictError) as e, storage_failures("maintain of t"):
        raise OSError(
            "Retryable commit conflict for version 38: This CreateIndex transaction "
            "was preempted by concurrent transaction CreateIndex"
        )
    assert isinstance(e.value, RetryableError)
    with pytest.raises(StorageError) as e, storage_failures("maintain of t"):
        raise OSError("disk on fire")
    assert not isinstance(e.value, RetryableError)


@pytest.mark.slow
def test_concurrent_maintenance_runs_beside_a_writer_all_succeed(tmp_path):
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
    uri = str(tmp_path)
    tbl = mw.create_table(uri, schema, primary_key="id", region_spec=mw.RegionSpec.bucket("id", 4))
    tbl.dataset().create_scalar_index("id", "BTREE")
    errors: list[BaseException] = []
    stop = threading.Event()

    def write():
        i = 0
        while not stop.is_set():
            ids = np.arange(i, i + 2000)
            i += 1000
            tbl.upsert(pa.table({"id": ids, "v": [f"v{i}"] * len(ids)}))
            tbl.flush()

    def maintain():
        mine = mw.open_table(uri)
        for _ in range(10):
            try:
                errors.extend(f.error for f in mine.maintain().failures)  # a step that failed
            except BaseException as e:
                errors.append(e)

    writer = threading.Thread(target=write)
    maintainers = [threading.Thread(target=maintain) for _ in range(3)]
    writer.start()
    for t in maintainers:
        t.start()
    for t in maintainers:
        t.join()
    stop.set()
    writer.join()
    assert errors == []
    tbl.close()
    ids = mw.open_table(uri).to_arrow(columns=["id"]).column("id").to_numpy()
    assert len(ids) == len(np.unique(ids)) and ids.min() == 0 and ids.max() == len(ids) - 1


D = 4


def _vectors(ids, values=None, seed=0) -> pa.Table:
    if values is None:
        values = np.random.default_rng(seed).normal(size=(len(ids), D))
    vec = pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(values, np.float32).ravel()), D)
    return pa.table({"id": pa.array(ids, pa.int64()), "vec": vec})


def _coverage(tbl) -> dict[str, bool]:
    from memwal_sql.formats.index_catchup import index_coverage

    return {c.name: c.complete for c in index_coverage(tbl.store, tbl.dataset())}


@pytest.mark.parametrize("index_type", ["IVF_FLAT", "IVF_HNSW_SQ"])
def test_merged_rows_of_null_vectors_are_covered_and_never_found(tmp_path, index_type):
    # Lance 14's optimize_indices cannot take new rows whose vectors are all NULL (it looks for
    # IVF partition files it never wrote): the index is recorded as covering them instead.
    tbl = mw.create_table(str(tmp_path), _vectors(range(200)), primary_key="id")
    tbl.create_index("vec", index_type, num_partitions=2)
    nulls = pa.table(
        {
            "id": pa.array([500, 501], pa.int64()),
            "vec": pa.nulls(2, _vectors([]).schema.field("vec").type),
        }
    )
    tbl.upsert(nulls)
    tbl.flush()
    result = tbl.maintain()
    assert result.ok, result.failures
    assert result.indexes.optimized == ["id_pk_btree", "vec_idx"]
    assert _coverage(tbl) == {"id_pk_btree": True, "vec_idx": True}
    assert tbl.compact().fragments_removed == 2  # Lance remaps what the index covers
    assert _coverage(tbl) == {"id_pk_btree": True, "vec_idx": True}
    # The index over the compacted base answers as a flat search does, the NULLs never.
    q = np.zeros(D, np.float32)
    got = tbl.vector_search(q, k=300, nprobes=2).column("id").to_pylist()
    ds = tbl.dataset()
    flat = ds.to_table(
        nearest={"column": "vec", "q": q, "k": 300, "use_index": False}, columns=["id"]
    )
    assert sorted(got) == sorted(flat.column("id").to_pylist()) == list(range(200))
    tbl.close()


def test_a_row_no_index_can_take_fails_only_its_step_which_runs_again_once_fixed(tmp_path, capsys):
    from memwal_sql.cli import main
    from memwal_sql.errors import IndexCatchupError

    tbl = mw.create_table(str(tmp_path), _vectors(range(300)), primary_key="id")
    tbl.create_index("vec", "IVF_PQ", num_partitions=2, num_sub_vectors=2)  # PQ trains on 256
    # Written past the checks at write (by Lance itself): [3e38, -3e38, ...] has no place in
    # an IVF index, whose catch-up then failed for good, and every step after it with it.
    lance.write_dataset(_vectors([900], [[3e38, -3e38, 0, 0]]), tbl.uri, mode="append")
    tbl.upsert(_vectors([1, 2], seed=1))
    tbl.flush()
    result = tbl.maintain()
    assert [f.step for f in result.failures] == ["indexes"]
    error = result.failures[0].error
    assert isinstance(error, IndexCatchupError) and "{'id': 900}" in str(error)
    assert "squared norm" in str(error) and "id_pk_btree could" in str(error)
    assert list(result.skipped) == ["compaction"]
    assert sum(len(g) for g in result.merge.merged.values()) == 1  # the steps around it ran
    assert result.snapshots.regions == 1 and result.snapshots.committed
    assert _coverage(tbl) == {"id_pk_btree": True, "vec_idx": False}
    # The collector kept the merged generation the vector index does not cover.
    assert (
        tbl.lookup([1, 2]).column("vec").to_pylist()
        == _vectors([1, 2], seed=1).column("vec").to_pylist()
    )
    with pytest.raises(SystemExit) as exit_:
        main(["maintain", tbl.uri])
    assert exit_.value.code == 1
    assert "indexes failed: 1 index(es)" in capsys.readouterr().out
    tbl.upsert(_vectors([900], [[1, 1, 1, 1]]))  # the fix: a usable vector for the key
    tbl.flush()
    result = tbl.maintain()
    assert result.ok, result.failures
    assert _coverage(tbl) == {"id_pk_btree": True, "vec_idx": True}
    assert tbl.vector_search(np.ones(D, np.float32), k=1).column("id").to_pylist() == [900]
    tbl.close()
