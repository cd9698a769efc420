"""Index catch-up: a btree gets the merged rows as delta segments, merged once enough gathered."""

from __future__ import annotations

import pyarrow as pa

import memwal_sql as mw
from memwal_sql.formats.index_catchup import index_coverage
from memwal_sql.maintenance.indexes import BTREE_SEGMENTS
from tests.lsm import Model, lance_latest_rows

SCHEMA = pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.string())])
BASE = 2_000


def batch(ks, tag):
    ks = list(ks)
    return pa.table({"k": ks, "v": [f"{tag}{k}" for k in ks]}, schema=SCHEMA)


def segments(tbl) -> list[tuple[str, frozenset[int]]]:
    (d,) = [d for d in tbl.dataset().describe_indices() if d.index_type == "BTree"]
    return [(s.uuid, frozenset(s.fragment_ids)) for s in d.segments]


def test_a_catch_up_adds_a_delta_segment_and_merges_the_deltas_once_enough_gathered(tmp_path):
    tbl = mw.create_table(str(tmp_path), batch(range(BASE), "base"), primary_key="k")
    model = Model(["k"])
    model.upsert(batch(range(BASE), "base"))
    (oldest,) = segments(tbl)
    for n in range(1, BTREE_SEGMENTS + 1):
        rows = batch([*range(n, BASE, 97), BASE + n], f"u{n}")  # updates and one new key
        tbl.upsert(rows)
        model.upsert(rows)
        tbl.flush()
        tbl.merge()
        before = segments(tbl)
        r = tbl.catch_up_indexes()
        assert r.optimized == ["k_pk_btree"]
        after = segments(tbl)
        new_fragments = {f.fragment_id for f in tbl.dataset().get_fragments()} - {
            i for _, ids in before for i in ids
        }
        if len(before) < BTREE_SEGMENTS:
            # Nothing rewritten: the old segments stay as they were, one more covers the merge.
            assert after[: len(before)] == before
            assert after[-1][1] == new_fragments and len(after) == len(before) + 1
        else:
            # The deltas are merged into one; the oldest segment is left alone.
            assert after[0] == oldest and len(after) == 2
            assert after[1][1] == frozenset(i for _, ids in before[1:] for i in ids) | new_fragments
        assert all(c.complete for c in index_coverage(tbl.store, tbl.dataset()))
        want = model.table(SCHEMA)
        assert tbl.lookup(list(range(BASE + n + 1))).sort_by("k") == want
        # Lance's own reader goes through every segment of the btree too.
        assert tbl.dataset().to_table(filter=f"k = {BASE + n}").num_rows == 1
    assert len(segments(tbl)) == 2
    tbl.flush()
    assert lance_latest_rows(tbl.uri, ["k"]) == model.table(SCHEMA)
    tbl.close()
