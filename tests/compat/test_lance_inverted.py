"""The decoder of Lance's inverted index files against the documents themselves: every
term's postings (row ids and term frequencies) in every partition, terms held by exactly 128,
256 and 130 documents (full blocks only, and a tail), in a two-partition index."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from types import SimpleNamespace

import lance
import numpy as np
import pyarrow as pa

from memwal_sql.compat.lance_inverted import (
    IndexFiles,
    open_index,
    read_docs,
    read_postings,
    token_ids,
)


def test_every_posting_decodes_to_the_documents_term_frequencies(tmp_path) -> None:
    rng = np.random.default_rng(7)
    n = 6000
    p = 1.0 / np.arange(1, 3001) ** 1.1
    picked = rng.choice(3000, size=(n, 20), p=p / p.sum())
    texts = []
    for i in range(n):
        # Stemming and stop words leave these as they are; many distinct words per document
        # make Lance's builder spill a second partition.
        spread = [(i * 7 + j * 13) % 3000 for j in range(60)]
        words = [f"w{v}" for v in [*picked[i], *spread]]
        words += ["aaq"] * (i % 3 + 1) if i % 47 == 0 and i < 47 * 128 else []
        words += ["bbq"] if i % 23 == 0 and i < 23 * 256 else []
        words += ["ccq ccq"] if i % 41 == 0 and i < 41 * 130 else []
        texts.append(" ".join(words))
    ds = lance.write_dataset(
        pa.table({"id": np.arange(n), "t": texts}), str(tmp_path), max_rows_per_file=3000
    )
    ds.create_scalar_index("t", "INVERTED", with_position=False, memory_limit=1)
    ds = lance.dataset(str(tmp_path))
    files = open_index(f"{ds.uri}/_indices/{ds.describe_indices()[0].segments[0].uuid}")
    assert not isinstance(files, str)
    assert len(files.partitions) >= 2
    want: dict[str, dict[int, int]] = defaultdict(dict)
    table = ds.to_table(columns=["t"], with_row_id=True)
    for rowid, text in zip(table["_rowid"].to_pylist(), table["t"].to_pylist()):
        for term, tf in Counter(text.split()).items():
            want[term][rowid] = tf
    assert {len(want[t]) for t in ("aaq", "bbq", "ccq")} == {128, 256, 130}
    got: dict[str, dict[int, int]] = defaultdict(dict)
    total = documents = 0
    for p in files.partitions:
        rowid, length, tokens = read_docs(files, p)
        total += tokens
        documents += len(rowid)
        assert int(length.sum()) == tokens
        ids = token_ids(files, p, list(want))
        for (term, _), (doc, tf) in zip(ids.items(), read_postings(files, p, list(ids.values()))):
            got[term].update(zip(rowid[doc].tolist(), tf.tolist()))
    assert got == want
    assert documents == n and total == sum(len(t.split()) for t in texts)
    meta = json.loads(files.reader("metadata.lance").metadata().schema.metadata[b"params"])
    assert meta == files.params


def _pack4x(values: np.ndarray, nb: int) -> bytes:
    """BitPacker4x as Lance writes a block: lane ``l`` holds values ``4k + l``, each lane's
    32 values packed little-endian into ``nb`` 32-bit words, word ``j`` of lane ``l`` at
    word ``4j + l``."""
    words = np.zeros((nb, 4), dtype=np.uint64)
    for lane in range(4):
        stream = 0
        for k, v in enumerate(values[lane::4].tolist()):
            stream |= v << (k * nb)
        for j in range(nb):
            words[j, lane] = (stream >> (32 * j)) & 0xFFFFFFFF
    return words.astype("<u4").tobytes()


def test_blocks_of_every_bit_width_unpack_to_their_values() -> None:
    """Every width from 1 to 32 bits, blocks at unaligned byte offsets, widest values
    included (a value crossing two words; 32-bit values taking a word each)."""
    from memwal_sql.compat.lance_inverted import _unpack

    rng = np.random.default_rng(3)
    blocks, data, at, bits = [], b"", [], []
    for nb in [*range(1, 33), 7, 32]:
        values = rng.integers(0, 1 << nb, 128, dtype=np.uint64)
        values[rng.integers(0, 128)] = (1 << nb) - 1
        data += b"\x01" * (nb % 3)  # unaligned starts
        at.append(len(data))
        bits.append(nb)
        data += _pack4x(values, nb)
        blocks.append(values)
    got = _unpack(np.frombuffer(data, np.uint8), np.array(at), np.array(bits))
    assert got.dtype == np.uint32
    assert np.array_equal(got.astype(np.uint64), np.stack(blocks))


def test_a_document_file_of_more_than_a_million_documents_is_read_in_one_batch(
    tmp_path, monkeypatch
) -> None:
    """Past 2^20 documents (where batches of 2^20 split the file, and joining them copies
    every row id and length) the file is read as one batch, and the row ids and lengths are
    still every document's."""
    n = (1 << 20) + 5
    texts = pa.array(np.where(np.arange(n) % 2 == 0, "red fox", "red"))
    ds = lance.write_dataset(pa.table({"id": np.arange(n), "t": texts}), str(tmp_path))
    ds.create_scalar_index("t", "INVERTED", with_position=False)
    files = open_index(f"{ds.uri}/_indices/{ds.describe_indices()[0].segments[0].uuid}")
    assert not isinstance(files, str)
    chunks: list[int] = []
    real_reader = IndexFiles.reader

    def reader(self: IndexFiles, name: str, columns: list[str] | None = None) -> object:
        opened = real_reader(self, name, columns)
        real_read_all = opened.read_all

        def read_all(**kwargs: object) -> object:
            results = real_read_all(**kwargs)
            table = results.to_table()
            chunks.append(table.column(0).num_chunks)
            return SimpleNamespace(to_table=lambda: table)

        opened.read_all = read_all
        return opened

    monkeypatch.setattr(IndexFiles, "reader", reader)
    got_rows, got_lengths, total = [], [], 0
    for p in files.partitions:
        rowid, length, tokens = read_docs(files, p)
        got_rows.append(rowid)
        got_lengths.append(length)
        total += tokens
    assert chunks == [1] * len(files.partitions)
    rowid, length = np.concatenate(got_rows), np.concatenate(got_lengths)
    want = ds.to_table(columns=["t"], with_row_id=True)["_rowid"].to_numpy()  # by position
    order = np.argsort(want)
    assert np.array_equal(np.sort(rowid), want[order])
    assert np.array_equal(length[np.argsort(rowid)], np.where(np.arange(n) % 2 == 0, 2, 1)[order])
    assert total == n + (n + 1) // 2
