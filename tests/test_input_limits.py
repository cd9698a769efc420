"""Hostile inputs never crash or stall the process: a huge ``k``, a huge filter, a huge
full-text query each get an answer or a typed error. What used to abort the interpreter runs in
a subprocess, so a regression fails the test instead of killing pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.errors import InvalidInputError
from memwal_sql.search import MAX_FTS_QUERY_BYTES, MAX_SEARCH_K

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_isolated(script: str, *args: str) -> list[str]:
    """Run ``script`` in a fresh interpreter; its stdout lines (it must exit 0: an abort or a
    segfault fails the test with the exit code and stderr's tail)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout.split()


VECTORS = """
    import sys, tempfile, numpy as np, pyarrow as pa, memwal_sql as mw
    from memwal_sql.errors import InvalidInputError
    n, dim = 600, 4
    vecs = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    rows = pa.table({"id": pa.array(range(n), pa.int64()),
                     "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), dim),
                     "text": [f"word{i % 7} other" for i in range(n)]})
    tbl = mw.create_table(tempfile.mkdtemp(), rows, primary_key="id")
    tbl.create_index("vec", "IVF_PQ", num_partitions=2, num_sub_vectors=2)
    tbl.upsert(rows.slice(0, 5))  # a MemTable beside the indexed base
    q = np.zeros(dim, np.float32)
    ctx = mw.connect()
    ctx.register("t", tbl)
    def sql(k):
        return ctx.sql(f"SELECT id FROM vector_search('t', 'vec', [0.0, 0.0, 0.0, 0.0], {k})")
"""


def test_a_huge_k_is_capped_at_the_rows_and_one_past_the_bound_is_refused() -> None:
    out = run_isolated(
        VECTORS
        + """
    print(tbl.vector_search(q, k=10**9).num_rows)
    print(tbl.vector_search(q, k=200, refine_factor=10**9).num_rows)
    print(sql(10**9).to_arrow_table().num_rows)
    for call in (lambda: tbl.vector_search(q, k=10**12), lambda: tbl.fts("x", k=10**12),
                 lambda: sql(10**12).to_arrow_table()):
        try:
            call()
            print("accepted")
        except InvalidInputError as e:
            print("refused" if "limit" in str(e) else repr(e))
    """
    )
    assert out == ["600", "200", "600", "refused", "refused", "refused"]


def test_search_counts_are_positive_integers_up_to_the_bound(tmp_path) -> None:
    rows = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(4, np.float32)), 2),
            "text": ["a b", "b c"],
        }
    )
    tbl = mw.create_table(str(tmp_path), rows, primary_key="id")
    q = np.zeros(2, np.float32)
    assert tbl.vector_search(q, k=MAX_SEARCH_K).num_rows == 2
    assert tbl.fts("b", k=MAX_SEARCH_K).num_rows == 2
    for bad in ({"k": MAX_SEARCH_K + 1}, {"nprobes": 2**64}, {"refine_factor": 2**32}, {"k": True}):
        with pytest.raises(InvalidInputError):
            tbl.vector_search(q, **bad)
    with pytest.raises(InvalidInputError, match="limit"):
        tbl.fts("b", k=MAX_SEARCH_K + 1)
    tbl.close()


def test_a_long_full_text_query_is_answered_as_its_terms_say_and_one_past_the_bound_refused(
    tmp_path,
) -> None:
    # Words the corpus never holds add nothing to a BM25 score: a query padded with them to
    # the bound ranks and scores exactly as its corpus words alone (one named twice counts
    # twice), whatever source the documents live in.
    docs = [f"red fox number{i} " + ("hen " * (i % 3)) for i in range(300)]
    rows = pa.table({"id": pa.array(range(300), pa.int64()), "text": docs})
    tbl = mw.create_table(str(tmp_path), rows, primary_key="id")
    tbl.create_index("text", "INVERTED")
    tbl.upsert(pa.table({"id": pa.array([5, 400], pa.int64()), "text": ["hen hen", "red"]}))
    tbl.flush()
    tbl.upsert(pa.table({"id": pa.array([7], pa.int64()), "text": ["fox hen number8"]}))
    words = "red hen hen number8"
    rng = np.random.default_rng(0)
    padding = []
    size = len(words)
    while size < MAX_FTS_QUERY_BYTES - 16:
        padding.append("q" + "".join(rng.choice(list("bcdfgjkvwxz"), 8)))
        size += len(padding[-1]) + 1
    query = " ".join([*padding[: len(padding) // 2], words, *padding[len(padding) // 2 :]])
    assert len(query.encode()) <= MAX_FTS_QUERY_BYTES
    want = tbl.fts(words, k=20)
    got = tbl.fts(query, k=20)
    assert got.column("id").to_pylist() == want.column("id").to_pylist()
    assert got.column("_score").to_pylist() == want.column("_score").to_pylist()
    with pytest.raises(InvalidInputError, match="limit"):
        tbl.fts(query + " " + "x" * (MAX_FTS_QUERY_BYTES - len(query)))
    with pytest.raises(InvalidInputError, match="surrogate"):
        tbl.fts("red \ud800")
    tbl.close()


FILTERS = """
    import sys, tempfile, numpy as np, pyarrow as pa, memwal_sql as mw
    from memwal_sql.errors import InvalidFilterError, InvalidInputError
    n = 600
    vecs = np.random.default_rng(0).normal(size=(n, 2)).astype(np.float32)
    rows = pa.table({"id": pa.array(range(n), pa.int64()), "v": pa.array(range(n), pa.int64()),
                     "s": [str(i % 50) for i in range(n)],
                     "vec": pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel()), 2),
                     "text": ["red fox"] * n})
    tbl = mw.create_table(tempfile.mkdtemp(), rows, primary_key="id",
                          region_spec=mw.RegionSpec.bucket("id", 2))
    tbl.upsert(rows.slice(0, 100))
    ctx = mw.connect()
    ctx.register("t", tbl)
    q = np.zeros(2, np.float32)
    huge = " OR ".join(f"v = {i}" for i in range(12_000))
    for call in (lambda: tbl.to_arrow(filter=huge), lambda: tbl.count_rows(filter=huge),
                 lambda: tbl.scan(filter=huge), lambda: tbl.vector_search(q, filter=huge),
                 lambda: tbl.fts("fox", "text", filter=huge),
                 lambda: ctx.sql("SELECT id FROM t WHERE " + huge).to_arrow_table(),
                 lambda: ctx.sql("SELECT id FROM vector_search('t', 'vec', [0.0, 0.0], 5) "
                                 "WHERE " + huge).to_arrow_table()):
        try:
            call()
            print("accepted")
        except InvalidInputError as e:
            print(type(e).__name__)
    # A quote DataFusion's lexer reads inside a literal, a name or a comment hides nothing.
    for hider in (r"E'\\'' = ''", "`'` = 1", "$$'$$ = ''", "/* /* */ ' */ 1 = 1"):
        for call in (lambda: tbl.to_arrow(filter=hider + " OR " + huge),
                     lambda: ctx.sql("SELECT id FROM t WHERE " + hider + " OR " + huge)):
            try:
                call()
                print("accepted")
            except InvalidInputError as e:
                print(type(e).__name__)
    # At the bound (1,019 operators), pairs of terms DataFusion cannot merge into an IN list:
    # a tree 255 deep, which pyarrow's Substrait would make 2**255 big.
    terms = [f"(v = {i} AND s = '{i % 50}')" for i in range(0, 510, 2)]
    bound = " OR ".join(terms)
    print(tbl.to_arrow(filter=bound).num_rows, tbl.count_rows(filter=bound))
    print(ctx.sql("SELECT count(*) AS n FROM t WHERE " + bound).to_pydict()["n"][0])
    print(tbl.vector_search(q, k=1000, filter=bound).num_rows)
"""


def test_a_huge_filter_is_refused_typed_and_one_at_the_bound_runs() -> None:
    out = run_isolated(FILTERS)
    refusals = ["InvalidFilterError"] * 5 + ["InvalidInputError"] * 2
    refusals += ["InvalidFilterError", "InvalidInputError"] * 4
    # v = i and s = i % 50 hold together for even i below 510 with i % 50 == i % 50: all 255.
    assert out == [*refusals, "255", "255", "255", "255"]
