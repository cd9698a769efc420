"""Full-text search over live data, checked against Lance 14's own full-text search over a fully
merged copy of the latest rows (ids and scores), after every step of generated sequences."""

from __future__ import annotations

import re

import lance
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

import memwal_sql as mw
from memwal_sql.errors import InvalidFilterError, InvalidInputError, SchemaMismatchError
from memwal_sql.formats.tokenizer import Tokenizer
from tests.lsm import Model, apply_op, op_sequences

SCHEMA = pa.schema(
    [pa.field("k", pa.int64(), False), pa.field("body", pa.string()), pa.field("g", pa.int64())]
)


def sentences() -> list[str]:
    import pydoc_data.topics as topics  # real English prose that ships with Python

    text = " ".join(topics.topics.values())
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 20 < len(s.strip()) < 400]


SENTENCES = sentences()
QUERIES = [
    "function return value",
    "class attribute",
    "exception raised",
    "loop iterator",
    "string format format",
    "the method is called",
    "module import",
]


def text_batch(keys: list[int], seed: int) -> pa.Table:
    """Distinct documents (each carries its own key, so no two tie); an update changes the
    text and its length."""
    body = [
        f"{SENTENCES[(k * 7 + seed * 13) % len(SENTENCES)]} "
        f"{SENTENCES[(k + seed) % len(SENTENCES)] if seed % 2 else ''} doc{k}x{seed}"
        for k in keys
    ]
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "body": body,
            "g": pa.array([(k + seed) % 3 for k in keys], pa.int64()),
        },
        schema=SCHEMA,
    )


def lance_fts(model: Model, root, query: str, k: int, filter: str | None = None) -> pa.Table:
    latest = model.table(SCHEMA)
    ds = lance.write_dataset(latest, str(root), mode="overwrite")
    ds.create_scalar_index("body", "INVERTED", replace=True)
    return ds.to_table(full_text_query=query, limit=k, filter=filter, prefilter=True)


def assert_same(ours: pa.Table, theirs: pa.Table) -> None:
    """Same scores in the same order (relative error below 1e-4), and the same ids: equal
    scores (the same term counts and length) tie, and Lance 14 orders a tie by row address, a
    merged copy's layout, so a tie group is compared as a set (the last one, cut by k, only
    by size)."""
    a, b = ours.column("_score").to_numpy(), theirs.column("_score").to_numpy()
    assert len(a) == len(b) and np.all(np.abs(a - b) <= 1e-4 * np.abs(b)), (a, b)
    ids_a, ids_b = ours.column("k").to_pylist(), theirs.column("k").to_pylist()
    start = 0
    for end in range(1, len(b) + 1):
        if end == len(b) or abs(b[end] - b[start]) > 1e-5 * abs(b[start]):
            if end < len(b):
                assert set(ids_a[start:end]) == set(ids_b[start:end]), (ids_a, ids_b, b)
            start = end


@pytest.fixture
def base_rows() -> pa.Table:
    return text_batch(list(range(200)), 0)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=op_sequences(300, 50, ["flush", "merge", "catchup", "compact"]))
def test_fts_equals_lance_on_merged_copy_after_every_step(tmp_path_factory, base_rows, ops) -> None:
    uri = str(tmp_path_factory.mktemp("fts"))
    tbl = mw.create_table(
        f"{uri}/t",
        base_rows,
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
        writer_config=mw.WriterConfig(durable_write=False, max_memtable_rows=40),
    )
    tbl.create_index("body", "INVERTED")
    model = Model(["k"])
    model.upsert(base_rows)
    for i, (op, keys, seed) in enumerate(ops):
        tbl = apply_op(tbl, model, op, keys, seed, f"{uri}/t", text_batch)
        query = QUERIES[i % len(QUERIES)]
        assert_same(tbl.fts(query, k=10), lance_fts(model, f"{uri}/m", query, 10))
        assert_same(
            tbl.fts(query, k=5, filter="g = 1"), lance_fts(model, f"{uri}/m", query, 5, "g = 1")
        )
    tbl.close()


def test_scores_follow_updates_and_deletes(tmp_path, base_rows) -> None:
    tbl = mw.create_table(
        str(tmp_path / "t"), base_rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    tbl.create_index("body", "INVERTED")
    model = Model(["k"])
    model.upsert(base_rows)
    best = tbl.fts("attribute", k=1).column("k")[0].as_py()
    # Its newer version no longer holds the term: neither version may be found.
    newer = pa.table(
        {"k": [best], "body": ["nothing relevant here at all"], "g": [0]}, schema=SCHEMA
    )
    tbl.upsert(newer)
    model.upsert(newer)
    got = tbl.fts("attribute", k=10)
    assert best not in got.column("k").to_pylist()
    assert_same(got, lance_fts(model, tmp_path / "m", "attribute", 10))
    tbl.flush()
    gone = got.column("k")[0].as_py()
    tbl.delete([gone])
    model.delete(pa.table({"k": [gone]}))
    got = tbl.fts("attribute", k=10)
    assert gone not in got.column("k").to_pylist()
    assert_same(got, lance_fts(model, tmp_path / "m", "attribute", 10))
    text = tbl.explain_search("attribute", k=10)
    assert "GlobalBM25Exec" in text and "1 deleted" in text and "superseded" in text
    tbl.close()


def test_tokenizer_agrees_with_lance_on_stop_words_and_lengths(tmp_path) -> None:
    words = [
        "the",
        "The",
        "does",
        "doing",
        "not",
        "no",
        "because",
        "running",
        "naïve",
        "Straße",
        "x" * 39,
        "y" * 40,
        "héllo",
        "re",
        "yourselves",
        "can't",
        "42",
        "a1b2",
    ]
    ds = lance.write_dataset(
        pa.table({"i": list(range(len(words))), "t": [f"zz {w}" for w in words]}), str(tmp_path)
    )
    ds.create_scalar_index("t", "INVERTED")
    tok = Tokenizer()
    for w in words:
        found = ds.to_table(full_text_query=w, columns=["i"]).num_rows > 0
        assert found == bool(tok.terms(w)), w


def test_bad_input_is_typed(tmp_path, base_rows) -> None:
    tbl = mw.create_table(str(tmp_path), base_rows, primary_key="k")
    with pytest.raises(InvalidInputError, match="text"):
        tbl.fts(["not", "text"])
    with pytest.raises(InvalidInputError, match="k must"):
        tbl.fts("x", k=-1)
    with pytest.raises(SchemaMismatchError):
        tbl.fts("x", column="g")
    with pytest.raises(InvalidFilterError):
        tbl.fts("x", filter="g = 1; DROP TABLE t")
    with pytest.raises(InvalidInputError, match="tokenizer"):
        Tokenizer({"base_tokenizer": "jieba/default"})
    tbl.close()


def test_every_filter_vector_search_takes_filters_a_full_text_search(tmp_path, base_rows) -> None:
    # A filter the predicate tree cannot say (``g % 2``, ``lower()``) goes the vector search's
    # way: applied to each candidate's latest version before ranking, so k rows still come back.
    tbl = mw.create_table(
        str(tmp_path), base_rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    tbl.upsert(text_batch([1, 2, 3, 500, 501], 3))
    everything = tbl.fts("class attribute", k=10_000)
    for text, keep in [
        ("g % 2 = 1", lambda r: r["g"] % 2 == 1),
        (
            "lower(body) LIKE '%class%' AND k > 3",
            lambda r: "class" in r["body"].lower() and r["k"] > 3,
        ),
    ]:
        want = [r["k"] for r in everything.to_pylist() if keep(r)][:5]
        assert len(want) == 5
        got = tbl.fts("class attribute", k=5, filter=text)
        assert got.column("k").to_pylist() == want, text
    tbl.close()


def test_sql_fts_function_joins_with_the_table(tmp_path, base_rows) -> None:
    tbl = mw.create_table(
        str(tmp_path), base_rows, primary_key="k", region_spec=mw.RegionSpec.bucket("k", 2)
    )
    tbl.create_index("body", "INVERTED")
    tbl.upsert(text_batch([1, 2, 3, 500], 3))
    ctx = mw.connect()
    ctx.register("docs", tbl)
    want = tbl.fts("class attribute", k=5, filter="g = 1")
    got = ctx.sql(
        "SELECT f.k, f._score, d.g FROM fts('docs', 'body', 'class attribute', 5) f "
        "JOIN docs d ON d.k = f.k WHERE f.g = 1 ORDER BY f._score DESC"
    ).to_arrow_table()
    assert got.column("k").to_pylist() == want.column("k").to_pylist()
    assert set(got.column("g").to_pylist()) == {1}
    tbl.close()


def test_indexed_writes_index_the_memtable_before_returning(
    tmp_path, base_rows, monkeypatch
) -> None:
    """With ``indexed_writes``, a write returns with the MemTable's inverted index already
    holding it: a search afterwards tokenizes nothing (and still finds the new row)."""
    from memwal_sql.formats.tokenizer import Tokenizer

    tbl = mw.create_table(
        str(tmp_path),
        base_rows,
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
        writer_config=mw.WriterConfig(indexed_writes=True),
    )
    tbl.create_index("body", "INVERTED")
    tbl.upsert(text_batch([1000], 1))
    tbl.fts("zebra quagga", k=3)  # tokenizes the base and the MemTable, once
    fresh = pa.table({"k": [2000], "body": ["a zebra and a quagga"], "g": [0]}, schema=SCHEMA)
    tbl.upsert(fresh)

    def no_tokenizing(self, texts):
        raise AssertionError("the search had to tokenize rows an indexed write should have")

    monkeypatch.setattr(Tokenizer, "tokenize", no_tokenizing)
    assert tbl.fts("zebra quagga", k=3).column("k").to_pylist() == [2000]
    monkeypatch.undo()
    tbl.close()


def test_writer_config_rejects_a_non_boolean_indexed_writes() -> None:
    with pytest.raises(InvalidInputError, match="indexed_writes"):
        mw.WriterConfig(indexed_writes="yes")
