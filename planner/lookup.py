"""Plan primary-key point lookups (the spec's point-lookup plan), in batches.

Per region: the live MemTables and then the flushed generations, newest first, each generation
behind its bloom filter, in a :class:`CoalesceFirstExec` that stops at the first hit; the base
table (through its primary-key btree) last, for the keys no region resolved. Keys are routed to
their region by the region spec when the spec reads only key columns; otherwise every region is
probed. A tombstone in a newer source resolves a key as absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from exec_nodes.base_source import BaseSourceExec
from exec_nodes.generation_source import GenerationSourceExec
from exec_nodes.lookup import (
    HASH,
    BloomFilterGuardExec,
    CoalesceFirstExec,
    GenerationIndexExec,
    KeyedExec,
    PointLookupExec,
    distinct_keys,
)
from exec_nodes.source import Lookup, version_schema
from memwal_sql.expressions.predicate import And, Compare, InList, Or, Predicate, conjuncts
from memwal_sql.formats.bloom import pk_hashes
from memwal_sql.formats.generation import BLOOM_FILTER
from memwal_sql.partitioning.region_spec import RegionSpec
from memwal_sql.read_snapshot import GenerationRef, ReadSnapshot
from memwal_sql.storage import ObjectStore
from memwal_sql.structures.cache import Caches
from planner.indexed import IndexedRead, plan_indexed_read
from planner.leaves import base_leaf, generation_leaves, memtable_leaves
from planner.plan import PlanExec

# SQL `pk IN (...)` lists up to this many keys run as a point lookup; a longer list is a scan
# (pruned by region), which reads sequentially what so many random reads would touch anyway.
MAX_SQL_LOOKUP_KEYS = 65_536
# From this many keys per region, a region's generations are probed through one merged key
# index (GenerationIndexExec) rather than one by one behind their bloom filters.
MERGED_INDEX_KEYS = 64
# A region whose generations were probed this many times behind their bloom filters gets its
# merged key index too: a bloom test per generation costs more than one probe of the merged
# index once the same generations are looked up again and again.
HOT_REGION_LOOKUPS = 3


class LookupPlan(PlanExec):
    """A point lookup: the snapshot it reads and the node tree (:class:`PointLookupExec`);
    ``residual``, the rest of a pushed filter, applies to the rows found."""

    name = "LookupPlan"
    title = "MemWAL point lookup"

    def __init__(
        self,
        snapshot: ReadSnapshot,
        root: PointLookupExec,
        indexed: IndexedRead | None = None,
        residual: Predicate | None = None,
    ) -> None:
        super().__init__(snapshot, root, residual)
        self.root: PointLookupExec = root
        self.indexed = indexed

    @property
    def keys(self) -> pa.Table:
        return self.root.keys

    @property
    def base(self) -> BaseSourceExec:
        return self.root.base

    def header(self) -> list[str]:
        lines = super().header()
        return lines if self.indexed is None else [*lines, self.indexed.describe()]


def plan_lookup(
    snapshot: ReadSnapshot,
    store: ObjectStore,
    spec: RegionSpec | None,
    keys: pa.Table,
    residual: Predicate | None = None,
    *,
    tombstones: bool = False,
) -> LookupPlan:
    """Build the lookup plan of ``keys`` (a table of the primary-key columns); ``residual``
    filters the rows found. With ``tombstones``, a deleted key's newest version is its
    tombstone (``_tombstone`` true), not no row.

    Example:
        ``plan_lookup(take_read_snapshot(tbl), tbl.store, tbl.region_spec, pa.table({"id": [1]}))``
    """
    pk = list(snapshot.primary_key)
    keys = distinct_keys(keys.select(pk))
    if keys.num_rows > 64:
        # Every source probes them in key order (KeySet sorts them for its cache-friendly
        # search): sorted once here, each of those sorts runs over sorted input.
        keys = keys.sort_by([(k, "ascending") for k in pk])
    base = base_leaf(snapshot, Lookup(tuple(pk)))
    # Probed through its btree, the base table stays on the index while it catches up: the
    # generations of the gap are probed like newer ones and the base only where it is indexed.
    indexed = None if base.uses_key_index(keys.num_rows) else plan_indexed_read(snapshot, pk[:1])
    if indexed is not None:
        base = base_leaf(snapshot, Lookup(tuple(pk), tuple(indexed.fragment_ids)))
    regions = region_lookups(
        snapshot, store, spec, keys, indexed.gap if indexed is not None else None
    )
    root = PointLookupExec(keys, regions, base, tombstones=tombstones)
    return LookupPlan(snapshot, root, indexed=indexed, residual=residual)


def region_lookups(
    snapshot: ReadSnapshot,
    store: ObjectStore,
    spec: RegionSpec | None,
    keys: pa.Table,
    gap: Mapping[str, Sequence[GenerationRef]] | None = None,
    *,
    versions: bool = False,
) -> list[CoalesceFirstExec]:
    """Per region, the node that finds the newest version (tombstones included) of each of
    ``keys`` the region holds: its MemTables, then its generations newest first (and the
    ``gap`` generations of an indexed read), each key routed to its region when the spec
    allows, else asked of every region. With ``versions``, the nodes give each key's
    version (:func:`~exec_nodes.source.version_schema`), not its row.

    Example:
        ``[r.to_table() for r in region_lookups(snap, tbl.store, tbl.region_spec, keys)]``
    """
    pk = list(snapshot.primary_key)
    schema = snapshot.source_schema
    if versions:
        schema = version_schema(schema, pk)
    caches = snapshot.caches
    routable = (
        spec is not None
        and bool(spec.fields)
        and spec.routes_by_key(pk)
        and all(
            f.transform_impl.evaluable_in_callbacks(
                [keys.schema.field(c).type for c in f.source_columns]
            )
            for f in spec.fields
        )
    )
    by_values: dict[tuple[Any, ...], pa.Table] = {}
    if routable:
        assert spec is not None
        for values, idx in spec.group_rows(keys.select(pk)).items():
            by_values[tuple(values)] = keys.take(pa.array(idx))
    regions = []
    access = Lookup(tuple(pk), versions=versions)
    for region in snapshot.regions:
        routed = routable and region.region_values is not None
        if routed:
            assert region.region_values is not None
            region_keys = by_values.get(tuple(region.region_values))
            if region_keys is None:
                continue
        else:
            region_keys = keys  # cannot route: this region may hold any key
        children: list[KeyedExec] = list(memtable_leaves(snapshot, region, access))
        extra = gap.get(region.region_id, ()) if gap else ()
        gens = generation_leaves(snapshot, region, access, extra)
        if len(gens) > 1 and _merged_index_pays(gens, region_keys.num_rows, caches):
            children.append(GenerationIndexExec(gens, pk, schema, caches=caches))
        else:  # a few keys: a bloom test per generation rules most of them out cheaper
            if HASH not in region_keys.column_names:
                # Hash each key once for every bloom filter it meets (the keys that no
                # routing narrowed are shared by the regions: hashed once for all).
                hashed = region_keys.append_column(
                    HASH, pa.array(pk_hashes(region_keys.select(pk)))
                )
                if region_keys is keys:
                    keys = hashed
                region_keys = hashed
            for take in gens:
                rel = take.uri[len(store.uri) + 1 :] if take.uri.startswith(store.uri) else take.uri
                children.append(BloomFilterGuardExec(take, store, f"{rel}/{BLOOM_FILTER}"))
        if children:
            regions.append(
                CoalesceFirstExec(
                    children,
                    pk,
                    schema,
                    keys=region_keys,
                    label=f"region {region.region_id[:8]}",
                    region_id=region.region_id,
                    routed=routed,
                )
            )
    return regions


def _merged_index_pays(gens: Sequence[GenerationSourceExec], keys: int, caches: Caches) -> bool:
    """Whether to probe ``gens`` through their merged key index (built on first use) rather
    than one bloom filter each."""
    if keys >= MERGED_INDEX_KEYS or GenerationIndexExec.is_cached(gens, caches):
        return True
    # Counted in the lookup cache: bounded like it, and forgotten with it.
    key = GenerationIndexExec.cache_key(gens)
    count = caches.lookup.get("bloom_lookups", key, lambda: ([0], 64))
    count[0] += 1
    return count[0] > HOT_REGION_LOOKUPS


def _pinned_values(term: Predicate) -> tuple[str, pa.Array] | None:
    """(column, values) when ``term`` is ``c = v``, ``c IN (...)`` or an OR of those on one
    column (DataFusion rewrites a short ``IN`` list as such an OR)."""
    if isinstance(term, Compare) and term.op == "=":
        return term.column, pa.array([term.value])
    if isinstance(term, InList):
        return term.column, term.values
    if isinstance(term, Or):
        parts = [_pinned_values(c) for c in term.children]
        if all(p is not None for p in parts) and len({p[0] for p in parts}) == 1:  # type: ignore[index]
            return parts[0][0], pa.concat_arrays([p[1] for p in parts])  # type: ignore[index]
    return None


def lookup_keys(
    predicate: Predicate | None,
    primary_key: Sequence[str],
    schema: pa.Schema,
    max_keys: int = MAX_SQL_LOOKUP_KEYS,
) -> tuple[pa.Table, Predicate | None] | None:
    """The key set a filter pins down and the rest of the filter (None when the keys are all
    of it), or None when the filter is not a point lookup.

    A filter pins keys when its top-level AND has ``pk = v`` or ``pk IN (...)`` for every
    primary-key column (for a composite key, every combination of the listed values); the
    other terms are applied to the looked-up rows.

    Example:
        >>> s = pa.schema([("id", pa.int64())])
        >>> keys, rest = lookup_keys(InList("id", pa.array([3, 1, 3])), ["id"], s)
        >>> keys.to_pydict(), rest
        ({'id': [3, 1, 3]}, None)
    """
    values: dict[str, pa.Array] = {}
    rest: list[Predicate] = []
    for term in conjuncts(predicate):
        pinned = _pinned_values(term)
        if pinned is not None and pinned[0] in primary_key and pinned[0] not in values:
            values[pinned[0]] = pinned[1]
        else:
            rest.append(term)
    if set(values) != set(primary_key):
        return None
    sizes = [len(values[k]) for k in primary_key]
    if int(np.prod(sizes, dtype=np.float64)) > max_keys:
        return None
    # Every combination: column i repeats each value prod(sizes[i+1:]) times, tiled.
    columns = {}
    for i, k in enumerate(primary_key):
        inner, outer = int(np.prod(sizes[i + 1 :])), int(np.prod(sizes[:i]))
        index = np.tile(np.repeat(np.arange(sizes[i]), inner), outer)
        columns[k] = values[k].take(pa.array(index, pa.int64())).cast(schema.field(k).type)
    residual = None if not rest else rest[0] if len(rest) == 1 else And(tuple(rest))
    return pa.table(columns), residual
