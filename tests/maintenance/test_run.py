"""One maintenance pass, and maintenance runs racing each other."""

from __future__ import annotations

import threading

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
                mine.maintain()
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
