"""Splitting the base table into scan partitions: every row in exactly one, about even."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from memwal_sql.expressions.predicate import Compare
from planner.scan import MIN_PART_ROWS, split_rows
from tests.exec_nodes.nodes import base_scan


@given(
    sizes=st.lists(st.integers(0, 5 * MIN_PART_ROWS), min_size=1, max_size=8),
    partitions=st.integers(1, 6),
)
def test_split_rows_covers_every_row_once_in_even_parts(sizes, partitions):
    parts = split_rows(list(enumerate(sizes)), partitions)
    covered = {i: np.zeros(n, dtype=np.int8) for i, n in enumerate(sizes)}
    lengths = []
    for part in parts:
        rows = 0
        for r in part:
            end = sizes[r.fragment_id] if r.end is None else r.end
            assert 0 <= r.start < end <= sizes[r.fragment_id]
            covered[r.fragment_id][r.start : end] += 1
            rows += end - r.start
        lengths.append(rows)
    assert all((c == 1).all() for c in covered.values())
    total = sum(sizes)
    assert len(parts) <= max(1, min(partitions, total // MIN_PART_ROWS))
    if len(parts) > 1:
        assert max(lengths) - min(lengths) <= 1  # cut at exact row counts


def test_base_scan_of_each_part_reads_its_rows_once_with_deletions_and_a_filter(tmp_path):
    n = 3 * MIN_PART_ROWS
    ds = lance.write_dataset(pa.table({"x": np.arange(n)}), str(tmp_path), max_rows_per_file=n)
    ds = lance.write_dataset(pa.table({"x": np.arange(n, n + 100)}), str(tmp_path), mode="append")
    ds.delete("x % 5 = 0")
    sizes = [(f.fragment_id, f.physical_rows) for f in ds.get_fragments()]
    parts = split_rows(sizes, 2)
    assert len(parts) == 2 and not parts[0][0].whole  # the big fragment is cut
    x = np.arange(n + 100)
    for predicate, want in [(None, x % 5 != 0), (Compare("x", ">", pa.scalar(n - 7)), x > n - 7)]:
        got = [
            batch.column("x").to_numpy()
            for part in parts
            for batch in base_scan(ds, ["x"], predicate, part).execute()
        ]
        assert np.array_equal(np.sort(np.concatenate(got)), x[(x % 5 != 0) & want])
    part_scan = base_scan(ds, ["x"], None, parts[1])
    assert "fragments=[0[" in part_scan.describe()
