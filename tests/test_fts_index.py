"""Full-text search through the base's inverted index: the postings and statistics read from
Lance's index files, corrected to the latest corpus, give the scores Lance's own search gives
on a fully merged, fully indexed copy; and the base is not tokenized."""

from __future__ import annotations

import json
import threading
from collections import Counter

import lance
import numpy as np
import pyarrow as pa
import pytest

import memwal_sql as mw
from memwal_sql.formats.tokenizer import Tokenizer
from tests.lsm import Model
from tests.test_fts import SCHEMA, assert_same, lance_fts

VOCABULARY = np.array([f"w{i}" for i in range(3000)])
QUERIES = ["w1 w7 w40", "w2 w2 w300", "w3 zzzabsent", "w0 w5 w9 w11 w2999"]


def rows(keys: list[int], seed: int, words: int = 60) -> pa.Table:
    """Documents of Zipf-distributed words, each also holding its own key (no two tie)."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(VOCABULARY) + 1) ** 1.1
    lengths = rng.integers(words // 2, words, len(keys))
    picked = rng.choice(len(VOCABULARY), size=int(lengths.sum()), p=p / p.sum())
    ends = np.cumsum(lengths)
    body = [
        " ".join(VOCABULARY[picked[e - n : e]]) + f" doc{k}x{seed}"
        for k, n, e in zip(keys, lengths, ends)
    ]
    return pa.table(
        {"k": pa.array(keys, pa.int64()), "body": body, "g": pa.array([k % 3 for k in keys])},
        schema=SCHEMA,
    )


def partitions(tbl) -> int:
    from lance.file import LanceFileReader

    ds = tbl.dataset()
    (index,) = [d for d in ds.describe_indices() if d.field_names == ["body"]]
    count = 0
    for segment in index.segments:
        meta = LanceFileReader(f"{ds.uri}/_indices/{segment.uuid}/metadata.lance").metadata()
        count += len(json.loads(meta.schema.metadata[b"partitions"]))
    return count


def check(tbl, model: Model, root, ks=(10, 40)) -> None:
    for query in QUERIES:
        for k in ks:
            assert_same(tbl.fts(query, k=k), lance_fts(model, root, query, k))


def count_tokenized(monkeypatch) -> list[int]:
    """From now on, the number of documents of each ``Tokenizer.tokenize`` call."""
    tokenized: list[int] = []
    real = Tokenizer.tokenize

    def counting(self, texts):
        tokenized.append(len(texts))
        return real(self, texts)

    monkeypatch.setattr(Tokenizer, "tokenize", counting)
    return tokenized


@pytest.fixture
def indexed(tmp_path):
    """A 6,000-row base with a two-partition inverted index (Lance's ``memory_limit``)."""
    base = rows(list(range(6000)), 0)
    tbl = mw.create_table(
        str(tmp_path / "t"),
        base,
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
        writer_config=mw.WriterConfig(durable_write=False),
    )
    tbl.create_index("body", "INVERTED", memory_limit=1)
    model = Model(["k"])
    model.upsert(base)
    yield tbl, model
    tbl.close()


def test_index_search_is_exact_after_updates_deletes_merges_and_appends(indexed, tmp_path):
    tbl, model = indexed
    assert partitions(tbl) >= 2
    root = tmp_path / "m"
    check(tbl, model, root)
    # Updates and deletes of base rows that hold the query terms, some of them merged into
    # the base (deleted rows in indexed fragments, new unindexed fragments), some flushed,
    # some still in the MemTable.
    holders = [r["k"] for r in tbl.fts("w1 w2 w3 w7", k=400).to_pylist()]
    steps = [holders[0:120], holders[120:200], holders[200:260]]
    for i, keys in enumerate(steps):
        update, gone = keys[: len(keys) // 2], keys[len(keys) // 2 :]
        fresh = rows(update + [10_000 + 100 * i + j for j in range(30)], 10 + i, words=20)
        tbl.upsert(fresh)
        model.upsert(fresh)
        tbl.delete(pa.table({"k": pa.array(gone, pa.int64())}))
        model.delete(pa.table({"k": pa.array(gone, pa.int64())}))
        if i == 0:
            tbl.flush()
            tbl.merge()
        elif i == 1:
            tbl.flush()
        check(tbl, model, root)
    text = tbl.explain_search("w1 w7", k=10)
    assert "through index" in text and "tokenizing 0 unindexed" not in text, text
    assert "superseded" in text and "deleted" in text
    assert "through its inverted index" in text, text  # the flushed generation
    # The index caught up (a delta partition): nothing is tokenized in the base any more.
    tbl.catch_up_indexes()
    check(tbl, model, root, ks=(10,))
    assert "tokenizing 0 unindexed fragments" in tbl.explain_search("w1 w7", k=10)


def test_an_indexed_base_is_not_tokenized(indexed, monkeypatch, tmp_path):
    tbl, model = indexed
    fresh = rows([1, 2, 9000], 5)
    tbl.upsert(fresh)
    model.upsert(fresh)
    tokenized = count_tokenized(monkeypatch)
    assert_same(tbl.fts("w1 w7 w40", k=10), lance_fts(model, tmp_path / "m", "w1 w7 w40", 10))
    assert sum(tokenized) == 3  # the MemTable's rows only, none of the base's 6,000
    text = tbl.explain_search("w1 w7 w40", k=10)
    assert "through index" in text, text


def test_an_index_with_positions_falls_back_to_tokenizing_and_says_why(tmp_path):
    base = rows(list(range(300)), 1)
    tbl = mw.create_table(str(tmp_path / "t"), base, primary_key="k")
    tbl.create_index("body", "INVERTED", with_position=True)
    model = Model(["k"])
    model.upsert(base)
    fresh = rows([1, 2, 3, 900], 2)
    tbl.upsert(fresh)
    model.upsert(fresh)
    check(tbl, model, tmp_path / "m", ks=(10,))
    text = tbl.explain_search("w1 w7", k=10)
    assert "tokenizing all" in text and "with_position" in text, text
    tbl.close()


def test_an_unsupported_index_layout_is_refused(tmp_path, monkeypatch):
    from memwal_sql.compat import lance_inverted

    ds = lance.write_dataset(rows(list(range(50)), 3), str(tmp_path))
    ds.create_scalar_index("body", "INVERTED")
    uuid = ds.describe_indices()[0].segments[0].uuid
    directory = f"{ds.uri}/_indices/{uuid}"
    assert not isinstance(lance_inverted.open_index(directory), str)
    monkeypatch.setitem(lance_inverted._SUPPORTED, "format_version", "3")
    assert "format_version is '2', only '3'" in lance_inverted.open_index(directory)


def test_the_base_full_text_leaf_yields_every_live_document(indexed):
    from exec_nodes.base_source import BaseSourceExec
    from exec_nodes.source import FullText
    from memwal_sql.formats.source_rows import source_schema
    from memwal_sql.writer.memtable_indexes import tokenizer_for

    tbl, _ = indexed
    tbl.delete(pa.table({"k": pa.array([5, 6], pa.int64())}))
    tbl.flush()
    tbl.merge()  # two rows deleted in the indexed fragment
    ds = tbl.dataset()
    text = FullText("body", tokenizer_for({}, tbl.caches), ("k",))
    leaf = BaseSourceExec(ds, source_schema(ds.schema), text, caches=tbl.caches)
    assert leaf.text_index() is not None and leaf.pieces() == []
    keys = leaf.to_table().column("k").to_pylist()
    assert sorted(keys) == [k for k in range(6000) if k not in (5, 6)]


@pytest.mark.parametrize("deleted", [True, False])
@pytest.mark.parametrize("count", [3, 40])
def test_base_rows_of_newer_keys_are_found_by_btree_or_by_one_key_column_read(
    indexed, monkeypatch, count, deleted
):
    """A full-text search finds the base rows a newer source supersedes by key: a few keys
    through the btree, many (more than one per 256 base rows) by reading the key column once,
    a batch at a time (the addresses from the fragments' order when no row is deleted); all
    give the live row's address, -1 for a deleted or absent key."""
    from exec_nodes import base_source
    from exec_nodes.base_source import BaseSourceExec
    from exec_nodes.source import FullText
    from memwal_sql.formats.source_rows import source_schema
    from memwal_sql.writer.memtable_indexes import tokenizer_for

    tbl, _ = indexed
    monkeypatch.setattr(base_source, "_KEY_BATCH_ROWS", 1000)  # several batches a fragment
    if deleted:
        tbl.delete(pa.table({"k": pa.array([5], pa.int64())}))
        tbl.flush()
        tbl.merge()  # key 5 deleted in the base
    ds = tbl.dataset()
    text = FullText("body", tokenizer_for({}, tbl.caches), ("k",))
    leaf = BaseSourceExec(ds, source_schema(ds.schema), text, caches=tbl.caches)
    leaf._key_index = lambda: None  # a base too big to keep its keys
    wanted = [5, 99_999, *range(100, 100 + 7 * count, 7)][:count]
    many = len(wanted) * base_source._KEYS_PER_SCAN > ds.count_rows()
    assert many == (count == 40)
    found = leaf.key_addresses(pa.table({"k": pa.array(wanted, pa.int64())}))
    live = ds.to_table(columns=["k"], with_row_address=True).to_pydict()
    address = dict(zip(live["k"], live["_rowaddr"]))
    assert found.tolist() == [address.get(k, -1) for k in wanted]


def test_flushed_generations_are_read_through_their_own_index(indexed, monkeypatch, tmp_path):
    """Generations flushed while the base has an inverted index carry one of their own (built
    at flush): a search reads their documents' lengths and the query terms' postings from it,
    tokenizes only the MemTable, and still scores exactly as Lance does on a merged copy."""
    tbl, model = indexed
    holders = [r["k"] for r in tbl.fts("w1 w2 w7", k=200).to_pylist()]
    for i, keys in enumerate([holders[:60], holders[60:120], holders[120:140]]):
        fresh = rows(keys[: len(keys) // 2] + [20_000 + 100 * i + j for j in range(25)], 30 + i)
        gone = pa.table({"k": pa.array(keys[len(keys) // 2 :], pa.int64())})
        for target in (tbl, model):
            target.upsert(fresh)
            target.delete(gone)
        if i < 2:
            tbl.flush()  # two generations; the last step stays in the MemTable
    tokenized = count_tokenized(monkeypatch)
    check(tbl, model, tmp_path / "m")
    assert max(tokenized) <= 25 + 10 + 10  # the MemTable's rows (and tombstones) only
    text = tbl.explain_search("w1 w7", k=10)
    generations = text.count("GenerationSourceExec")
    assert generations >= 2 and text.count("through its inverted index") == generations, text


@pytest.mark.parametrize("query", ["w0 w2999", "w1 w1 w5", "w2 w3 w4 w5 w6", "w2998 w2999"])
def test_pruned_top_k_equals_scoring_every_document(indexed, monkeypatch, query):
    """MaxScore scores only the documents that may reach the k-th best score: the same rows
    and scores as scoring every document, ties included, while scoring fewer of them when a
    rare term decides the best (``w0`` is in most documents, ``w2999`` in few)."""
    from exec_nodes import fts

    tbl, _ = indexed
    tbl.upsert(rows([1, 2, 3, 7000], 9))
    scored: list[int] = []
    real_scores = fts._scores

    def counting(p, part, floor, reached):
        out = real_scores(p, part, floor, reached)
        scored.append(len(out[1]))
        return out

    monkeypatch.setattr(fts, "_scores", counting)
    for k in (1, 3, 10, 50):
        scored.clear()
        pruned = tbl.fts(query, k=k)
        pruned_count = sum(scored)
        with monkeypatch.context() as m:
            m.setattr(fts, "_floors", lambda *a: (None, None))
            scored.clear()
            every = tbl.fts(query, k=k)
            every_count = sum(scored)
        assert pruned.equals(every), (query, k)
        assert pruned_count <= every_count
        if query == "w0 w2999" and k <= 3:  # fewer than 10 documents hold w2999
            assert pruned_count * 4 < every_count, (pruned_count, every_count)


@pytest.mark.parametrize("pruned", [True, False])
@pytest.mark.parametrize("query", ["w0 w1 w2", "w0 w2999", "w1 w1 w5"])
def test_dense_scores_are_added_up_a_range_of_documents_at_a_time(
    indexed, monkeypatch, query, pruned
):
    """Scoring every document 256 documents at a time gives the rows and scores (bit for
    bit) of one score array over the whole partition, and no score array is longer than a
    range: a range's postings sliced or offset wrongly, or its parts added in another
    order, differs."""
    from exec_nodes import fts

    tbl, _ = indexed
    tbl.upsert(rows([1, 2, 3, 7000], 9))
    if not pruned:  # every posting scored, whatever the k-th best
        monkeypatch.setattr(fts, "_floors", lambda *a: (None, None))
    whole = {k: tbl.fts(query, k=k) for k in (1, 10, 50)}
    monkeypatch.setattr(fts, "_DENSE_DOCUMENTS", 256)
    monkeypatch.setattr(fts, "_DENSE_WHOLE", 256)
    lengths: list[int] = []
    real = fts._dense_scores

    def counting(p, part):
        for lo, score in real(p, part):
            lengths.append(len(score))
            yield lo, score

    monkeypatch.setattr(fts, "_dense_scores", counting)
    for k, want in whole.items():
        assert tbl.fts(query, k=k).equals(want), (query, k)
    assert max(lengths, default=0) <= 256, lengths
    if not pruned:  # each partition's 3,000 or so documents in ranges
        assert len(lengths) >= 3 * 3 * partitions(tbl), lengths


def test_warm_searches_keep_what_they_derive_from_the_index_until_the_corpus_changes(
    indexed, monkeypatch, tmp_path
):
    """Searching the same corpus again derives nothing from the base index's postings again
    (their concatenation, BM25 ratios and MaxScore samples are kept); a write that changes
    the average length derives the ratios anew, and both searches are exact."""
    tbl, model = indexed
    root = tmp_path / "m"
    loads: Counter[str] = Counter()
    real = tbl.caches.search.get

    def get(kind, uri, load, current=None):
        def counted():
            loads[kind] += 1
            return load()

        return real(kind, uri, counted, current)

    monkeypatch.setattr(tbl.caches.search, "get", get)
    kinds = ("fts_matches", "fts_ratio", "fts_sample")
    query = QUERIES[0]
    assert_same(tbl.fts(query, k=10), lance_fts(model, root, query, 10))
    first = {kind: loads[kind] for kind in kinds}
    assert all(first[kind] == partitions(tbl) for kind in kinds), first
    loads.clear()
    assert_same(tbl.fts(query, k=10), lance_fts(model, root, query, 10))
    assert not any(loads[kind] for kind in kinds), loads
    fresh = rows([9001], 8, words=400)  # a long document: the average length grows
    tbl.upsert(fresh)
    model.upsert(fresh)
    assert_same(tbl.fts(query, k=10), lance_fts(model, root, query, 10))
    assert loads["fts_ratio"] == partitions(tbl) and loads["fts_matches"] == 0, loads


def test_non_ascii_texts_score_as_lance_scores_a_merged_copy(tmp_path):
    """Accented, non-Latin, digit and symbol characters, empty and NULL texts: in the base
    (through its index) and in a MemTable that updates and deletes base rows holding the
    query terms (split over their UTF-8 bytes), the scores Lance gives a merged copy."""
    words = ["naïve", "café", "Straße", "Ωmega", "東京", "x😀y", "“quoted”", "٣٤", "ÉCOLE"]
    words += ["run", "runner", "w1"]

    def docs(keys: list[int], seed: int) -> pa.Table:
        rng = np.random.default_rng(seed)
        body = [
            None if k % 17 == 0 else "" if k % 13 == 0 else " ".join(rng.choice(words, 1 + k % 9))
            for k in keys
        ]
        return pa.table(
            {"k": pa.array(keys, pa.int64()), "body": body, "g": [k % 3 for k in keys]},
            schema=SCHEMA,
        )

    base = docs(list(range(600)), 0)
    tbl = mw.create_table(
        str(tmp_path / "t"),
        base,
        primary_key="k",
        writer_config=mw.WriterConfig(durable_write=False),
    )
    tbl.create_index("body", "INVERTED")
    model = Model(["k"])
    model.upsert(base)
    fresh = docs([*range(0, 300, 3), *range(1000, 1050)], 1)
    gone = pa.table({"k": pa.array(list(range(1, 300, 7)), pa.int64())})
    for target in (tbl, model):
        target.upsert(fresh)
        target.delete(gone)
    for query in ["naïve café", "東京 straße", "ωmega run", "école ٣٤ x"]:
        for k in (5, 40):
            assert_same(tbl.fts(query, k=k), lance_fts(model, tmp_path / "m", query, k))
    tbl.close()


def update_holders(tbl, model) -> list[int]:
    """Update 40 of the 100 best documents for "w1 w7 w40" and delete 20 more (in ``tbl``
    and ``model``); the 100 keys, best first."""
    holders = [r["k"] for r in tbl.fts("w1 w7 w40", k=100).to_pylist()]
    fresh = rows([*holders[:40], 30_000, 30_001], 7, words=20)
    gone = pa.table({"k": pa.array(holders[40:60], pa.int64())})
    for target in (tbl, model):
        target.upsert(fresh)
        target.delete(gone)
    return holders


def test_superseded_base_rows_are_found_while_the_index_files_are_read(
    indexed, monkeypatch, tmp_path
):
    """A cold search looks up the base rows newer sources supersede while the base index's
    document file is still being read, not after: the read here waits (at most a minute) for
    that lookup, and the scores stay exactly Lance's on a merged copy."""
    from exec_nodes.base_source import BaseSourceExec
    from exec_nodes.fts_index import BaseTextIndex

    tbl, model = indexed
    update_holders(tbl, model)
    tbl.flush()
    looked_up = threading.Event()
    overlapped: list[bool] = []
    key_addresses, prefetch = BaseSourceExec.key_addresses, BaseTextIndex.prefetch_documents

    def looking_up(self, keys):
        looked_up.set()
        return key_addresses(self, keys)

    def waiting_prefetch(self):
        overlapped.append(looked_up.wait(60))
        prefetch(self)

    monkeypatch.setattr(BaseSourceExec, "key_addresses", looking_up)
    monkeypatch.setattr(BaseTextIndex, "prefetch_documents", waiting_prefetch)
    reopened = mw.open_table(tbl.uri)  # cold: nothing of the index read yet
    try:
        query = "w1 w7 w40"
        assert_same(reopened.fts(query, k=10), lance_fts(model, tmp_path / "m", query, 10))
    finally:
        reopened.close()
    assert overlapped == [True]


def test_a_partitions_live_postings_are_12_bytes_each_and_leave_the_superseded_out(indexed):
    """The live postings a search derives from each index partition are the decoded ones
    less the documents newer sources supersede or delete, in the decoded order, at 12 bytes
    a posting (document, frequency and length as ``uint32``: int64 copies were fresh memory
    on every cold search); an offset slip between terms or a dead document kept differs."""
    from exec_nodes.base_source import BaseSourceExec
    from exec_nodes.fts_index import index_docs, index_postings
    from exec_nodes.source import FullText
    from memwal_sql.formats.source_rows import source_schema
    from memwal_sql.writer.memtable_indexes import tokenizer_for

    tbl, _ = indexed
    holders = [r["k"] for r in tbl.fts("w1 w7", k=200).to_pylist()]
    tbl.upsert(rows(holders[:30], 3, words=10))
    tbl.delete(pa.table({"k": pa.array(holders[30:50], pa.int64())}))
    terms = ["w1", "w7"]
    ds = tbl.dataset()
    text = FullText("body", tokenizer_for({}, tbl.caches), ("k",))
    index = BaseSourceExec(ds, source_schema(ds.schema), text, caches=tbl.caches).text_index()
    assert index is not None
    live_keys = set(tbl.to_arrow().column("k").to_pylist())
    fresh = set(holders[:30])
    found = ds.to_table(columns=["k"], with_row_address=True).to_pydict()
    superseded = np.sort(
        np.array(
            [a for k, a in zip(found["k"], found["_rowaddr"]) if k in fresh or k not in live_keys],
            dtype=np.uint64,
        )
    )
    matches = index.matches(terms, superseded)
    left_out = 0
    for (files, p), part in zip(index.partitions, matches.partitions):
        docs = index_docs(tbl.caches, files, p)
        want_doc, want_tf = [], []
        for d, f in index_postings(tbl.caches, files, p, terms):
            live = ~np.isin(docs.rowid[d], superseded)
            left_out += int(np.count_nonzero(~live))
            want_doc.append(d[live])
            want_tf.append(f[live])
        assert part.doc.tolist() == np.concatenate(want_doc).tolist()
        assert part.tf.tolist() == np.concatenate(want_tf).tolist()
        assert part.length.tolist() == docs.length[part.doc].tolist()
        assert part.counts.tolist() == [len(d) for d in want_doc]
        assert part.doc.nbytes + part.tf.nbytes + part.length.nbytes == 12 * len(part.doc)
    assert left_out >= 40  # the updated and deleted holders of w1 or w7


def test_key_membership_by_table_drops_values_outside_the_wanted_span():
    """The wanted keys' table is looked up with every value clipped to its span: values below
    it, above it, at the int64 and uint64 ends, are not members; those inside are exactly
    the wanted ones."""
    from exec_nodes.base_source import _Member

    member = _Member(pa.array([5, 7, 9], pa.int64()), 3)
    assert member.table is not None
    values = pa.array([-(2**63), -1, 0, 4, 5, 6, 7, 9, 10, 2**63 - 1], pa.int64())
    assert member(values).tolist() == [False] * 4 + [True, False, True, True, False, False]
    unsigned = _Member(pa.array([0, 3], pa.uint64()), 3)
    assert unsigned(pa.array([0, 1, 3, 4, 2**64 - 1], pa.uint64())).tolist() == [
        True,
        False,
        True,
        False,
        False,
    ]


def test_score_parts_computed_a_term_at_a_time_are_the_products_of_one_array():
    """A posting's part is its term's coefficient times its ratio wherever it is computed:
    a term's slice, a range, gathered positions and the whole array are the same products,
    bit for bit (a coefficient of the wrong term, or an offset slip, differs)."""
    from exec_nodes.fts import _Parts

    rng = np.random.default_rng(3)
    counts = np.array([5, 0, 7, 3])
    bounds = np.concatenate([[0], np.cumsum(counts)])
    parts = _Parts(rng.random(int(counts.sum())), np.array([1.7, 9.0, 0.3, 2.9]), bounds)
    whole = np.repeat(parts.coefficient, counts) * parts.ratio
    assert parts.whole().tobytes() == whole.tobytes()
    assert [t for t, _, _ in parts.terms()] == [0, 2, 3]
    for t, a, b in parts.terms():
        assert parts.of(t, slice(a, b)).tobytes() == whole[a:b].tobytes()
        at = np.array([b - 1, a])
        assert parts.of(t, at).tobytes() == whole[at].tobytes()


def test_superseded_base_rows_are_found_while_the_memtables_are_tokenized(
    indexed, monkeypatch, tmp_path
):
    """A cold search finds the base rows the WAL tail's MemTables supersede from their keys
    alone, before they are tokenized: tokenizing here waits (at most a minute) for that
    lookup. Scores stay exactly Lance's on a merged copy; a second search finds them again
    without looking them up, and one after a write looks them up once more."""
    from exec_nodes.base_source import BaseSourceExec
    from exec_nodes.memtable_source import MemTableSourceExec

    tbl, model = indexed
    holders = update_holders(tbl, model)
    for w in tbl.live_writers().values():  # the WAL written, the MemTables left unflushed
        w.release()
    looked_up = threading.Event()
    overlapped: list[bool] = []
    lookups: list[int] = []
    key_addresses, tokenize = BaseSourceExec.key_addresses, MemTableSourceExec._text_pieces

    def looking_up(self, keys):
        lookups.append(keys.num_rows)
        looked_up.set()
        return key_addresses(self, keys)

    def waiting_tokenize(self):
        overlapped.append(looked_up.wait(60))
        return tokenize(self)

    monkeypatch.setattr(BaseSourceExec, "key_addresses", looking_up)
    monkeypatch.setattr(MemTableSourceExec, "_text_pieces", waiting_tokenize)
    reopened = mw.open_table(tbl.uri)  # cold: the WAL tail replayed, not tokenized yet
    try:
        query = "w1 w7 w40"
        assert_same(reopened.fts(query, k=10), lance_fts(model, tmp_path / "m", query, 10))
        assert overlapped and all(overlapped), overlapped
        assert len(lookups) == 1
        assert_same(reopened.fts(query, k=40), lance_fts(model, tmp_path / "m", query, 40))
        assert len(lookups) == 1  # nothing written: the superseded rows are kept
        more = rows([holders[70], 30_002], 9, words=20)
        for target in (reopened, model):
            target.upsert(more)
        assert_same(reopened.fts(query, k=10), lance_fts(model, tmp_path / "m", query, 10))
        assert len(lookups) == 2
    finally:
        reopened.close()


def test_a_search_asking_while_the_index_is_read_early_reads_each_file_once(
    indexed, monkeypatch, tmp_path
):
    """A cold search starts reading the base index's document files and postings before it
    takes its snapshot (here the snapshot waits for that read to start); when it asks for
    them while that read is under way (here the first document file is held until the
    search asks), it waits for that read instead of reading again: the index opened once,
    each partition's document file and postings read once, and the scores stay Lance's on a
    merged copy."""
    from exec_nodes import fts_index
    from exec_nodes.fts_index import BaseTextIndex
    from memwal_sql import search

    tbl, model = indexed
    update_holders(tbl, model)
    tbl.flush()
    asked, reading, held, early = threading.Event(), threading.Event(), [], []
    snapshot = search.take_read_snapshot

    def taking_snapshot(*args):
        early.append(reading.wait(60))  # the index read started before the snapshot
        return snapshot(*args)

    reads: Counter[str] = Counter()
    read_docs, read_postings = fts_index.read_docs, fts_index.read_postings
    open_index = fts_index.open_index
    matches = BaseTextIndex.matches

    lock = threading.Lock()

    def reading_docs(files, partition):
        if not files.uri.startswith(f"{tbl.uri}/_indices/"):
            return read_docs(files, partition)  # a generation's index
        with lock:
            reads["docs"] += 1
            first = not held
            held.append(first)
        if first:  # the first one: not done until the search asks for it
            reading.set()
            held[0] = asked.wait(60)
        return read_docs(files, partition)

    def reading_postings(files, partition, ids):
        if files.uri.startswith(f"{tbl.uri}/_indices/"):
            reads["postings"] += 1
        return read_postings(files, partition, ids)

    def opening(uri, options=None):
        if uri.startswith(f"{tbl.uri}/_indices/"):
            reads["opened"] += 1
        return open_index(uri, options)

    def asking(self, terms, superseded):
        asked.set()
        return matches(self, terms, superseded)

    monkeypatch.setattr(fts_index, "read_docs", reading_docs)
    monkeypatch.setattr(fts_index, "read_postings", reading_postings)
    monkeypatch.setattr(fts_index, "open_index", opening)
    monkeypatch.setattr(BaseTextIndex, "matches", asking)
    monkeypatch.setattr(search, "take_read_snapshot", taking_snapshot)
    reopened = mw.open_table(tbl.uri, cache=256 << 20)  # cold: nothing of the index read yet
    try:
        query = "w1 w7 w40"
        assert_same(reopened.fts(query, k=10), lance_fts(model, tmp_path / "m", query, 10))
    finally:
        reopened.close()
    assert early == [True] and held[0] is True  # under way from before the snapshot on
    # The index's files opened once too (by the early read; the search's leaf finds them).
    assert reads == {"docs": partitions(tbl), "postings": partitions(tbl), "opened": 1}


def test_a_load_under_way_is_shared_with_whoever_asks_meanwhile_failure_included():
    """Two threads asking for one key while its load runs get that load's value (the second
    load is never run) or its error; a key asked for after a failed load is loaded again."""
    from exec_nodes.fts_index import _shared

    started, release = threading.Event(), threading.Event()
    got: list[object] = []

    def slow(value):
        def load():
            started.set()
            assert release.wait(60)
            if isinstance(value, Exception):
                raise value
            return value

        return load

    def never():
        raise AssertionError("a second load of a key under way")

    def ask(key, load):
        try:
            got.append(_shared(key, load))
        except ValueError as e:
            got.append(e)

    for key, value in (("docs#0", 7), ("docs#1", ValueError("damaged"))):
        started.clear(), release.clear(), got.clear()
        first = threading.Thread(target=ask, args=(key, slow(value)))
        first.start()
        assert started.wait(60)
        second = threading.Thread(target=ask, args=(key, never))
        second.start()
        release.set()
        first.join(60), second.join(60)
        assert got == [value, value]
    assert _shared("docs#1", lambda: 8) == 8  # the failed load is not remembered


def test_only_a_first_search_reads_the_index_early(indexed, monkeypatch):
    """The early read (opening the latest base version, its index's files) is for a cold
    search: later searches, with other terms too, start none."""
    from planner import search

    tbl, _ = indexed
    started: list[object] = []
    monkeypatch.setattr(search, "start_early", started.append)
    reopened = mw.open_table(tbl.uri, cache=256 << 20)
    try:
        for query in ("w1 w7", "w1 w7", "w3 w40"):
            reopened.fts(query, k=10)
    finally:
        reopened.close()
    assert len(started) == 1


def test_a_search_verifies_the_generation_index_it_opens_and_no_other(indexed, tmp_path):
    """A generation's inverted index is verified before a search opens it (a flipped bit
    there is a typed error), and its other indexes' files, which the search never opens, are
    neither read nor verified: damage there leaves the search's answer exact."""
    import glob
    from pathlib import Path

    from memwal_sql.errors import CorruptGenerationError
    from memwal_sql.storage import checksums

    tbl, model = indexed
    tbl.create_index("k", "BTREE")  # generations flushed from now on carry one too
    update_holders(tbl, model)
    tbl.flush()
    inverted, other = [], []
    for d in glob.glob(f"{tbl.uri}/_mem_wal/*/*_gen_*/_indices/*/"):
        (inverted if glob.glob(f"{d}part_*_invert.lance") else other).append(d)
    assert inverted and other, (inverted, other)  # the key btree at least
    for f in [f for d in other for f in glob.glob(f"{d}*")]:
        with open(f, "r+b") as fh:
            fh.write(b"\0" * 64)
    query = "w1 w7 w40"

    def search() -> pa.Table:
        checksums._verified.clear()  # as in a fresh process
        reopened = mw.open_table(tbl.uri, cache=256 << 20)
        try:
            return reopened.fts(query, k=10)
        finally:
            reopened.close()

    assert_same(search(), lance_fts(model, tmp_path / "m", query, 10))
    invert = Path(glob.glob(f"{inverted[0]}part_*_invert.lance")[0])
    data = bytearray(invert.read_bytes())
    data[len(data) // 2] ^= 0x01
    invert.write_bytes(bytes(data))
    with pytest.raises(CorruptGenerationError, match="damaged"):
        search()
