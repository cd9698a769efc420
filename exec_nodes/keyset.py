"""KeySet: vectorised membership of primary keys, for excluding superseded base rows.

Integer keys use a sorted numpy array and ``searchsorted``. Other keys (strings, composite keys)
are encoded to order-preserving bytes, hashed with 64-bit SipHash and looked up the same way; a
hash hit is confirmed by comparing the encoded bytes, so the answer is exact. Building the set once
and probing it per batch avoids Arrow's ``is_in``, which rebuilds its hash table on every call.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.writer.bloom import pk_hashes
from memwal_sql.writer.pk_index import encode_composite_keys


def _encoded(keys: pa.Table) -> pa.Array:
    return pa.chunked_array(encode_composite_keys(keys)).combine_chunks().cast(pa.binary())


class KeySet:
    """An immutable set of primary keys.

    Example:
        >>> s = KeySet(pa.table({"id": [3, 1]}))
        >>> s.contains(pa.table({"id": [1, 2, 3]})).tolist()
        [True, False, True]
    """

    def __init__(self, keys: pa.Table) -> None:
        self.columns = keys.column_names
        self._size = keys.num_rows
        col = keys.column(0) if keys.num_columns == 1 else None
        self._integer = col is not None and pa.types.is_integer(col.type)
        if self._integer:
            assert col is not None
            self._sorted = np.unique(col.to_numpy())
            return
        encoded = _encoded(keys)
        hashes = pk_hashes(pa.table({"k": encoded}))
        order = np.argsort(hashes, kind="stable")
        self._hashes = hashes[order]
        self._values = encoded.take(pa.array(order))

    def __len__(self) -> int:
        return self._size

    def contains(self, keys: pa.Table | pa.RecordBatch) -> np.ndarray:
        """A boolean mask: which rows of ``keys`` (same key columns) are in the set."""
        n = keys.num_rows
        if n == 0 or self._size == 0:
            return np.zeros(n, dtype=bool)
        if self._integer:
            probe = keys.column(0).to_numpy()
            idx = np.searchsorted(self._sorted, probe)
            idx[idx == len(self._sorted)] = 0
            return self._sorted[idx] == probe
        table = keys if isinstance(keys, pa.Table) else pa.Table.from_batches([keys])
        encoded = _encoded(table.select(self.columns))
        hashes = pk_hashes(pa.table({"k": encoded}))
        lo = np.searchsorted(self._hashes, hashes, side="left")
        hi = np.searchsorted(self._hashes, hashes, side="right")
        hit = hi > lo
        out = np.zeros(n, dtype=bool)
        if not hit.any():
            return out
        rows = np.nonzero(hit)[0]
        # Almost always one candidate per hash; compare bytes for each candidate slot in turn.
        width = int((hi - lo)[rows].max())
        for j in range(width):
            slot = lo[rows] + j
            valid = slot < hi[rows]
            cand = np.where(valid, slot, lo[rows])
            same = pc.equal(encoded.take(pa.array(rows)), self._values.take(pa.array(cand)))
            out[rows] |= valid & same.to_numpy(zero_copy_only=False)
        return out
