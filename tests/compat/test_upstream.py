"""One test per upstream assumption of memwal_sql.compat: an upgrade that breaks one fails
here, by name."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pytest
from datafusion import SessionContext

import memwal_sql as mw
from memwal_sql.compat.arrow import expression_of_parts, expression_parts, substrait_schema
from memwal_sql.compat.datafusion import plain_strings
from memwal_sql.compat.lance import (
    field_ids,
    is_commit_conflict,
    is_not_found,
    replace_field,
    row_addr_treemap,
    take_rows,
    write_dataset_with_field_ids,
)
from memwal_sql.expressions.substrait import substrait_weight
from memwal_sql.formats.lance_manifest import read_mem_wal_details


def test_lance_take_rows_reads_rows_by_address(tmp_path):
    ds = lance.write_dataset(pa.table({"x": [10, 11, 12]}), str(tmp_path), max_rows_per_file=2)
    ds = lance.write_dataset(pa.table({"x": [13]}), str(tmp_path), mode="append")
    # fragment_id << 32 | offset, in any order: fragments [10, 11], [12], [13]
    addresses = pa.array([(1 << 32) | 0, 1, (2 << 32) | 0, 0], pa.uint64())
    assert take_rows(ds, addresses, ["x"]).column("x").to_pylist() == [12, 11, 13, 10]


def test_lance_errors_say_not_found_for_a_missing_dataset(tmp_path):
    with pytest.raises((ValueError, OSError)) as e:
        lance.dataset(str(tmp_path / "nothing"))
    assert is_not_found(e.value)
    assert is_commit_conflict(OSError("Retryable commit conflict for version 3"))
    assert not is_commit_conflict(OSError("disk full"))


def test_lance_manifest_layout_holds_the_mem_wal_details(tmp_path):
    tbl = mw.create_table(
        str(tmp_path),
        pa.table({"id": pa.array([1], pa.int64())}),
        primary_key="id",
        region_spec=mw.RegionSpec.bucket("id", 2),
    )
    details = read_mem_wal_details(tbl.store, tbl.dataset().version)
    assert details is not None and len(details.region_specs) == 1
    tbl.close()


def test_pyarrow_serializes_an_expression_as_prefix_ordered_metadata_and_one_row():
    expr = (pc.field("a") > pa.scalar(5, pa.timestamp("ns"))) & pc.field("s").isin(["x", None])
    parts, batch = expression_parts(expr)
    assert parts == [
        ("call", "and_kleene"),
        ("call", "greater"),
        ("field_ref", "a"),
        ("literal", "0"),
        ("end", "greater"),
        ("call", "is_in"),
        ("field_ref", "s"),
        ("options", "1"),
        ("end", "is_in"),
        ("end", "and_kleene"),
    ]
    assert batch.num_rows == 1 and batch.column(0)[0] == pa.scalar(5, pa.timestamp("ns"))
    assert batch.column(1)[0]["value_set"].values.to_pylist() == ["x", None]
    assert expression_of_parts(parts, batch.columns).equals(expr)


def test_pyarrow_substrait_doubles_with_each_level_of_nesting():
    """Why a filter is never decoded from Substrait, and a deep one not handed to Lance."""
    schema = pa.schema([("v", pa.int64())])
    sizes = []
    for n in (8, 9, 10):
        expr = pc.field("v") == 0
        for i in range(1, n):
            expr = expr | (pc.field("v") == i)
        sizes.append(len(bytes(expr.to_substrait(schema))))
        assert abs(sizes[-1] - 32 * substrait_weight(expr)) < 0.03 * sizes[-1]
    assert sizes[1] > 1.9 * sizes[0] and sizes[2] > 1.9 * sizes[1]


def test_pyarrow_cannot_put_vectors_or_ns_timestamp_literals_in_substrait():
    vectors = pa.schema([("v", pa.list_(pa.float32(), 2)), ("t", pa.timestamp("ns"))])
    with pytest.raises(pa.ArrowException):
        pc.field("t").is_null().to_substrait(vectors)
    pc.field("t").is_null().to_substrait(substrait_schema(vectors))  # with vectors as null
    with pytest.raises(pa.ArrowException):
        (pc.field("t") == pa.scalar(5, pa.timestamp("ns"))).to_substrait(substrait_schema(vectors))


def test_datafusion_pushes_not_in_as_pyarrow_is_in_marked_exact():
    """Why the planner evaluates pushed filters itself: a plain pyarrow dataset counts NULLs
    as NOT IN (pyarrow's ~is_in), and DataFusion does not re-check the pushed filter."""
    ctx = SessionContext()
    ctx.register_dataset("p", pds.dataset(pa.table({"s": ["a", None, "c", "d", "e"]})))
    got = ctx.sql("SELECT count(*) AS n FROM p WHERE s NOT IN ('a', 'x', 'y', 'z')").to_pydict()
    assert got == {"n": [4]}  # SQL says 3


def test_datafusion_needs_at_least_one_fragment():
    class Empty(pds.Dataset):
        def __init__(self) -> None:
            self._schema = pa.schema([("x", pa.int64())])

        @property
        def schema(self):  # type: ignore[override]
            return self._schema

        def scanner(self, columns=None, filter=None, **_):  # type: ignore[override]
            return type("P", (), {"projected_schema": self._schema})()

        def get_fragments(self, filter=None):  # type: ignore[override]
            return []

    ctx = SessionContext()
    ctx.register_dataset("e", Empty())
    with pytest.raises(Exception, match=r"SanityCheckPlan|distribution"):
        ctx.sql("SELECT x FROM e ORDER BY x").collect()


def test_datafusion_results_may_hold_view_types(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"s": ["a"]}), str(tmp_path / "f.parquet"))
    ctx = SessionContext()
    ctx.register_parquet("f", str(tmp_path / "f.parquet"))
    out = ctx.sql("SELECT s FROM f").to_arrow_table()
    assert pa.types.is_string_view(out.schema.field("s").type)
    assert plain_strings(out).schema.field("s").type == pa.string()


def test_datafusion_pushes_no_in_list_of_four_or_more_dates():
    """Such a filter stays above the scan (correct, but it cannot prune regions); three
    dates are rewritten as `=`s joined by OR and pushed."""
    seen = []

    class Recording(pds.Dataset):
        def __init__(self) -> None:
            self._ds = pds.dataset(pa.table({"d": pa.array([0, 1], pa.date32())}))

        @property
        def schema(self):  # type: ignore[override]
            return self._ds.schema

        def scanner(self, columns=None, filter=None, **_):  # type: ignore[override]
            return self._ds.scanner(columns=columns)

        def get_fragments(self, filter=None):  # type: ignore[override]
            seen.append(filter)
            return list(self._ds.get_fragments())

    ctx = SessionContext()
    ctx.register_dataset("p", Recording())
    dates = ["DATE '1970-01-01'", "DATE '1970-01-02'", "DATE '1970-01-03'", "DATE '1970-01-04'"]
    ctx.sql(f"SELECT * FROM p WHERE d IN ({', '.join(dates)})").collect()
    ctx.sql(f"SELECT * FROM p WHERE d IN ({', '.join(dates[:3])})").collect()
    assert seen[0] is None and seen[-1] is not None


@pytest.mark.xfail(
    strict=True,
    raises=Exception,
    reason="datafusion-python 55 turns a NULL literal under AND into a pyarrow "
    "BooleanScalar and fails combining it with an Expression, for every "
    "pyarrow dataset (upstream); strict, so a fixed upstream shows",
)
def test_datafusion_cannot_push_a_null_literal_under_and():
    ctx = SessionContext()
    ctx.register_dataset("p", pds.dataset(pa.table({"id": [1, 2, 3, 4]})))
    ctx.sql("SELECT * FROM p WHERE NULL AND id > 3").to_pydict()


def test_ivf_pq_codebook_round_trips_through_create_index(tmp_path):
    """An index built on another dataset with the centroids pylance reports and the codebook
    read from the index files has exactly that codebook (generation indexes rely on it)."""
    import numpy as np

    from memwal_sql.compat.lance import ivf_pq_model

    rng = np.random.default_rng(0)
    v = rng.normal(size=(1000, 16)).astype(np.float32)
    t = pa.table(
        {"id": np.arange(1000), "vec": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), 16)}
    )
    ds = lance.write_dataset(t, str(tmp_path / "a"))
    ds.create_index("vec", "IVF_PQ", num_partitions=4, num_sub_vectors=8)
    first = ds.index_statistics("vec_idx")["indices"][0]
    codebook, nbits = ivf_pq_model(first["uri"])
    assert codebook.shape == (8, 1 << nbits, 2)
    other = lance.write_dataset(t.slice(0, 300), str(tmp_path / "b"))
    other.create_index(
        "vec",
        "IVF_PQ",
        num_partitions=len(first["centroids"]),
        num_sub_vectors=8,
        ivf_centroids=np.array(first["centroids"], np.float32),
        pq_codebook=codebook,
    )
    again = other.index_statistics("vec_idx")["indices"][0]
    assert np.array_equal(ivf_pq_model(again["uri"])[0], codebook)
    assert again["centroids"] == first["centroids"]


@pytest.mark.parametrize("index_type", ["IVF_PQ", "IVF_FLAT", "IVF_HNSW_SQ"])
def test_vector_index_statistics_from_the_files_are_lances(tmp_path, index_type):
    """What the search reads of a vector index (type, metric, partitions, PQ sub-vectors) from
    its files' metadata is what ``index_statistics`` says; another layout is left to it."""
    from memwal_sql.compat.lance import index_directory, vector_index_statistics

    v = np.random.default_rng(0).normal(size=(1000, 16)).astype(np.float32)
    t = pa.table({"vec": pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), 16)})
    ds = lance.write_dataset(t, str(tmp_path / "a"))
    extra = {"num_sub_vectors": 8} if index_type == "IVF_PQ" else {}
    ds = ds.create_index("vec", index_type, num_partitions=6, metric="cosine", **extra)
    [segment] = [i for i in ds.list_indices() if i["fields"] == ["vec"]]
    got = vector_index_statistics(index_directory(ds, segment["uuid"]))
    if index_type == "IVF_HNSW_SQ":
        assert got is None
        return
    assert got is not None
    lances = ds.index_statistics(segment["name"])
    assert got["index_type"] == lances["index_type"] == index_type
    [ours], theirs = got["indices"], lances["indices"][0]
    assert ours["metric_type"] == theirs["metric_type"] == "cosine"
    assert ours["num_partitions"] == theirs["num_partitions"] > 1  # Lance may build fewer
    if index_type == "IVF_PQ":
        pq = {k: theirs["sub_index"][k] for k in ("index_type", "num_sub_vectors", "dimension")}
        assert (
            ours["sub_index"] == pq == {"index_type": "PQ", "num_sub_vectors": 8, "dimension": 16}
        )


def test_lance_stop_words_are_what_the_tokenizer_removes(tmp_path):
    """Every word of the stop lists Lance's could come from is removed by Lance exactly when
    our tokenizer removes it (the stop-word set is measured, not published)."""
    from memwal_sql.formats.tokenizer import Tokenizer

    words = sorted(
        {
            "i",
            "me",
            "my",
            "myself",
            "we",
            "our",
            "ours",
            "ourselves",
            "you",
            "your",
            "yours",
            "yourself",
            "yourselves",
            "he",
            "him",
            "his",
            "himself",
            "she",
            "her",
            "hers",
            "herself",
            "it",
            "its",
            "itself",
            "they",
            "them",
            "their",
            "theirs",
            "themselves",
            "what",
            "which",
            "who",
            "whom",
            "this",
            "that",
            "these",
            "those",
            "am",
            "is",
            "are",
            "was",
            "were",
            "be",
            "been",
            "being",
            "have",
            "has",
            "had",
            "having",
            "do",
            "does",
            "did",
            "doing",
            "would",
            "should",
            "could",
            "ought",
            "a",
            "an",
            "the",
            "and",
            "but",
            "if",
            "or",
            "because",
            "as",
            "until",
            "while",
            "of",
            "at",
            "by",
            "for",
            "with",
            "about",
            "against",
            "between",
            "into",
            "through",
            "during",
            "before",
            "after",
            "above",
            "below",
            "to",
            "from",
            "up",
            "down",
            "in",
            "out",
            "on",
            "off",
            "over",
            "under",
            "again",
            "further",
            "then",
            "once",
            "here",
            "there",
            "when",
            "where",
            "why",
            "how",
            "all",
            "any",
            "both",
            "each",
            "few",
            "more",
            "most",
            "other",
            "some",
            "such",
            "no",
            "nor",
            "not",
            "only",
            "own",
            "same",
            "so",
            "than",
            "too",
            "very",
            "will",
            "just",
            "can",
            "don",
            "now",
            "s",
            "t",
            "re",
            "ll",
            "ve",
            "d",
            "m",
            "o",
            "y",
            "ain",
            "aren",
            "couldn",
            "didn",
            "doesn",
            "hadn",
            "hasn",
            "haven",
            "isn",
            "ma",
            "mightn",
            "mustn",
            "needn",
            "shan",
            "shouldn",
            "wasn",
            "weren",
            "won",
            "wouldn",
            "also",
            "yet",
            "us",
        }
    )
    ds = lance.write_dataset(
        pa.table({"i": list(range(len(words))), "t": [f"zz {w}" for w in words]}), str(tmp_path)
    )
    ds.create_scalar_index("t", "INVERTED")
    tok = Tokenizer()
    differ = [
        w
        for w in words
        if (ds.to_table(full_text_query=w, columns=["i"]).num_rows > 0) != bool(tok.terms(w))
    ]
    assert differ == []


def test_lance_scanners_take_row_address_lists_in_the_treemap_format(tmp_path):
    """Offsets in several 2^16 blocks (array and bitmap containers), a whole fragment, and a
    fragment with deleted rows: the scan keeps exactly the listed live rows, with a filter."""
    n = 200_000
    ds = lance.write_dataset(pa.table({"x": np.arange(n + 10)}), str(tmp_path), max_rows_per_file=n)
    ds.delete("x % 7 = 0")
    rng = np.random.default_rng(0)
    dense = np.sort(rng.choice(n, 90_000, replace=False))  # bitmap containers
    sparse = np.sort(rng.choice(n, 300, replace=False))  # array containers
    for offsets in (dense, sparse, range(65_000, 140_001)):
        want = np.asarray(offsets)
        want = want[want % 7 != 0]
        allow = row_addr_treemap({0: offsets, 1: None})
        got = ds.scanner(columns=["x"], row_addr_allowlist=allow).to_table().column("x")
        assert np.array_equal(
            np.sort(got.to_numpy()), np.r_[want, [x for x in range(n, n + 10) if x % 7]]
        )
        block = row_addr_treemap({0: offsets})
        kept = ds.scanner(columns=["x"], filter="x >= 1000", row_addr_blocklist=block)
        x = np.arange(n + 10)
        expected = x[(x % 7 != 0) & (x >= 1000) & ~np.isin(x, want)]
        assert np.array_equal(np.sort(kept.to_table().column("x").to_numpy()), expected)
    assert row_addr_treemap({0: range(3, 70_000)}) == row_addr_treemap({0: np.arange(3, 70_000)})
    with pytest.raises(ValueError, match="empty"):
        row_addr_treemap({0: []})


@pytest.mark.xfail(
    strict=True,
    raises=TypeError,
    reason="pylance 14 cannot decode the transaction of a compaction that remapped an index "
    "(LanceOperation.RewrittenIndex is built without three of its fields); index catch-up "
    "reads such a version's fragments instead. Strict, so a fixed upstream shows",
)
def test_lance_reads_the_transaction_of_a_compaction_that_remapped_an_index(tmp_path):
    ds = lance.write_dataset(pa.table({"k": list(range(10))}), str(tmp_path), max_rows_per_file=5)
    ds.create_scalar_index("k", "BTREE")
    ds.delete("k = 1")
    ds.optimize.compact_files(materialize_deletions_threshold=0.0)
    ds = lance.dataset(str(tmp_path))
    ds.read_transaction(ds.version)


def test_lance_keeps_the_field_ids_a_project_commit_names(tmp_path):
    """A Lance schema pickles as its fields' protobufs; edited ids survive a Project commit
    (Lance renumbers a new dataset's ids and refuses a Merge that remaps them)."""
    rows = pa.table({
        "id": pa.array([1, 2], pa.int64()),
        "tags": pa.array([["a"], ["b", "c"]], pa.list_(pa.string())),
        "pt": pa.array([{"x": 1.0, "y": 2.0}, None], pa.struct([("x", pa.float64()), ("y", pa.float64())])),
        "n": pa.array([5, None], pa.int64()),
        "_tombstone": [False, True],
    })  # fmt: skip
    # id 0, tags 1 (its item 2), pt 3 (x 4, y 5), n 9: as after widenings gave n a new id.
    write_dataset_with_field_ids(
        rows, str(tmp_path / "g"), (0, 1, 2, 3, 4, 5, 9), data_storage_version="2.1", storage_options=None
    )  # fmt: skip
    ds = lance.dataset(str(tmp_path / "g"))
    assert field_ids(ds.lance_schema, ds.schema.names) == (0, 1, 2, 3, 4, 5, 9, 10)
    assert ds.schema.names == rows.column_names
    assert ds.to_table() == rows
    assert ds.to_table(filter="n = 5", columns=["id", "pt"]).to_pylist() == [
        {"id": 1, "pt": {"x": 1.0, "y": 2.0}}
    ]


def test_replace_field_swaps_a_column_for_another_in_one_project_commit(tmp_path):
    ds = lance.write_dataset(
        pa.table({"a": pa.array([1, None], pa.int32()), "b": ["x", "y"], "w": pa.array([1, None], pa.int64())}),
        str(tmp_path / "d"),
    )  # fmt: skip
    ds = lance.LanceDataset.commit(
        ds.uri, lance.LanceOperation.Project(replace_field(ds.lance_schema, "a", "w")), read_version=ds.version
    )  # fmt: skip
    assert ds.schema.names == ["a", "b"]
    assert ds.schema.field("a").type == pa.int64()
    assert field_ids(ds.lance_schema, ["a", "b"]) == (2, 1)
    assert ds.to_table().to_pylist() == [{"a": 1, "b": "x"}, {"a": None, "b": "y"}]


def test_lance_refuses_a_cast_and_a_computed_column_on_a_memwal_table(tmp_path):
    """Why a widening fills its hidden column with merge_insert and swaps it in with Project."""
    tbl = mw.create_table(str(tmp_path / "t"), pa.table({"id": [1], "n": pa.array([1], pa.int32())}), primary_key="id")  # fmt: skip
    ds = tbl.dataset()
    with pytest.raises(OSError, match="MemWAL"):
        ds.alter_columns({"path": "n", "data_type": pa.int64()})
    with pytest.raises((OSError, ValueError), match="MemWAL"):
        ds.add_columns({"n2": "n * 2"})
    tbl.close()
