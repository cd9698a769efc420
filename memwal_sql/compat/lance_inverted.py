"""Reading Lance 14's inverted (full-text) index files directly: statistics and postings.

Lance's own full-text search scores with the statistics of the index alone (deleted rows
included), so a search over the latest corpus of a MemWAL table reads the index's files and
corrects the statistics itself. An index directory ``<table>/_indices/<uuid>/`` holds Lance
files (measured on pylance 14.0.2):

* ``metadata.lance``: schema metadata ``partitions`` (a JSON list), ``params`` (the tokenizer),
  ``format_version`` ``2``, ``posting_block_size`` ``128``, ``posting_tail_codec``
  ``varint_delta_v1``, ``token_set_format`` ``fst``;
* per partition ``P``: ``part_P_tokens.lance`` (an fst Map term -> token id),
  ``part_P_invert.lance`` (row = token id: ``_length`` = documents holding it, ``_posting`` =
  its blocks), ``part_P_docs.lance`` (row = document id: ``_rowid`` ascending, ``_num_tokens``;
  metadata ``total_tokens``). Documents without a token are not in it.

A posting block of 128 documents is ``f32 max score | u32 first doc | u8 bits | doc deltas
bit-packed (BitPacker4x, sorted) | u8 bits | frequencies bit-packed``; the last, shorter
block is ``f32 | n varint doc ids (the first absolute, then deltas) | n varint frequencies``.
Any other layout (another format version, block size or tail codec, positions) is refused:
:func:`unsupported` says why, and the caller searches another way.

Example:
    ``read_postings(index_dir, 0, [17, 40])`` -> ``[(doc_ids, freqs), (doc_ids, freqs)]``
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import ducer
import numpy as np
import pyarrow as pa
from lance.file import LanceFileReader

from memwal_sql.errors import CorruptTableError

BLOCK = 128
_SUPPORTED = {
    "format_version": "2",
    "posting_block_size": str(BLOCK),
    "posting_tail_codec": "varint_delta_v1",
    "token_set_format": "fst",
}
_INVERT_COLUMNS = {"_posting", "_max_score", "_length", "_impacts"}


@dataclass(frozen=True)
class IndexFiles:
    """One inverted index's directory (``uri``), its partitions and tokenizer parameters."""

    uri: str
    partitions: tuple[int, ...]
    params: dict
    storage_options: dict[str, str] | None = None

    def reader(self, name: str, columns: list[str] | None = None) -> LanceFileReader:
        return LanceFileReader(
            f"{self.uri}/{name}", storage_options=self.storage_options, columns=columns
        )


def open_index(uri: str, storage_options: dict[str, str] | None = None) -> IndexFiles | str:
    """The index at directory ``uri``, or why it cannot be read here (a layout this module
    does not decode exactly).

    Example:
        ``open_index(f"{ds.uri}/_indices/{uuid}")``
    """
    meta = LanceFileReader(f"{uri}/metadata.lance", storage_options=storage_options)
    found = {k.decode(): v.decode() for k, v in (meta.metadata().schema.metadata or {}).items()}
    for key, want in _SUPPORTED.items():
        if found.get(key) != want:
            return f"index {key} is {found.get(key)!r}, only {want!r} is read"
    params = json.loads(found.get("params", "{}"))
    if params.get("with_position"):
        return "index holds positions (with_position=True)"
    files = IndexFiles(uri, tuple(json.loads(found["partitions"])), params, storage_options)
    for p in files.partitions:
        names = set(files.reader(f"part_{p}_invert.lance").metadata().schema.names)
        if names != _INVERT_COLUMNS:
            return f"partition {p} has posting columns {sorted(names)}"
    return files


def token_ids(files: IndexFiles, partition: int, terms: Sequence[str]) -> dict[str, int]:
    """The token id of each of ``terms`` the partition holds (the others are left out)."""
    table = files.reader(f"part_{partition}_tokens.lance", ["_token_fst_bytes"]).read_all()
    fst = ducer.Map(table.to_table().column(0)[0].as_py())
    found = {t: fst.get(t.encode()) for t in terms}
    return {t: int(i) for t, i in found.items() if i is not None}


def read_docs(files: IndexFiles, partition: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A partition's documents by document id: row ids (ascending in a fresh build, not in a
    partition ``optimize_indices`` merged), token counts; and the total count."""
    reader = files.reader(f"part_{partition}_docs.lance")
    meta = reader.metadata()
    total = int((meta.schema.metadata or {})[b"total_tokens"])
    # One batch: the columns become numpy arrays without a copy. Joining batches of 1M
    # documents copied 120 MB at 10M documents, 30-280 ms of a cold search (the copy's fresh
    # pages, in the kernel).
    table = reader.read_all(batch_size=max(meta.num_rows, 1)).to_table()
    rowid = table.column("_rowid").to_numpy().astype(np.uint64, copy=False)
    return rowid, table.column("_num_tokens").to_numpy().astype(np.uint32, copy=False), total


def read_postings(
    files: IndexFiles, partition: int, ids: Sequence[int]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The postings (document ids, term frequencies) of token ``ids`` in a partition, decoded
    for all their blocks at once."""
    if not ids:
        return []
    order = np.argsort(ids)
    reader = files.reader(f"part_{partition}_invert.lance", ["_posting", "_length"])
    table = reader.take_rows(np.asarray(ids, dtype=np.uint64)[order].tolist()).to_table()
    decoded = decode_postings(table.column("_posting"), table.column("_length").to_numpy())
    return [decoded[k] for k in np.argsort(order)]  # back in the order of ``ids``


def decode_postings(
    postings: pa.ChunkedArray | pa.Array, lengths: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Decode lists of posting blocks (one list per token, ``lengths[k]`` documents each)
    into (document ids, frequencies) as ``uint32``: the full blocks of every token together,
    grouped by bit width."""
    if isinstance(postings, pa.ChunkedArray):
        postings = postings.combine_chunks()
    lengths = np.asarray(lengths, dtype=np.int64)
    list_offsets = postings.offsets.to_numpy()
    blocks = postings.flatten()
    # One token's blocks: ceil(length / 128), all full but a shorter last one.
    counts = np.diff(list_offsets)
    if not np.array_equal(counts, -(-lengths // BLOCK)):
        raise CorruptTableError(
            "an inverted index's posting blocks do not match its document counts: "
            "rebuild the index (tbl.create_index(column, 'INVERTED'))"
        )
    _, offset_buffer, data_buffer = blocks.buffers()
    offsets = np.frombuffer(offset_buffer, dtype=np.int64)[
        blocks.offset : blocks.offset + len(blocks) + 1
    ]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer else np.zeros(0, np.uint8)
    token = np.repeat(np.arange(len(lengths)), counts)
    within = np.arange(len(token)) - np.repeat(list_offsets[:-1] - list_offsets[0], counts)
    starts_out = np.concatenate([[0], np.cumsum(lengths)])
    full = (within + 1) * BLOCK <= lengths[token]
    docs = np.empty(int(starts_out[-1]), dtype=np.uint32)
    freqs = np.empty_like(docs)
    begin = offsets[:-1]
    fb = begin[full]
    first = _u32_at(data, fb + 4)
    doc_bits = data[fb + 8].astype(np.int64)
    freq_at = fb + 9 + 16 * doc_bits
    freq_bits = data[freq_at].astype(np.int64)
    full_docs = _unpack(data, fb + 9, doc_bits)
    np.cumsum(full_docs, axis=1, dtype=np.uint32, out=full_docs)  # in place: no second copy
    full_docs += first[:, None].astype(np.uint32)
    full_freqs = _unpack(data, freq_at + 1, freq_bits)
    # A token's full blocks are consecutive rows of the full blocks, its documents' first
    # ones: copied as slices (an index per document was 8 bytes a posting of fresh memory).
    full_starts = np.concatenate([[0], np.cumsum(np.bincount(token[full], minlength=len(lengths)))])
    tails = dict(zip(token[~full].tolist(), np.flatnonzero(~full).tolist()))  # one at most
    for k in range(len(lengths)):
        at, a, b = int(starts_out[k]), int(full_starts[k]), int(full_starts[k + 1])
        n = (b - a) * BLOCK
        docs[at : at + n] = full_docs[a:b].reshape(-1)
        freqs[at : at + n] = full_freqs[a:b].reshape(-1)
        if k in tails:
            t = tails[k]
            m = int(lengths[k]) - n
            values = _varints(data[begin[t] + 4 : offsets[t + 1]], 2 * m)
            docs[at + n : at + n + m] = np.cumsum(values[:m]).astype(np.uint32)
            freqs[at + n : at + n + m] = values[m:].astype(np.uint32)
    return [
        (docs[starts_out[k] : starts_out[k + 1]], freqs[starts_out[k] : starts_out[k + 1]])
        for k in range(len(lengths))
    ]


def _u32_at(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Little-endian u32 at byte offsets ``at``."""
    b = data[at[:, None] + np.arange(4)].astype(np.uint64)
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)


def _unpack(data: np.ndarray, at: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """BitPacker4x blocks (128 values, ``bits[i]`` bits each, 4 interleaved 32-bit lanes)
    starting at byte offsets ``at``, as a ``(len(at), 128)`` ``uint32`` array: per distinct
    bit width, value ``k`` of every lane of every block at once (a value spans at most two
    of its lane's 32-bit words, at offsets known for ``k``: slices, no gathers).

    Example:
        >>> lanes = np.array([1, 2, 3, 4], np.uint32).view(np.uint8)  # 1 bit: value 4k + lane
        >>> _unpack(lanes, np.array([0]), np.array([1]))[0, :12].tolist()
        [1, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1]
    """
    out = np.zeros((len(at), BLOCK), dtype=np.uint32)
    for nb in np.unique(bits).tolist():
        if nb == 0:
            continue
        rows = np.flatnonzero(bits == nb)
        # Each block's bytes copied as one row (no index per byte), then read as words.
        raw = np.lib.stride_tricks.sliding_window_view(data, 16 * nb)[at[rows]]
        # Word j of every lane of every block as one contiguous row: each value below is
        # then whole-row arithmetic.
        words = np.ascontiguousarray(raw.view("<u4").reshape(len(rows), nb, 4).transpose(1, 0, 2))
        words = words.reshape(nb, -1)
        values = np.empty((32, words.shape[1]), dtype=np.uint32)  # value 4k + lane at [k]
        high = np.empty(words.shape[1], dtype=np.uint32)
        mask = np.uint32((1 << nb) - 1) if nb < 32 else None
        for k in range(32):
            word, shift = divmod(k * nb, 32)
            np.right_shift(words[word], np.uint32(shift), out=values[k])
            if shift + nb > 32:  # the value's high bits open the lane's next word
                np.left_shift(words[word + 1], np.uint32(32 - shift), out=high)
                values[k] |= high
            if mask is not None:
                values[k] &= mask
        # Written through a (blocks, 32, 4) view of ``out``: the transposed values reshaped
        # to (blocks, 128) would be a copy of them first.
        out.reshape(len(at), 32, 4)[rows] = values.reshape(32, len(rows), 4).transpose(1, 0, 2)
    return out


def _varints(data: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` LEB128 varints of ``data``."""
    ends = np.flatnonzero(data < 0x80)[:n]
    if len(ends) < n:
        raise CorruptTableError(
            "an inverted index's last posting block is cut short: "
            "rebuild the index (tbl.create_index(column, 'INVERTED'))"
        )
    data = data[: ends[-1] + 1] if n else data[:0]
    starts = np.concatenate([[0], ends[:-1] + 1])
    shift = 7 * (np.arange(len(data)) - np.repeat(starts, np.diff(np.append(starts, len(data)))))
    parts = (data & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    return np.add.reduceat(parts, starts) if n else np.zeros(0, np.uint64)


__all__ = [
    "BLOCK",
    "IndexFiles",
    "decode_postings",
    "open_index",
    "read_docs",
    "read_postings",
    "token_ids",
]
