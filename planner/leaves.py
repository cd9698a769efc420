"""The one place a plan's leaves are built: a snapshot's source, read by an access method.

Example:
    ``[source_leaf(snap, src, Scan()) for src in snap.sources()]``
"""

from __future__ import annotations

from exec_nodes.base_source import BaseSourceExec
from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import Access, SourceLeaf
from memwal_sql.read_snapshot import ReadSnapshot, SnapshotSource


def source_leaf(snapshot: ReadSnapshot, src: SnapshotSource, access: Access) -> SourceLeaf:
    """The leaf of ``src`` (one of ``snapshot.sources()``) that reads it by ``access``, its
    rows in the snapshot's source schema, keeping what it reads in the snapshot's caches."""
    if src.kind == "base":
        return base_leaf(snapshot, access)
    schema, caches = snapshot.source_schema, snapshot.caches
    if src.rows is not None:
        mem = src.rows
        return MemTableSourceExec(
            src.region_id, mem.generation, mem.batches, schema, access, mem.origin, caches=caches
        )
    assert src.uri is not None  # a flushed generation
    return GenerationSourceExec(
        src.region_id,
        src.generation,
        src.uri,
        schema,
        access,
        snapshot.leaf_storage_options,
        caches=caches,
    )


def base_leaf(snapshot: ReadSnapshot, access: Access) -> BaseSourceExec:
    """The leaf of the snapshot's base table that reads it by ``access``."""
    return BaseSourceExec(snapshot.dataset, snapshot.source_schema, access, caches=snapshot.caches)
