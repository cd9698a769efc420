"""The primary-key bloom filter of a flushed generation (``bloom_filter.bin``), as Lance 14 writes it.

Lance 14.0.2 writes one raw Parquet-style split-block bloom filter (SBBF) per generation: no
header, 32768 bytes (ndv=8192, fpp=0.00057), blocks of eight little-endian ``u32`` words. Each
physical row of the generation (duplicates and ``_tombstone`` rows included) inserts one 64-bit
hash of its primary key. The hash is Rust's ``DefaultHasher`` (SipHash-1-3, keys 0/0) fed with
the key's ``Hash`` byte stream; :func:`pk_hashes` documents that stream per Arrow type.

Everything here is vectorised with numpy: a batch is hashed with a fixed number of array
operations per 8-byte message word, never with a Python loop per row.

Example:
    >>> import pyarrow as pa
    >>> h = pk_hashes(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    >>> bf = BloomFilter.from_bytes(bloom_filter_bytes(h))
    >>> bool(bf.might_contain(h).all()), bf.num_bytes
    (True, 32768)
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.errors import InvalidInputError, SchemaMismatchError, StorageError

__all__ = [
    "LANCE_BLOOM_BYTES",
    "LANCE_BLOOM_FPP",
    "LANCE_BLOOM_NDV",
    "BloomFilter",
    "bloom_filter_bytes",
    "is_supported_pk_type",
    "optimal_num_bytes",
    "pk_hashes",
    "siphash13",
]

#: Lance 14 sizes every generation's filter for this many distinct keys ...
LANCE_BLOOM_NDV = 8192
#: ... at this false-positive probability ...
LANCE_BLOOM_FPP = 0.00057
#: ... which Parquet's sizing rule turns into 1024 blocks. Lance readers may reject other sizes.
LANCE_BLOOM_BYTES = 32768

# Parquet SBBF salts: word i of a block gets bit ((x * SALT[i]) mod 2^32) >> 27.
_SALT = np.array(
    [
        0x47B6137B,
        0x44974D91,
        0x8824AD5B,
        0xA2B7289D,
        0x705495C7,
        0x2DF1424B,
        0x9EFC4947,
        0x5C6BFB31,
    ],
    dtype=np.uint32,
)
_BITSET_MIN_BYTES = 32
_BITSET_MAX_BYTES = 128 * 1024 * 1024

# SipHash initial state for k0 = k1 = 0 (the constants "somepseudorandomlygeneratedbytes").
_V0, _V1, _V2, _V3 = 0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573
# Rows hashed per numpy pass (see _siphash13_many).
_CHUNK = 1 << 14

# Value bytes Lance 14 feeds the hasher, per PK type, measured against Lance-written
# bloom_filter.bin files. Lance accepts exactly these PK types for MemWAL writes (anything else
# fails with "unsupported type ... for hashing"), but its bloom hasher only looks at the value of
# int32, int64, utf8 and binary: for the other accepted types every non-null key hashes the same
# (just the 0x00 null flag), so the filter degenerates to "maybe" for them. We reproduce that
# bit-for-bit because the file must match what Lance writes.
_FIXED_WIDTH = {pa.int32(): 4, pa.int64(): 8}
_VALUE_LESS = frozenset(
    [
        pa.int8(), pa.int16(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
        pa.bool_(), pa.large_utf8(), pa.large_binary(),
    ]
)  # fmt: skip
_SUPPORTED = frozenset(_FIXED_WIDTH) | _VALUE_LESS | {pa.utf8(), pa.binary()}


def is_supported_pk_type(t: pa.DataType) -> bool:
    """Whether Lance 14 accepts ``t`` as a primary-key column type for MemWAL writes.

    Those are int8/16/32/64, uint8/16/32/64, bool, utf8, large_utf8, binary and large_binary.

    Example:
        >>> is_supported_pk_type(pa.int64()), is_supported_pk_type(pa.timestamp("us"))
        (True, False)
    """
    return t in _SUPPORTED


def optimal_num_bytes(ndv: int, fpp: float) -> int:
    """Bitset size in bytes for ``ndv`` distinct keys at false-positive rate ``fpp`` (Parquet rule).

    ``bits = -8 * ndv / ln(1 - fpp ** (1/8))``, then ``bits // 8`` clamped to [32, 128 MiB] and
    rounded up to a power of two. Use it for in-memory filters only; files keep
    :data:`LANCE_BLOOM_BYTES`.

    Example:
        >>> optimal_num_bytes(8192, 0.00057), optimal_num_bytes(10, 0.1)
        (32768, 32)
    """
    if not 0.0 < fpp < 1.0:
        raise InvalidInputError(f"bloom filter fpp must be in (0, 1), got {fpp!r}")
    if ndv < 0:
        raise InvalidInputError(f"bloom filter ndv must be >= 0, got {ndv!r}")
    num_bits = int(-8.0 * ndv / math.log(1.0 - fpp ** (1.0 / 8.0)))
    num_bytes = min(max(num_bits // 8, _BITSET_MIN_BYTES), _BITSET_MAX_BYTES)
    return 1 << (num_bytes - 1).bit_length()


# --------------------------------------------------------------------------------------------
# SipHash-1-3 over many messages at once
# --------------------------------------------------------------------------------------------


def _rotl(x: np.ndarray, b: int, tmp: np.ndarray) -> None:
    """Rotate ``x`` left by ``b`` bits in place (``tmp`` is scratch of the same shape)."""
    np.left_shift(x, b, out=tmp)
    np.right_shift(x, 64 - b, out=x)
    np.bitwise_or(x, tmp, out=x)


def _sip_round(
    v0: np.ndarray, v1: np.ndarray, v2: np.ndarray, v3: np.ndarray, tmp: np.ndarray
) -> None:
    """One SipRound on equally shaped uint64 arrays, in place (additions wrap mod 2**64)."""
    v0 += v1
    _rotl(v1, 13, tmp)
    v1 ^= v0
    _rotl(v0, 32, tmp)
    v2 += v3
    _rotl(v3, 16, tmp)
    v3 ^= v2
    v0 += v3
    _rotl(v3, 21, tmp)
    v3 ^= v0
    v2 += v1
    _rotl(v1, 17, tmp)
    v1 ^= v2
    _rotl(v2, 32, tmp)


def _siphash13_many(msg: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """SipHash-1-3 (k0 = k1 = 0) of ``msg[offsets[i] : offsets[i] + lengths[i]]`` for every i.

    ``msg`` must be a uint8 array with at least 8 readable bytes after the last message, so an
    unaligned 8-byte load at any message start stays in bounds.
    """
    n = len(lengths)
    out = np.empty(n, dtype=np.uint64)
    if n == 0:
        return out
    # An overlapping, byte-strided uint64 view: window[p] is the little-endian word at byte p.
    # Fancy-indexing it performs one unaligned 8-byte load per row, all inside numpy.
    window = np.ndarray(shape=(len(msg) - 7,), dtype="<u8", buffer=msg, strides=(1,))
    offsets = offsets.astype(np.int64, copy=False)
    lengths = lengths.astype(np.int64, copy=False)
    nfull = lengths >> 3
    order = None
    if nfull.min() != nfull.max():
        # Messages with more full words go first so that, at word j, the rows still consuming
        # words form a prefix (of each chunk) and are updated through slices instead of masks.
        order = np.argsort(-nfull, kind="stable")
        offsets, lengths, nfull = offsets[order], lengths[order], nfull[order]
    # Chunks small enough for the ~6 state/scratch arrays to stay in the CPU cache: the rounds
    # are ~100 elementwise passes, each of which would go to memory over whole-batch arrays.
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        out[lo:hi] = _siphash13_chunk(window, offsets[lo:hi], lengths[lo:hi], nfull[lo:hi])
    if order is None:
        return out
    unsorted = np.empty(n, dtype=np.uint64)
    unsorted[order] = out
    return unsorted


def _siphash13_chunk(
    window: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, nfull: np.ndarray
) -> np.ndarray:
    """SipHash-1-3 of one chunk of messages, sorted by descending full-word count."""
    n = len(lengths)
    # rows_with_more[j] = how many rows have more than j full words (a prefix: nfull descends).
    rows_with_more = n - np.cumsum(np.bincount(nfull))
    v0 = np.full(n, _V0, dtype=np.uint64)
    v1 = np.full(n, _V1, dtype=np.uint64)
    v2 = np.full(n, _V2, dtype=np.uint64)
    v3 = np.full(n, _V3, dtype=np.uint64)
    tmp = np.empty(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(int(nfull[0])):
            k = int(rows_with_more[j])
            m = window[offsets[:k] + 8 * j]
            v3[:k] ^= m
            _sip_round(v0[:k], v1[:k], v2[:k], v3[:k], tmp[:k])
            v0[:k] ^= m
        # Last block: the 0..7 tail bytes plus the message length (mod 256) in the top byte.
        tail_len = (lengths & 7).astype(np.uint64)
        tail = window[offsets + 8 * nfull]
        tail &= (np.uint64(1) << (tail_len * np.uint64(8))) - np.uint64(1)
        tail |= (lengths.astype(np.uint64) & np.uint64(0xFF)) << np.uint64(56)
        v3 ^= tail
        _sip_round(v0, v1, v2, v3, tmp)
        v0 ^= tail
        v2 ^= np.uint64(0xFF)
        for _ in range(3):
            _sip_round(v0, v1, v2, v3, tmp)
        v0 ^= v1
        v2 ^= v3
        v0 ^= v2
    return v0


def siphash13(data: bytes) -> int:
    """SipHash-1-3 with keys 0/0 of one byte string (what Rust's ``DefaultHasher`` computes).

    Example:
        >>> hex(siphash13(b""))
        '0xd1fba762150c532c'
    """
    buf = np.frombuffer(bytes(data) + b"\x00" * 8, dtype=np.uint8)
    return int(_siphash13_many(buf, np.zeros(1, np.int64), np.array([len(data)], np.int64))[0])


# --------------------------------------------------------------------------------------------
# The primary-key byte stream, built for a whole batch
# --------------------------------------------------------------------------------------------


def _check_pk_schema(schema: pa.Schema) -> None:
    """Raise SchemaMismatchError unless every column has a type Lance 14 can use as a PK."""
    if len(schema) == 0:
        raise SchemaMismatchError("no primary-key columns given")
    for field in schema:
        if not is_supported_pk_type(field.type):
            raise SchemaMismatchError(
                f"primary-key column {field.name!r} has type {field.type}, which Lance 14 cannot "
                "hash; use int8..int64, uint8..uint64, bool, utf8, large_utf8, binary or large_binary"
            )


def _valid_mask(arr: pa.Array) -> np.ndarray | None:
    """Boolean validity per row, or None when the array has no nulls."""
    if arr.null_count == 0:
        return None
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _fixed_values(arr: pa.Array, width: int) -> np.ndarray:
    """The (n, width) little-endian value bytes of an int32/int64 array (null slots: garbage)."""
    n = len(arr)
    dtype = "<i4" if width == 4 else "<i8"
    vals = np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset : arr.offset + n]
    return vals.view(np.uint8).reshape(n, width)


def _rows_as_binary(matrix: np.ndarray) -> pa.LargeBinaryArray:
    """Row i of a (n, w) uint8 matrix as the i-th value of a large_binary array (zero-copy data)."""
    n, w = matrix.shape
    offsets = np.arange(n + 1, dtype=np.int64) * w
    data = np.ascontiguousarray(matrix)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


_NULL_PART = pa.scalar(b"\x01", pa.large_binary())
_FLAG = pa.scalar(b"\x00", pa.large_binary())
_STR_END = pa.scalar(b"\xff", pa.large_binary())
_NO_SEP = pa.scalar(b"", pa.large_binary())


def _column_part(arr: pa.Array) -> pa.LargeBinaryArray:
    """Per row, this column's share of the hash stream as a null-free large_binary array."""
    t = arr.type
    n = len(arr)
    if t in _FIXED_WIDTH:
        w = _FIXED_WIDTH[t]
        rows = np.zeros((n, 1 + w), dtype=np.uint8)  # byte 0 stays 0x00, the "not null" flag
        rows[:, 1:] = _fixed_values(arr, w)
        part = _rows_as_binary(rows)
    elif t == pa.utf8():
        # Rust hashes a `str` as its bytes followed by 0xff (so "a","b" != "ab").
        part = pc.binary_join_element_wise(_FLAG, arr.cast(pa.large_binary()), _STR_END, _NO_SEP)
    elif t == pa.binary():
        # Rust hashes a `[u8]` as its length (usize, 8 LE bytes) followed by the bytes.
        offsets = np.frombuffer(arr.buffers()[1], dtype="<i4")[arr.offset : arr.offset + n + 1]
        rows = np.zeros((n, 9), dtype=np.uint8)
        rows[:, 1:] = (offsets[1:] - offsets[:-1]).astype("<u8").view(np.uint8).reshape(n, 8)
        part = pc.binary_join_element_wise(
            _rows_as_binary(rows), arr.cast(pa.large_binary()), _NO_SEP
        )
    else:
        # Value-less types (see _VALUE_LESS): only the flag byte, fixed up for nulls below.
        part = _rows_as_binary(np.zeros((n, 1), dtype=np.uint8))
    valid = _valid_mask(arr)
    if valid is not None:
        part = pc.if_else(pa.array(valid), part, _NULL_PART)
    return part


def _batch_messages(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``Hash`` byte stream of every row's primary key: (msg bytes, offsets, lengths).

    ``msg`` carries 8 zero bytes after the last message (see :func:`_siphash13_many`).
    """
    _check_pk_schema(batch.schema)
    n = batch.num_rows
    cols = batch.columns
    if all(c.null_count == 0 and c.type not in (pa.utf8(), pa.binary()) for c in cols):
        # Every row has the same length: lay the stream out as one (n, L) matrix directly.
        widths = [1 + _FIXED_WIDTH.get(c.type, 0) for c in cols]
        width = sum(widths)
        msg = np.zeros(n * width + 8, dtype=np.uint8)
        rows = msg[: n * width].reshape(n, width)
        at = 0
        for c, w in zip(cols, widths):
            if w > 1:
                rows[:, at + 1 : at + w] = _fixed_values(c, w - 1)
            at += w
        offsets = np.arange(n, dtype=np.int64) * width
        return msg, offsets, np.full(n, width, dtype=np.int64)
    # Variable lengths: let Arrow's kernels concatenate the per-column parts row by row.
    parts = [_column_part(c) for c in cols]
    joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, _NO_SEP)
    bufs = joined.buffers()
    bounds = np.frombuffer(bufs[1], dtype="<i8")[joined.offset : joined.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8)[bounds[0] : bounds[-1]]
    msg = np.zeros(len(data) + 8, dtype=np.uint8)
    msg[: len(data)] = data
    offsets = bounds[:-1] - bounds[0]
    return msg, offsets, bounds[1:] - bounds[:-1]


def pk_hashes(keys: pa.Table | pa.RecordBatch) -> np.ndarray:
    """The 64-bit bloom hash of every row's primary key, exactly as Lance 14 computes it.

    ``keys`` holds only the primary-key columns, in primary-key order. Per row, the bytes fed to
    SipHash-1-3 (k0 = k1 = 0) are, for each column: ``0x01`` if null, else ``0x00`` followed by
    int32: 4 LE bytes; int64: 8 LE bytes; utf8: the raw bytes then ``0xff``; binary: the length as
    8 LE bytes then the raw bytes; int8/16, uint8..64, bool, large_utf8, large_binary: nothing
    (Lance 14 hashes no value bytes for them). Other types raise
    :class:`~memwal_sql.errors.SchemaMismatchError`, as Lance does.

    Example:
        >>> h = pk_hashes(pa.table({"id": pa.array([7, 7, None], pa.int64())}))
        >>> h.dtype, bool(h[0] == h[1]), bool(h[0] == h[2])
        (dtype('uint64'), True, False)
    """
    batches = [keys] if isinstance(keys, pa.RecordBatch) else keys.to_batches()
    out = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        msg, offsets, lengths = _batch_messages(batch)
        out.append(_siphash13_many(msg, offsets, lengths))
    if not out:
        _check_pk_schema(keys.schema)
        return np.empty(0, dtype=np.uint64)
    return out[0] if len(out) == 1 else np.concatenate(out)


# --------------------------------------------------------------------------------------------
# The split-block bloom filter
# --------------------------------------------------------------------------------------------


def _check_num_bytes(num_bytes: int, error: type[Exception]) -> None:
    if num_bytes <= 0 or num_bytes % 32:
        raise error(
            f"a split-block bloom filter is a positive multiple of 32 bytes, got {num_bytes}"
        )


def _block_and_masks(hashes: np.ndarray, num_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per hash: its block index (int64) and the (n, 8) bit positions (0..31) in the block's words."""
    h = np.asarray(hashes, dtype=np.uint64)
    # Parquet's "fast range": the high 32 bits pick the block, scaled into [0, num_blocks).
    block = ((h >> np.uint64(32)) * np.uint64(num_blocks)) >> np.uint64(32)
    x = (h & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    with np.errstate(over="ignore"):
        bits = (x[:, None] * _SALT[None, :]) >> np.uint32(27)  # uint32 product wraps like Rust
    return block.astype(np.int64), bits


_SET_BITS_CHUNK = 1 << 15


def _set_bits(words: np.ndarray, hashes: np.ndarray) -> None:
    """OR the SBBF bits of ``hashes`` into the little-endian u32 ``words`` (in place)."""
    if len(hashes) == 0:
        return
    # Bit b of word w is bit (b % 8) of byte 4w + b // 8 in the little-endian file layout, i.e.
    # global bit 32w + b; packbits(bitorder="little") turns a flat bit array into those bytes.
    flat = np.zeros(len(words) * 32, dtype=bool)
    lanes = np.arange(0, 256, 32, dtype=np.int64)  # word j of a block starts at bit 32j
    # In chunks: the (n, 8) positions of a million hashes are 64 MB of temporaries, which cost
    # more to allocate than to compute.
    for start in range(0, len(hashes), _SET_BITS_CHUNK):
        block, bits = _block_and_masks(hashes[start : start + _SET_BITS_CHUNK], len(words) // 8)
        positions = bits.astype(np.int64)
        positions += lanes
        positions += (block * 256)[:, None]
        flat[positions.ravel()] = True
    words |= np.packbits(flat, bitorder="little").view("<u4")


def bloom_filter_bytes(hashes: np.ndarray, num_bytes: int = LANCE_BLOOM_BYTES) -> bytes:
    """The raw SBBF bitset (no header) holding ``hashes``, byte-identical to Lance's ``bloom_filter.bin``.

    Example:
        >>> data = bloom_filter_bytes(np.array([0xD1FBA762150C532C], dtype=np.uint64))
        >>> len(data), sum(bin(b).count("1") for b in data)
        (32768, 8)
    """
    _check_num_bytes(num_bytes, InvalidInputError)
    words = np.zeros(num_bytes // 4, dtype="<u4")
    _set_bits(words, np.asarray(hashes, dtype=np.uint64))
    return words.tobytes()


class BloomFilter:
    """A split-block bloom filter over primary-key hashes (see :func:`pk_hashes`).

    Example:
        >>> h = pk_hashes(pa.table({"id": pa.array([1, 2], pa.int64())}))
        >>> bf = BloomFilter.from_hashes(h[:1])
        >>> bf.might_contain(h).tolist()
        [True, False]
    """

    __slots__ = ("_words",)

    def __init__(self, num_bytes: int = LANCE_BLOOM_BYTES) -> None:
        """An empty filter of ``num_bytes`` bytes (a positive multiple of 32)."""
        _check_num_bytes(num_bytes, InvalidInputError)
        self._words = np.zeros(num_bytes // 4, dtype="<u4")

    @classmethod
    def from_bytes(cls, data: bytes) -> BloomFilter:
        """Load a raw bitset such as the contents of ``bloom_filter.bin``.

        Example:
            >>> BloomFilter.from_bytes(bytes(64)).num_bytes
            64
        """
        _check_num_bytes(len(data), StorageError)
        bf = cls.__new__(cls)
        bf._words = np.frombuffer(bytes(data), dtype="<u4").copy()
        return bf

    @classmethod
    def from_hashes(cls, hashes: np.ndarray, num_bytes: int = LANCE_BLOOM_BYTES) -> BloomFilter:
        """A filter holding ``hashes``.

        Example:
            >>> BloomFilter.from_hashes(np.array([1, 2], np.uint64), 32).might_contain(np.array([1], np.uint64)).tolist()
            [True]
        """
        bf = cls(num_bytes)
        bf.insert(hashes)
        return bf

    @property
    def num_bytes(self) -> int:
        """Size of the bitset in bytes."""
        return int(self._words.nbytes)

    def insert(self, hashes: np.ndarray) -> None:
        """Add ``hashes`` (uint64) to the filter.

        Example:
            >>> bf = BloomFilter(32); bf.insert(np.array([5], np.uint64)); bf.might_contain(np.array([5], np.uint64)).tolist()
            [True]
        """
        _set_bits(self._words, np.asarray(hashes, dtype=np.uint64))

    def might_contain(self, hashes: np.ndarray) -> np.ndarray:
        """Per hash: False if it was certainly never inserted, True if it may have been.

        Example:
            >>> BloomFilter(32).might_contain(np.array([1, 2], np.uint64)).tolist()
            [False, False]
        """
        h = np.asarray(hashes, dtype=np.uint64)
        if len(h) == 0:
            return np.zeros(0, dtype=bool)
        block, bits = _block_and_masks(h, len(self._words) // 8)
        words = self._words[block[:, None] * 8 + np.arange(8)]
        return ((words >> bits) & np.uint32(1)).all(axis=1)

    def to_bytes(self) -> bytes:
        """The raw bitset, as stored in ``bloom_filter.bin``.

        Example:
            >>> BloomFilter(32).to_bytes() == bytes(32)
            True
        """
        return self._words.tobytes()
