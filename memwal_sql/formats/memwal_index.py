"""The MemWAL index of the base table: its details message, written and read back.

The index is an entry named ``__lance_mem_wal`` in the base table's manifest with no files and
``index_details = Any("/lance.table.MemWalIndexDetails", bytes)``, exactly as Lance 14's
``initialize_mem_wal`` writes it, so Lance's own readers and writers accept our tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

import lance
from lance import LanceOperation
from lance.dataset import Index

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails, MergedGeneration
from memwal_sql.errors import CommitConflictError, TableNotFoundError
from memwal_sql.formats.lance_manifest import INDEX_NAME, read_mem_wal_details
from memwal_sql.storage import ObjectStore

TYPE_URL = "/lance.table.MemWalIndexDetails"


def region_generations(entries: Iterable[MergedGeneration]) -> dict[str, int]:
    """``MergedGeneration`` entries (merge or index catch-up progress) as region id -> generation.

    Example:
        ``region_generations(details.merged_generations)``
    """
    return {str(uuid.UUID(bytes=m.region_id.uuid)): m.generation for m in entries}


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
        # lance types this as its Bitmap but documents (and accepts) a set of ints too.
        fragment_ids=set(),  # type: ignore[arg-type]
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


def update_mem_wal_details(
    uri: str,
    store: ObjectStore,
    change: Callable[[MemWalIndexDetails], None],
    storage_options: dict[str, str] | None = None,
    *,
    attempts: int = 8,
) -> lance.LanceDataset:
    """Commit the latest MemWAL index details with ``change(details)`` applied,
    keeping every merge progress a concurrent merger recorded.

    Lance 14 rebases a ``CreateIndex`` over commits made since its read version instead of
    failing, and the rebased details replace those the merger wrote: its ``merged_generations``
    would go back. So after each commit the versions in between are read, and if one recorded
    progress the new details lack, it is restored at once with another commit (repeated until a
    commit lands with nothing lost). Until then readers merely read merged generations again,
    which is harmless (spec, "Reader Consistency"), and a merger re-merges the same rows. Lance's
    own ``index_catchup`` record can go back the same way; that only understates coverage, and
    our readers derive catch-up instead (:mod:`memwal_sql.formats.index_catchup`).

    Example:
        ``update_mem_wal_details(tbl.uri, tbl.store, lambda d: d.maintained_indexes.append("i"))``
    """
    restore: dict[bytes, int] = {}
    for _ in range(attempts):
        ds = lance.dataset(uri, storage_options=storage_options)
        details = read_mem_wal_details(store, ds.version)
        if details is None:
            raise TableNotFoundError(f"{uri} has no MemWAL index; enable it with mw.create_table")
        change(details)
        _raise_progress(details, restore)
        committed = create_mem_wal_index(ds, details, storage_options)
        restore = {}
        ours = _progress(details)
        for v in range(ds.version + 1, committed.version):
            theirs = read_mem_wal_details(store, v)
            for rid, gen in (_progress(theirs) if theirs else {}).items():
                if gen > ours.get(rid, 0):
                    restore[rid] = max(gen, restore.get(rid, 0))
        if not restore:
            return committed
    raise CommitConflictError(
        f"the MemWAL index of {uri} kept changing under concurrent merges; retry later"
    )


def _progress(details: MemWalIndexDetails) -> dict[bytes, int]:
    return {m.region_id.uuid: m.generation for m in details.merged_generations}


def _raise_progress(details: MemWalIndexDetails, restore: dict[bytes, int]) -> None:
    """Raise ``details``' merge progress to at least ``restore`` (region uuid -> generation)."""
    if not restore:
        return
    merged = _progress(details)
    for rid, gen in restore.items():
        merged[rid] = max(gen, merged.get(rid, 0))
    del details.merged_generations[:]
    for rid, gen in sorted(merged.items()):
        details.merged_generations.add(generation=gen).region_id.uuid = rid
