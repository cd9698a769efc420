"""KeySet: vectorised membership of primary keys, for excluding superseded base rows.

Integer keys use a sorted numpy array and ``searchsorted``. Other keys (strings, composite keys)
are encoded to order-preserving bytes, hashed with 64-bit SipHash and looked up the same way; a
hash hit is confirmed by comparing the encoded bytes, so the answer is exact. Building the set once
and probing it per batch avoids Arrow's ``is_in``, which rebuilds its hash table on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.formats.bloom import pk_hashes
from memwal_sql.formats.key_index import encode_composite_keys

_ROW = "__memwal_row"


#: Up to this many rows of one integer key column, :func:`last_per_key` sorts in numpy (about
#: what the hash aggregate costs there) rather than start Arrow's Acero, whose first aggregate
#: in a process costs about 27 ms more: the first lookup or search after an open pays it.
_SORTED_ROWS = 1 << 16


def last_per_key(keys: pa.Table, rank: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """Last write wins: the distinct keys of ``keys`` and, for each, the highest ``rank`` of
    its rows (one hash aggregate, or for a few integer keys one sort), in no set order.

    Example:
        >>> k, r = last_per_key(pa.table({"id": [5, 7, 5]}), np.array([1, 2, 3]))
        >>> sorted(zip(k.column("id").to_pylist(), r.tolist()))
        [(5, 3), (7, 2)]
    """
    if (
        keys.num_columns == 1
        and 0 < keys.num_rows <= _SORTED_ROWS
        and pa.types.is_integer(keys.schema.field(0).type)
        and keys.column(0).null_count == 0
    ):
        values = keys.column(0).to_numpy()
        rank = np.asarray(rank, dtype=np.int64)
        order = np.lexsort((rank, values))
        ordered = values[order]
        last = np.ones(len(order), dtype=bool)  # the highest rank of each run of equal keys
        np.not_equal(ordered[1:], ordered[:-1], out=last[:-1])
        chosen = order[last]
        return keys.take(pa.array(chosen)), rank[chosen]
    names = keys.column_names
    t = keys.append_column(_ROW, pa.array(np.asarray(rank, dtype=np.int64)))
    best = t.group_by(names, use_threads=False).aggregate([(_ROW, "max")])
    return best.select(names), best.column(f"{_ROW}_max").to_numpy()


def encode_keys(keys: pa.Table) -> pa.Array:
    """Key columns as one binary column, order-preserving (a generation's ``_pk_index``
    stores composite keys this way)."""
    return pa.chunked_array(encode_composite_keys(keys)).combine_chunks().cast(pa.binary())


def _packing(keys: pa.Table) -> list[tuple[int, int]] | None:
    """For a composite key of integer columns whose values span at most 62 bits in all, each
    column's (offset, bit shift): the key packs into one int64 (a probe is then one search,
    as for a one-column key). None when the key does not pack."""
    if (
        keys.num_columns < 2
        or keys.num_rows == 0
        or not all(pa.types.is_integer(c.type) for c in keys.columns)
    ):
        return None
    spans = []
    for c in keys.columns:
        if c.null_count:
            return None
        lo, hi = pc.min_max(c).values()
        spans.append((int(lo.as_py()), int(hi.as_py())))
    shifts, total = [], 0
    for lo, hi in reversed(spans):
        shifts.append(total)
        total += max(1, (hi - lo).bit_length())
    if total > 62 or any(lo < -(1 << 62) or hi >= 1 << 62 for lo, hi in spans):
        return None
    return [(lo, shift) for (lo, _), shift in zip(spans, reversed(shifts))]


def _pack(keys: pa.Table, packing: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """The packed keys, and which rows lie inside the packed ranges (the others are in no
    set packed this way)."""
    packed = np.zeros(keys.num_rows, dtype=np.int64)
    inside = np.ones(keys.num_rows, dtype=bool)
    widths = [s for _, s in packing] + [62]
    for i, (c, (lo, shift)) in enumerate(zip(keys.columns, packing)):
        values = (
            c.to_numpy().astype(np.int64)
            if c.null_count == 0
            else c.fill_null(lo).to_numpy().astype(np.int64)
        )
        rel = values - lo
        span = 1 << (widths[i - 1] - shift) if i else 1 << (62 - shift)
        inside &= (rel >= 0) & (rel < span)
        if c.null_count:
            inside &= c.is_valid().to_numpy(zero_copy_only=False)
        packed |= np.where(inside, rel, 0) << shift
    return packed, inside


# A membership bitset (KeySet._bitset) is built for sets of at least this many integer keys
# spanning at most this many values (16 MiB of bits), at a test of at least this many keys.
_BITSET_MIN_KEYS = 4096
_BITSET_MAX_BITS = 1 << 27
_BITSET_MIN_PROBES = 4096


class KeySet:
    """An immutable set of primary keys that also tells where each key sits (for a key that
    occurs more than once, its first occurrence).

    Example:
        >>> s = KeySet(pa.table({"id": [3, 1]}))
        >>> s.contains(pa.table({"id": [1, 2, 3]})).tolist()
        [True, False, True]
        >>> s.positions(pa.table({"id": [1, 2, 3]})).tolist()
        [1, -1, 0]
        >>> KeySet(pa.table({"id": [5, 4, 5]})).positions(pa.table({"id": [5]})).tolist()
        [0]
    """

    def __init__(self, keys: pa.Table) -> None:
        self.columns = keys.column_names
        self._size = keys.num_rows
        self._bits: np.ndarray | Literal[False] | None = None  # see _bitset
        self._order: np.ndarray | None  # input row of each sorted entry (None: see indexing)
        col = keys.column(0) if keys.num_columns == 1 else None
        self._integer = col is not None and pa.types.is_integer(col.type)
        self._packing = None if self._integer else _packing(keys)
        if self._integer or self._packing is not None:
            if self._packing is None:
                assert col is not None  # no packing here means one integer column
                values = col.to_numpy()
            else:
                values = _pack(keys, self._packing)[0]
            self._order = np.argsort(values, kind="stable")
            self._sorted = values[self._order]
            self._integer = True
            return
        encoded = encode_keys(keys)
        hashes = pk_hashes(pa.table({"k": encoded}))
        self._order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[self._order]
        self._values = encoded.take(pa.array(self._order))

    @classmethod
    def indexing(cls, keys: pa.Table, values: np.ndarray) -> tuple[KeySet, np.ndarray]:
        """A set of ``keys`` and ``values`` (one per row of ``keys``) reordered so that
        ``values[s.positions(probe)]`` is each probe's value. The set then keeps no sort order
        of its own: a third less memory for a big table's key index.

        Example:
            >>> s, v = KeySet.indexing(pa.table({"id": [30, 10, 20]}), np.array([3, 1, 2]))
            >>> v[s.positions(pa.table({"id": [20, 30]}))].tolist()
            [2, 3]
        """
        s = cls(keys)
        assert s._order is not None
        values = values[s._order]
        s._order = None
        return s, values

    def __len__(self) -> int:
        return self._size

    def newest_rows(
        self, rank: np.ndarray | Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray | None:
        """Which rows of the set's input hold the highest ``rank`` of their key (the first of
        them on a tie: one per key), from the set's sort order, no aggregate; None where that
        order cannot tell equal keys apart (two string or composite keys sharing a hash).
        ``rank`` may be a function giving the ranks of some input rows: only the rows of
        repeated keys are ranked.

        Example:
            >>> KeySet(pa.table({"id": [5, 7, 5]})).newest_rows(np.array([1, 2, 3])).tolist()
            [False, True, True]
        """
        keep = np.ones(self._size, dtype=bool)
        s = self._sorted if self._integer else self._hashes
        same = s[1:] == s[:-1]
        if not same.any():
            return keep
        if not self._integer or self._order is None:
            return None
        # Only the sorted entries in runs of a repeated key are ranked: after one large write
        # that repeats a few keys, a few rows, not a pass of several arrays over all of them.
        in_run = np.zeros(self._size, dtype=bool)
        in_run[:-1] = same
        in_run[1:] |= same
        at = np.flatnonzero(in_run)
        sub = s[at]
        first = np.r_[True, sub[1:] != sub[:-1]]
        group = np.cumsum(first) - 1
        rows = self._order[at]
        ranked = rank(rows) if callable(rank) else rank[rows]
        best = np.maximum.reduceat(ranked, np.flatnonzero(first))
        won = np.flatnonzero(ranked == best[group])
        won = won[np.r_[True, group[won[1:]] != group[won[:-1]]]]  # one winner per key
        keep[rows] = False
        keep[rows[won]] = True
        return keep

    def subset(self, keep: np.ndarray, renumbered: np.ndarray | None = None) -> KeySet:
        """The set of the input rows where ``keep`` is true (renumbered in order), without
        sorting again; ``renumbered``, if the caller has it, is each kept row's new number.

        Example:
            >>> s = KeySet(pa.table({"id": [5, 7, 5]})).subset(np.array([False, True, True]))
            >>> s.positions(pa.table({"id": [5, 7]})).tolist()
            [1, 0]
        """
        assert self._order is not None
        out = KeySet.__new__(KeySet)
        out.columns, out._integer, out._packing = self.columns, self._integer, self._packing
        out._bits = None
        kept = keep[self._order]
        if renumbered is None:
            renumbered = np.cumsum(keep) - 1
        out._order = renumbered[self._order[kept]]
        out._size = len(out._order)
        if self._integer:
            out._sorted = self._sorted[kept]
        else:
            out._hashes = self._hashes[kept]
            out._values = self._values.filter(pa.array(kept))
        return out

    @property
    def nbytes(self) -> int:
        """Memory the set holds, with its membership bitset once a big test built it (a
        cache that keeps the set counts it at its next access: see ``LookupCache.resize``)."""
        parts = [self._order] + ([self._sorted] if self._integer else [self._hashes, self._values])
        if isinstance(self._bits, np.ndarray):
            parts.append(self._bits)
        return sum(p.nbytes for p in parts if p is not None)

    def _input_rows(self, sorted_at: np.ndarray) -> np.ndarray:
        """The input rows of the set's sorted entries at ``sorted_at``."""
        return sorted_at if self._order is None else self._order[sorted_at]

    def contains(self, keys: pa.Table | pa.RecordBatch) -> np.ndarray:
        """A boolean mask: which rows of ``keys`` (same key columns) are in the set."""
        bits = self._bitset() if keys.num_rows >= _BITSET_MIN_PROBES else None
        if bits is None:
            return self.positions(keys) >= 0
        probe, inside = self._integer_probe(keys)
        ok = _bits_hold(bits, int(self._sorted[0]), probe)
        return ok if inside is None else ok & inside

    def _bitset(self) -> np.ndarray | None:
        """One bit per value between the set's smallest and largest integer key, built at the
        first big membership test; None for a set too small to need it or too sparse.

        A scan whose base table is too big for a cached key index tests every base row
        against the newer keys: in random key order, a binary search over a big set misses
        the CPU caches at every step, one bit each does not (TPC-H ``lineitem`` at scale factor
        1 is that case: ``benchmarks/bench_tpch.py --scale 1``, docs/performance.md). The bits
        are built without a bool array of the whole range.
        """
        if not self._integer or self._size < _BITSET_MIN_KEYS or self._sorted.dtype == np.uint64:
            return None
        if self._bits is None:
            span = int(self._sorted[-1]) - int(self._sorted[0]) + 1
            if span > _BITSET_MAX_BITS:
                self._bits = False
            else:
                # The keys are sorted: OR each byte's bits together, byte by byte in order.
                rel = self._sorted.astype(np.int64) - int(self._sorted[0])
                byte = rel >> 3
                starts = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
                bits = np.zeros((span + 7) // 8, dtype=np.uint8)
                masks = np.left_shift(1, rel & 7).astype(np.uint8)
                bits[byte[starts]] = np.bitwise_or.reduceat(masks, starts)
                self._bits = bits
        return None if self._bits is False else self._bits

    def _integer_probe(
        self, keys: pa.Table | pa.RecordBatch
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``keys`` as the integers the set is sorted by, and which of them lie inside a
        composite key's packed ranges (None: a one-column key, all of them)."""
        if self._packing is None:
            return keys.column(0).to_numpy(), None
        return _pack(keys.select(self.columns), self._packing)

    def positions(self, keys: pa.Table | pa.RecordBatch) -> np.ndarray:
        """For each row of ``keys``, the row of the set's input holding that key, or -1."""
        n = keys.num_rows
        out = np.full(n, -1, dtype=np.int64)
        if n == 0 or self._size == 0:
            return out
        if self._integer:
            probe, inside = self._integer_probe(keys)
            if n == 1 and inside is None:  # a point lookup asks every source for one key
                i = int(self._sorted.searchsorted(probe[0]))
                if i < len(self._sorted) and self._sorted[i] == probe[0]:
                    out[0] = self._input_rows(np.array([i]))[0]
                return out
            # Only the set's keys within the probes' range can match: batches of a table kept
            # in key order then search a small window, not the whole set (TPC-H ``lineitem``
            # at scale factor 1, in key order: benchmarks/bench_tpch.py --scale 1).
            lo, hi = np.searchsorted(self._sorted, [probe.min(), probe.max()])
            hi = min(int(hi) + 1, len(self._sorted))
            if hi <= lo:  # every probe is above every key of the set
                return out
            window = self._sorted[lo:hi]
            # A big window is cold in the CPU caches; probing in key order halves the misses.
            order = np.argsort(probe, kind="stable") if n > 64 else None
            idx = np.empty(n, dtype=np.intp)
            if order is None:
                idx[:] = np.searchsorted(window, probe)
            else:
                idx[order] = np.searchsorted(window, probe[order])
            idx[idx == len(window)] = 0
            hit = window[idx] == probe
            if inside is not None:
                hit &= inside
            out[hit] = self._input_rows(lo + idx[hit])
            return out
        table = keys if isinstance(keys, pa.Table) else pa.Table.from_batches([keys])
        encoded = encode_keys(table.select(self.columns))
        hashes = pk_hashes(pa.table({"k": encoded}))
        lo = np.searchsorted(self._hashes, hashes, side="left")
        hi = np.searchsorted(self._hashes, hashes, side="right")
        rows = np.nonzero(hi > lo)[0]
        if len(rows) == 0:
            return out
        probe = encoded.take(pa.array(rows))
        # Almost always one candidate per hash; compare bytes for each candidate slot in turn.
        for j in range(int((hi - lo)[rows].max())):
            slot = lo[rows] + j
            valid = slot < hi[rows]
            cand = np.where(valid, slot, lo[rows])
            same = pc.equal(probe, self._values.take(pa.array(cand)))
            match = valid & same.to_numpy(zero_copy_only=False) & (out[rows] < 0)
            out[rows[match]] = self._input_rows(cand[match])
        return out


def _bits_hold(bits: np.ndarray, low: int, probe: np.ndarray) -> np.ndarray:
    """Which of the integers ``probe`` have their bit set in ``bits`` (bit ``i`` of byte
    ``j`` is the value ``low + 8 * j + i``)."""
    rel = probe.astype(np.int64, copy=False) - low
    ok = (rel >= 0) & (rel < len(bits) * 8)
    at = np.where(ok, rel, 0)
    return ok & ((bits[at >> 3] >> (at & 7)) & 1).astype(bool)


class KeyMembership:
    """Which keys a set holds, and nothing else (no positions): for many integer keys over a
    dense range, one bit per value set straight from the unsorted keys, with no sort; else
    a :class:`KeySet`. What a base scan probes when it only drops the keys newer sources
    hold, and the set is built per process (a Spark task's: memwal_sql.spark.source).

    Example:
        >>> KeyMembership(pa.table({"id": [3, 1]})).contains(pa.table({"id": [1, 2, 3]})).tolist()
        [True, False, True]
    """

    def __init__(self, keys: pa.Table) -> None:
        self._set: KeySet | None = None
        self._bits: np.ndarray | None = None
        self._low = 0
        col = keys.column(0) if keys.num_columns == 1 else None
        if (
            col is not None
            and keys.num_rows >= _BITSET_MIN_KEYS
            and pa.types.is_integer(col.type)
            and col.type != pa.uint64()
            and col.null_count == 0
        ):
            values = col.to_numpy().astype(np.int64, copy=False)
            low, span = int(values.min()), int(values.max()) - int(values.min()) + 1
            if span <= _BITSET_MAX_BITS:
                rel = values - low
                self._bits = np.zeros((span + 7) // 8, dtype=np.uint8)
                np.bitwise_or.at(self._bits, rel >> 3, np.left_shift(1, rel & 7).astype(np.uint8))
                self._low = low
                return
        self._set = KeySet(keys)

    @property
    def nbytes(self) -> int:
        if self._set is not None:
            return self._set.nbytes
        assert self._bits is not None
        return self._bits.nbytes

    def contains(self, keys: pa.Table | pa.RecordBatch) -> np.ndarray:
        """A boolean mask: which rows of ``keys`` (same key columns) are in the set."""
        if self._set is not None:
            return self._set.contains(keys)
        assert self._bits is not None
        return _bits_hold(self._bits, self._low, keys.column(0).to_numpy())
