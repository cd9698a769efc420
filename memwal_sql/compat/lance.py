"""pylance 14 behaviour memwal-sql depends on but pylance does not document.

Example:
    >>> is_not_found(ValueError("Dataset at path x was not found"))
    True
"""

from __future__ import annotations

from collections.abc import Sequence

import lance
import pyarrow as pa

# Lance's merge_insert with `mark_sstables_as_compacted` refuses a stale MemWAL commit with
# this text; other lost races say "conflict". Both are a retry, not a failure.
STALE_COMPACTION = "Stale SSTable compaction"


def take_rows(dataset: lance.LanceDataset, row_addresses: pa.Array,
              columns: Sequence[str]) -> pa.Table:
    """The rows at ``row_addresses`` (``fragment_id << 32 | offset``), in that order.

    pylance has no public call that takes row addresses (``take`` takes positions in the
    filtered table, ``LanceFragment.take`` offsets within one fragment); ``_take_rows`` does.
    """
    return dataset._take_rows(row_addresses, columns=list(columns))


def is_not_found(error: BaseException) -> bool:
    """Whether a pylance error opening a dataset means there is none."""
    text = str(error).lower()
    return isinstance(error, FileNotFoundError) or "not found" in text or \
        "does not exist" in text


def is_commit_conflict(error: BaseException) -> bool:
    """Whether a pylance commit failed because another writer committed first ("Retryable
    commit conflict", a stale compaction, or another lost race)."""
    return STALE_COMPACTION in str(error) or "conflict" in str(error).lower()
