"""Lance 14's bucket hash: Spark-style murmur3 x86_32, vectorised over Arrow arrays with numpy.

``bucket`` hashes each value as Lance 14 does (:func:`murmur3_bucket`). ``multi_bucket`` first
normalises values so that equal values of different types hash equally (``_hash_multi``). The
Arrow buffer helpers here read arrays zero-copy; the other transforms use them too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from memwal_sql.errors import InvalidRegionSpecError
from memwal_sql.partitioning.arrow_types import (
    _BUCKET_TYPES,
    _MULTI_BUCKET_TYPES,
    _is_int,
    _is_string,
)

__all__ = ["MAX_NUM_BUCKETS", "murmur3_bucket"]

# --------------------------------------------------------------------------------------------
# Bucket count limit
# --------------------------------------------------------------------------------------------

#: Lance's ``initialize_mem_wal`` rejects bucket counts outside [1, 1024].
MAX_NUM_BUCKETS = 1024


def _check_num_buckets(num_buckets: Any, where: str) -> int:
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, (int, np.integer)):
        raise InvalidRegionSpecError(f"{where}: num_buckets must be an int, got {num_buckets!r}")
    if not 1 <= int(num_buckets) <= MAX_NUM_BUCKETS:
        raise InvalidRegionSpecError(
            f"{where}: num_buckets must be in [1, {MAX_NUM_BUCKETS}] (Lance's limit), "
            f"got {num_buckets}"
        )
    return int(num_buckets)


# --------------------------------------------------------------------------------------------
# Vectorised murmur3 (Spark / Lance flavour), on uint32 numpy arrays
# --------------------------------------------------------------------------------------------
#
# Numpy uint32 array arithmetic wraps modulo 2**32. That is exactly the `wrapping_mul` /
# `wrapping_add` of Lance's Rust code, and the signed/unsigned view of the bits makes no
# difference to the result.

_U32 = np.uint32
_C1 = _U32(0xCC9E2D51)
_C2 = _U32(0x1B873593)
_M5 = _U32(5)
_N1 = _U32(0xE6546B64)
_F1 = _U32(0x85EBCA6B)
_F2 = _U32(0xC2B2AE35)
_S13 = _U32(13)
_S15 = _U32(15)
_S16 = _U32(16)
_S17 = _U32(17)
_S19 = _U32(19)


def _mix_k1(k: np.ndarray) -> np.ndarray:
    k = k * _C1
    k = (k << _S15) | (k >> _S17)
    k *= _C2
    return k


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    h = h ^ k
    h = (h << _S13) | (h >> _S19)
    h *= _M5
    h += _N1
    return h


def _fmix(h: np.ndarray, length: np.ndarray | np.uint32) -> np.ndarray:
    h = h ^ length
    h ^= h >> _S16
    h *= _F1
    h ^= h >> _S13
    h *= _F2
    h ^= h >> _S16
    return h


def _hash_int(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Lance `hash_int`: murmur3 of one 4-byte little-endian word. `values` is uint32."""
    return _fmix(_mix_h1(seed, _mix_k1(values)), _U32(4))


def _hash_long(values: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Lance `hash_long`: murmur3 of 8 bytes, low word first. `values` is uint64."""
    low = values.astype(np.uint32)  # narrowing astype wraps: the low 32 bits
    high = (values >> np.uint64(32)).astype(np.uint32)
    h = _mix_h1(seed, _mix_k1(low))
    h = _mix_h1(h, _mix_k1(high))
    return _fmix(h, _U32(8))


def _hash_utf8(offsets: np.ndarray, data: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """Lance/Spark `hashUnsafeBytes` over an Arrow string array, vectorised.

    The full 4-byte words are mixed as little-endian uint32. Each of the last ``len % 4``
    bytes is then mixed *on its own*, sign-extended to 32 bits. Standard murmur3 instead
    packs the tail into one word, so ``mmh3.hash`` differs whenever ``len % 4 != 0``.

    Vectorisation: word ``j`` of every row that still has ``> j`` words is processed in one
    numpy step. The set of active rows only shrinks, so the total work is O(total words +
    rows). The number of steps is the longest row's word count, plus 3 tail steps.
    """
    starts = offsets[:-1].astype(np.int64)
    lengths = offsets[1:].astype(np.int64) - starts
    nwords = lengths >> 2
    h = seed.copy()
    max_words = int(nwords.max()) if len(nwords) else 0
    if max_words:
        # An unaligned uint32 view whose element i is bytes[i:i+4]. Every full word lies
        # inside its string, so no padding is needed.
        words = np.ndarray(shape=(len(data) - 3,), dtype="<u4", buffer=data, strides=(1,))
        # Compacted state of the rows that still have words to mix.
        rows, act_h, act_pos, act_nw = None, h, starts, nwords  # rows None = all rows
        for j in range(max_words):
            if int(act_nw.min()) <= j:
                # Some rows have no word j: store their hash and drop them from the set.
                done = act_nw <= j
                keep = ~done
                if rows is None:
                    h = act_h.copy()
                    rows = np.flatnonzero(keep)
                else:
                    h[rows[done]] = act_h[done]
                    rows = rows[keep]
                act_h, act_pos, act_nw = act_h[keep], act_pos[keep], act_nw[keep]
            act_h = _mix_h1(act_h, _mix_k1(words[act_pos + 4 * j]))
        if rows is None:
            h = act_h
        else:
            h[rows] = act_h
    tails = lengths & 3
    if tails.any():
        tail_start = starts + 4 * nwords
        signed_bytes = data.view(np.int8)
        for t in range(3):
            rows = np.flatnonzero(tails > t)
            if not len(rows):
                break
            # Sign-extend the byte (Rust `byte as i8 as i32`) and reinterpret it as uint32.
            k = signed_bytes[tail_start[rows] + t].astype(np.int32).view(np.uint32)
            h[rows] = _mix_h1(h[rows], _mix_k1(k))
    return _fmix(h, lengths.astype(np.uint32))


def _valid_mask(arr: pa.Array) -> np.ndarray | None:
    """Boolean validity per row, or None when the array has no nulls."""
    if arr.null_count == 0:
        return None
    if pa.types.is_null(arr.type):
        return np.zeros(len(arr), dtype=bool)
    return _unpack_bits(arr.buffers()[0], arr.offset, len(arr))


def _unpack_bits(buf: pa.Buffer, offset: int, length: int) -> np.ndarray:
    first, last = offset // 8, (offset + length + 7) // 8
    raw = np.frombuffer(buf, dtype=np.uint8, count=last - first, offset=first)
    bits = np.unpackbits(raw, bitorder="little")
    return bits[offset - 8 * first : offset - 8 * first + length].view(bool)


def _primitive(arr: pa.Array, dtype: Any) -> np.ndarray:
    """The data buffer of a fixed-width array as numpy, zero-copy. Null slots hold garbage."""
    dtype = np.dtype(dtype)
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.zeros(len(arr), dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _string_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets[n+1], data bytes) of a utf8 / large_utf8 array, zero-copy."""
    off_dtype = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = _primitive_offsets(arr, off_dtype)
    data_buf = arr.buffers()[2]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    return offsets, data


def _primitive_offsets(arr: pa.Array, dtype: Any) -> np.ndarray:
    dtype = np.dtype(dtype)
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.zeros(len(arr) + 1, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=len(arr) + 1, offset=arr.offset * dtype.itemsize)


def _canonical_f32_bits(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint32).copy()
    bits[values == 0] = 0  # +0.0 and -0.0
    bits[np.isnan(values)] = 0x7FC00000
    return bits


def _canonical_f64_bits(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint64).copy()
    bits[values == 0] = 0
    bits[np.isnan(values)] = 0x7FF8000000000000
    return bits


_SIGN_EXTEND_32 = {pa.int8(): np.int8, pa.int16(): np.int16}
_ZERO_EXTEND_32 = {pa.uint8(): np.uint8, pa.uint16(): np.uint16}


def _decode_dictionary(arr: pa.Array) -> pa.Array:
    # Dictionary-encoded input is hashed and transformed by its values. Lance itself rejects
    # dictionary columns, but equal values must land in the same region whatever the encoding.
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _hash_lance(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Per-row murmur3 exactly as Lance 14 `hash_array_value` (NULL -> seed)."""
    arr = _decode_dictionary(arr)
    t = arr.type
    n = len(arr)
    if pa.types.is_null(t):
        return seed.copy()
    if t in _SIGN_EXTEND_32:
        h = _hash_int(_primitive(arr, _SIGN_EXTEND_32[t]).astype(np.int32).view(np.uint32), seed)
    elif t in _ZERO_EXTEND_32:
        h = _hash_int(_primitive(arr, _ZERO_EXTEND_32[t]).astype(np.uint32), seed)
    elif t in (pa.int32(), pa.uint32(), pa.date32()) or pa.types.is_time32(t):
        h = _hash_int(_primitive(arr, np.uint32), seed)
    elif t in (pa.int64(), pa.uint64()) or pa.types.is_timestamp(t) or pa.types.is_time64(t):
        # Timestamps hash their raw i64 in their own unit, so ts[s] 1 != ts[ms] 1000.
        h = _hash_long(_primitive(arr, np.uint64), seed)
    elif pa.types.is_boolean(t):
        h = _hash_int(_unpack_bits(arr.buffers()[1], arr.offset, n).astype(np.uint32), seed)
    elif pa.types.is_float32(t):
        h = _hash_int(_canonical_f32_bits(_primitive(arr, np.float32)), seed)
    elif pa.types.is_float64(t):
        h = _hash_long(_canonical_f64_bits(_primitive(arr, np.float64)), seed)
    elif _is_string(t):
        offsets, data = _string_parts(arr)
        h = _hash_utf8(offsets, data, seed)
    else:
        raise InvalidRegionSpecError(
            f"unsupported bucket column type {t}; Lance 14 can only bucket {_BUCKET_TYPES}"
        )
    valid = _valid_mask(arr)
    return h if valid is None else np.where(valid, h, seed)


_NS_PER = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_MS_PER_DAY = 86_400_000
_TWO_63 = 2.0**63


def _hash_multi(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Per-row murmur3 of a type-normalised value, for ``multi_bucket`` (NULL -> seed).

    The values are normalised so that equal values of different types hash equally:

    * every integer type and bool -> its value as int64 (uint64 as the same 64 bits),
      then ``hash_long``;
    * float32/float64 -> widened to float64. An integral value inside the int64 range hashes
      as that integer (so ``5.0`` equals ``5``). Any other value hashes its canonical float64
      bits (+-0 -> 0, NaN -> the canonical NaN);
    * date32/date64 -> days since epoch (date64 floor-divided by 86_400_000 ms);
    * timestamp -> nanoseconds since epoch in any unit (wrapping outside the ns range, where
      timestamp[ns] has no value to collide with). time32/time64 -> nanoseconds since
      midnight;
    * utf8/large_utf8 -> the Spark-style byte hash, as for ``bucket``.
    """
    arr = _decode_dictionary(arr)
    t = arr.type
    if pa.types.is_null(t):
        return seed.copy()
    if _is_int(t) or pa.types.is_boolean(t):
        if pa.types.is_boolean(t):
            v = _unpack_bits(arr.buffers()[1], arr.offset, len(arr)).astype(np.uint64)
        elif t == pa.uint64():
            v = _primitive(arr, np.uint64)
        else:
            v = _primitive(arr, t.to_pandas_dtype()).astype(np.int64).view(np.uint64)
        h = _hash_long(v, seed)
    elif pa.types.is_float32(t) or pa.types.is_float64(t):
        f = _primitive(arr, t.to_pandas_dtype()).astype(np.float64)
        with np.errstate(invalid="ignore"):
            integral = np.isfinite(f) & (np.floor(f) == f) & (f >= -_TWO_63) & (f < _TWO_63)
        as_int = np.where(integral, f, 0.0).astype(np.int64).view(np.uint64)
        h = _hash_long(np.where(integral, as_int, _canonical_f64_bits(f)), seed)
    elif pa.types.is_date32(t):
        h = _hash_long(_primitive(arr, np.int32).astype(np.int64).view(np.uint64), seed)
    elif pa.types.is_date64(t):
        days = np.floor_divide(_primitive(arr, np.int64), _MS_PER_DAY)
        h = _hash_long(days.view(np.uint64), seed)
    elif pa.types.is_timestamp(t) or pa.types.is_time(t):
        raw = _primitive(arr, np.int32 if pa.types.is_time32(t) else np.int64).astype(np.int64)
        # Uniform-unit rescale; uint64 multiplication wraps instead of raising.
        ns = raw.view(np.uint64) * np.uint64(_NS_PER[t.unit])
        h = _hash_long(ns, seed)
    elif _is_string(t):
        offsets, data = _string_parts(arr)
        h = _hash_utf8(offsets, data, seed)
    else:
        raise InvalidRegionSpecError(
            f"unsupported multi_bucket column type {t}; expected {_MULTI_BUCKET_TYPES}"
        )
    valid = _valid_mask(arr)
    return h if valid is None else np.where(valid, h, seed)


def _to_bucket(h: np.ndarray, num_buckets: int) -> np.ndarray:
    # Lance: `(hash & i32::MAX) % num_buckets`. It is NOT abs(hash) % N, which differs for
    # every negative hash and overflows for i32::MIN.
    return ((h & _U32(0x7FFFFFFF)) % _U32(num_buckets)).astype(np.int32)


def murmur3_bucket(values: pa.Array | pa.ChunkedArray, num_buckets: int) -> np.ndarray:
    """Lance 14 bucket ids (int32 numpy array) of an Arrow array; NULL -> 0.

    Example:
        >>> murmur3_bucket(pa.array(["a", "b", None]), 8).tolist()
        [1, 5, 0]
    """
    _check_num_buckets(num_buckets, "murmur3_bucket")
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    parts = [_to_bucket(_hash_lance(c, np.zeros(len(c), np.uint32)), num_buckets) for c in chunks]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)
