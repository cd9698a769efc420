"""Fixtures of the exec-node tests: a tiny base table and a tiny generation, in tmp_path."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

from memwal_sql.formats.source_rows import (
    conform,
)
from memwal_sql.storage import ObjectStore
from memwal_sql.writer.flush import write_generation
from tests.exec_nodes.nodes import BASE, WAL, wal_rows


@pytest.fixture
def base(tmp_path):
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "v": ["b1", "b2", "b3", None],
            "f": [1.0, -0.0, float("nan"), None],
        },
        schema=BASE,
    )
    return lance.write_dataset(table, str(tmp_path / "base"))


@pytest.fixture
def generation(tmp_path):
    store = ObjectStore(str(tmp_path / "table"))
    rows = conform(wal_rows([2, 3, 5], "g1", dead=[False, True, False]), WAL)
    entry = write_generation(
        store, "r", 1, rows, ["id"], data_storage_version="stable", in_memory_bytes=rows.nbytes
    )
    return store, store.uri_for(f"_mem_wal/r/{entry.path}"), f"_mem_wal/r/{entry.path}"
