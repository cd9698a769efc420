"""RowMask: a set of base-table row addresses, one bitmap per fragment, probed per batch.

A scan drops the base rows whose key has a newer version. Their addresses (fragment id << 32 |
offset) are known before the scan; probing each batch's addresses against a sorted array costs a
binary search per row, under the GIL. A bitmap of each fragment's physical rows answers with one
slice when a batch's offsets are contiguous (an unfiltered scan) and one gather otherwise, at one
bit per physical row of the fragments that have a masked row (``benchmarks/bench_read.py``
measures the scans that use it, docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

_OFFSET = np.uint64(0xFFFFFFFF)


def split_addresses(addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row addresses as (fragment id, offset in the fragment), both int64.

    Example:
        >>> [a.tolist() for a in split_addresses(np.array([(1 << 32) | 2, 5], np.uint64))]
        [[1, 0], [2, 5]]
    """
    addresses = np.asarray(addresses).astype(np.uint64, copy=False)
    return (addresses >> np.uint64(32)).astype(np.int64), (addresses & _OFFSET).astype(np.int64)


class RowMask:
    """Row addresses as a packed bitmap per fragment.

    Example:
        >>> m = RowMask(np.array([(1 << 32) | 2], np.uint64), {1: 4})
        >>> m.hits(np.array([(1 << 32) | 1, (1 << 32) | 2], np.uint64)).tolist()
        [False, True]
    """

    def __init__(self, addresses: np.ndarray, physical_rows: Mapping[int, int]) -> None:
        fragment, offset = split_addresses(addresses)
        self._bits: dict[int, np.ndarray] = {}
        self.count = 0
        for f in np.unique(fragment).tolist():
            bits = np.zeros(physical_rows[f], dtype=bool)
            bits[offset[fragment == f]] = True
            self.count += int(np.count_nonzero(bits))
            self._bits[f] = np.packbits(bits)

    def __len__(self) -> int:
        return self.count

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bits.values())

    def hits(self, addresses: np.ndarray) -> np.ndarray | None:
        """Which of ``addresses`` (ascending, as a scan returns them) are in the mask; None
        when none can be (their fragments have no masked row)."""
        if not len(addresses) or not self._bits:
            return None
        first, last = int(addresses[0]) >> 32, int(addresses[-1]) >> 32
        if first == last:
            bits = self._bits.get(first)
            return None if bits is None else _probe(bits, addresses)
        fragment = addresses >> np.uint64(32)
        out = np.zeros(len(addresses), dtype=bool)
        for f in np.unique(fragment).tolist():
            bits = self._bits.get(f)
            if bits is not None:
                at = fragment == f
                out[at] = _probe(bits, addresses[at])
        return out


def _probe(bits: np.ndarray, addresses: np.ndarray) -> np.ndarray:
    """The bits of one fragment's ``addresses``."""
    start = int(addresses[0]) & 0xFFFFFFFF
    n = len(addresses)
    if (int(addresses[-1]) & 0xFFFFFFFF) - start == n - 1:  # contiguous: one slice
        lo = start >> 3
        return np.unpackbits(bits[lo : (start + n + 7) >> 3])[start - (lo << 3) :][:n].view(bool)
    offset = (addresses & _OFFSET).astype(np.int64)
    return ((bits[offset >> 3] >> (7 - (offset & 7)).astype(np.uint8)) & 1).view(bool)
