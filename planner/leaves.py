"""The one place a plan's leaves are built: a snapshot's sources, read by an access method.

A region's sources are read newest first: its unflushed rows, then its generations. A point
lookup plans this for every key it is asked, so the leaves are built straight from the
snapshot's lists, with nothing in between.

Example:
    ``[leaf for r in snap.regions for leaf in region_leaves(snap, r, Scan())]``
"""

from __future__ import annotations

from collections.abc import Sequence

from exec_nodes.base_source import BaseSourceExec
from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.memtable_source import MemTableSourceExec
from exec_nodes.source import Access, SourceLeaf
from memwal_sql.read_snapshot import GenerationRef, ReadSnapshot, RegionSources


def base_leaf(snapshot: ReadSnapshot, access: Access) -> BaseSourceExec:
    """The leaf of the snapshot's base table that reads it by ``access``."""
    return BaseSourceExec(snapshot.dataset, snapshot.source_schema, access, caches=snapshot.caches)


def memtable_leaves(
    snapshot: ReadSnapshot, region: RegionSources, access: Access
) -> list[MemTableSourceExec]:
    """The leaves of ``region``'s unflushed rows (MemTables or WAL tail), newest first."""
    schema, caches, rid = snapshot.source_schema, snapshot.caches, region.region_id
    return [
        MemTableSourceExec(rid, m.generation, m.batches, schema, access, m.origin, caches=caches)
        for m in region.unflushed
    ]


def generation_leaf(
    snapshot: ReadSnapshot, region: RegionSources, generation: GenerationRef, access: Access
) -> GenerationSourceExec:
    """The leaf of one of ``region``'s generations (a gap one too) read by ``access``."""
    return GenerationSourceExec(
        region.region_id,
        generation.generation,
        generation.uri,
        snapshot.source_schema,
        access,
        snapshot.leaf_storage_options,
        caches=snapshot.caches,
    )


def generation_leaves(
    snapshot: ReadSnapshot,
    region: RegionSources,
    access: Access,
    gap: Sequence[GenerationRef] = (),
) -> list[GenerationSourceExec]:
    """The leaves of ``region``'s flushed generations (and its ``gap`` ones, see
    :meth:`RegionSources.generations_newest_first`), newest first."""
    return [
        generation_leaf(snapshot, region, g, access) for g in region.generations_newest_first(gap)
    ]


def region_leaves(
    snapshot: ReadSnapshot, region: RegionSources, access: Access
) -> list[SourceLeaf]:
    """Every source of ``region`` read by ``access``, newest first: its unflushed rows, then
    its generations."""
    return [
        *memtable_leaves(snapshot, region, access),
        *generation_leaves(snapshot, region, access),
    ]
