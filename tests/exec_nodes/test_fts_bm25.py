"""The full-text nodes alone: a MemTable's FTS leaf and GlobalBM25Exec over hand-built
MemTables (BM25 over the latest corpus only)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from exec_nodes.fts import SCORE, GlobalBM25Exec
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import FullText
from memwal_sql.compat.lance_fts import BM25_B, BM25_K1
from memwal_sql.expressions.predicate import Compare
from memwal_sql.formats.source_rows import TOMBSTONE, source_schema
from memwal_sql.writer.memtable_indexes import tokenizer_for
from tests.exec_nodes.nodes import CACHES, check_contract

WAL = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        pa.field("text", pa.string()),
        pa.field(TOMBSTONE, pa.bool_()),
    ]
)
SOURCE = source_schema(WAL)
TOKENIZER = tokenizer_for({}, CACHES)


def memtable(generation: int, ids, texts, dead=None) -> MemTableSourceExec:
    batch = pa.record_batch(
        {"id": pa.array(ids, pa.int64()), "text": texts, TOMBSTONE: dead or [False] * len(ids)},
        schema=WAL,
    )
    text = FullText("text", TOKENIZER, ("id",))
    return MemTableSourceExec("r", generation, [batch], SOURCE, text, caches=CACHES)


def bm25(tf: int, length: int, avgdl: float, n: int, df: int) -> float:
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf * (BM25_K1 + 1) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * length / avgdl))


def test_memtable_fts_leaf_yields_its_live_documents():
    leaf = memtable(3, [1, 2, 3], ["red fox", "gone", "blue fox"], dead=[False, True, False])
    out = check_contract(leaf)
    assert out.column("id").to_pylist() == [1, 3]  # the tombstone is no document
    (piece,) = leaf.pieces()
    assert piece.present.tolist() == [True, False, True]


def test_bm25_counts_only_the_latest_version_of_each_document():
    old = memtable(1, [1, 2, 3], ["fox fox", "fox", "cat"])
    # Key 1 rewritten without "fox", key 3 deleted: neither counts in the statistics any more.
    new = memtable(2, [1, 3], ["dog", None], dead=[False, True])
    node = GlobalBM25Exec([new, old], ["id"], TOKENIZER.terms("fox"), 10, None)
    out = check_contract(node)
    assert out.column("id").to_pylist() == [2]
    # The latest corpus: id 1 "dog" (1 token), id 2 "fox" (1 token); "fox" in one of them.
    want = bm25(tf=1, length=1, avgdl=1.0, n=2, df=1)
    assert np.isclose(out.column(SCORE)[0].as_py(), want, rtol=1e-6)
    stats = node.stats
    assert (stats.documents, stats.superseded, stats.deleted) == (2, 1, 1)
    assert "left out 1 superseded and 1 deleted" in node.describe()


def test_bm25_ranks_by_score_filters_candidates_and_keeps_unsearched_sources_in_the_stats():
    a = memtable(1, [1, 2], ["fox fox fox", "fox and a long tail of other words"])
    b = memtable(2, [7], ["fox"])
    node = GlobalBM25Exec([a, b], ["id"], ["fox"], 2, None, searched=[True, False])
    got = node.to_table()
    assert got.column("id").to_pylist() == [1, 2]  # 7 counts but is not searched
    scores = got.column(SCORE).to_pylist()
    assert scores[0] > scores[1]
    assert node.stats.documents == 3
    only = GlobalBM25Exec([a, b], ["id"], ["fox"], 2, Compare("id", ">", pa.scalar(1)))
    assert only.to_table().column("id").to_pylist() == [7, 2]  # a one-word document ranks first


def test_the_best_first_cut_through_a_tie_keeps_its_lowest_indices() -> None:
    """Ranking candidates: highest score first, a tie in index order, and a tie the cut at
    ``n`` goes through gives its lowest indices, so the rows returned do not depend on which
    other documents were scored (MaxScore scores fewer)."""
    from exec_nodes.fts import _best_first

    scores = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.5, 2.0])
    assert _best_first(scores, 4).tolist() == [1, 3, 2, 4]
    assert _best_first(scores, 3).tolist() == [1, 3, 2]
    assert _best_first(scores, 8).tolist() == [1, 3, 2, 4, 5, 7, 0, 6]
    ties = np.full(1000, 7.0)
    assert _best_first(ties, 5).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("scratch", [1 << 18, 7000])
def test_ratio_in_place_is_the_bm25_document_part_bit_for_bit(monkeypatch, scratch):
    """tf / (tf + k1 (1 - b + b len / avgdl)), computed in place (a range of postings at a
    time, through one scratch array), equals the formula written out (the top k's ties and
    the 1e-4 agreement with Lance rest on it): a swapped constant, a lost term or a range
    misaligned differs."""
    from exec_nodes import fts
    from exec_nodes.fts import _Postings, _ratio

    monkeypatch.setattr(fts, "_DENSE_DOCUMENTS", scratch)

    rng = np.random.default_rng(5)
    tf = rng.integers(1, 60, 50_000).astype(np.uint32)
    for length in (
        rng.integers(1, 9000, 50_000).astype(np.uint32),  # an index's postings
        rng.integers(1, 9000, 50_000).astype(np.int64),  # a tokenized piece's
    ):
        p = _Postings(
            lambda rows: pa.table({}),
            np.arange(50_000),
            tf,
            length,
            50_000,
            True,
            np.array([50_000]),
        )
        for avgdl in (1.0, 7.25, 123.456789):
            want = tf / (tf + BM25_K1 * (1 - BM25_B + BM25_B * length / avgdl))
            got = _ratio(p, avgdl)
            assert np.allclose(got, want, rtol=1e-12, atol=0)
            plain = tf.astype(np.float64)
            exact = plain / (plain + (BM25_K1 * (1 - BM25_B) + (BM25_K1 * BM25_B / avgdl) * length))
            assert np.array_equal(got, exact)


def test_a_memtables_text_keys_are_its_pieces_keys_without_tokenizing(monkeypatch):
    """Before its piece is made, a MemTable leaf's keys come from its batches without
    tokenizing: the same keys, addresses and present rows its piece then has; once the piece
    is made, its own arrays (what a search derived from them is found by them again)."""
    from memwal_sql.formats.tokenizer import Tokenizer

    ids = [5, 3, 5, 9]
    leaf = memtable(4, ids, ["a fox", "gone", "b fox", None], dead=[False, True, False, False])
    tokenized: list[int] = []
    real = Tokenizer.tokenize
    monkeypatch.setattr(
        Tokenizer, "tokenize", lambda self, texts: tokenized.append(len(texts)) or real(self, texts)
    )
    (early,) = leaf.text_keys()
    assert tokenized == []
    (piece,) = leaf.pieces()
    assert tokenized == [4]
    assert early.keys.equals(piece.keys)
    assert early.addresses.tolist() == piece.addresses.tolist() == [0, 1, 2, 3]
    assert early.present.tolist() == piece.present.tolist() == [True, False, True, True]
    again = memtable(4, ids, ["x"] * 4)  # another leaf: its own batches, its own piece
    assert again.text_keys()[0].keys is not piece.keys
    (held,) = MemTableSourceExec(
        "r", 4, leaf.batches, SOURCE, leaf.access, caches=CACHES
    ).text_keys()
    assert held.keys is piece.keys and held.present is piece.present
