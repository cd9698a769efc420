"""The MemWAL index of the base table: its details message, written and read back.

The index is an entry named ``__lance_mem_wal`` in the base table's manifest with no files and
``index_details = Any("/lance.table.MemWalIndexDetails", bytes)``, exactly as Lance 14's
``initialize_mem_wal`` writes it, so Lance's own readers and writers accept our tables.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import lance
from lance import LanceOperation
from lance.dataset import Index

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails

INDEX_NAME = "__lance_mem_wal"
TYPE_URL = "/lance.table.MemWalIndexDetails"


def has_mem_wal_index(ds: lance.LanceDataset) -> bool:
    """True if the dataset's manifest holds a MemWAL index."""
    return ds.mem_wal_index_details() is not None


def create_mem_wal_index(
    ds: lance.LanceDataset,
    details: MemWalIndexDetails,
    storage_options: dict[str, str] | None = None,
) -> lance.LanceDataset:
    """Commit a new base version that holds the MemWAL index with ``details``."""
    index = Index(
        uuid=str(uuid.uuid4()),
        name=INDEX_NAME,
        fields=[],
        dataset_version=ds.version,
        fragment_ids=set(),
        index_version=0,
        created_at=datetime.now(timezone.utc),
        index_details=(TYPE_URL, details.SerializeToString()),
    )
    return lance.LanceDataset.commit(
        ds.uri,
        LanceOperation.CreateIndex(new_indices=[index], removed_indices=[]),
        read_version=ds.version,
        storage_options=storage_options,
    )
