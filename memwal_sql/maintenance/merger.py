"""The MemTable merger: fold flushed generations into the base table, in generation order.

Per region, the generations newer than the base table's recorded merge progress are merged, in
generation order, with one Lance merge-insert: the newest version of each key among them wins,
live rows are upserted, and base rows whose key is tombstoned are deleted ("not matched by
source" with a key predicate), in a single commit that also records ``merged_generations`` for
the region (Lance's ``mark_sstables_as_compacted``; the newest generation covers the older). Data
and progress land atomically, so a merger that crashes before the commit leaves nothing, and one
that crashes after it has recorded its work: the next merger skips the generation. Two mergers
racing on a generation: Lance rejects the second progress record as stale, and the loser re-reads
the progress and moves on (the seed spec's Appendix 2). A merger whose pending generations are a
superset of a concurrent one's passes that check (its marker is newer), so its inserts must
conflict with the other's on the key: Lance 14 checks inserted keys against concurrent commits
(the schema's unenforced primary key) only on the join path that scans the base table, so the
merge never takes the key-index path; the conflicting merge is then re-joined against the
latest base table by Lance's commit retry, which is harmless (its rows are the newest of every
generation it names, and a marker older than the recorded one is rejected). A separate delete pass would not be safe:
a slow merger's stale delete could remove a key a later generation re-inserted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from lance.mem_wal import CompactedSsTable

from exec_nodes.regions import OTHER_REGION, REGION, key_in_two_regions
from memwal_sql.compat.lance import is_commit_conflict
from memwal_sql.errors import CommitConflictError, InvalidInputError, UnknownRegionError
from memwal_sql.formats.generation import open_generation
from memwal_sql.formats.merged_tombstones import append_merged_tombstones
from memwal_sql.formats.region_manifest import RegionManifestStore, check_not_behind_index
from memwal_sql.formats.source_rows import conform
from memwal_sql.formats.wal import TOMBSTONE
from memwal_sql.maintenance.config import MaintenanceConfig
from memwal_sql.read_snapshot import region_values, take_read_snapshot
from memwal_sql.storage import layout
from memwal_sql.writer.memtable import latest_per_key
from planner.regions import keys_in_two_regions_of, regions_may_share_keys

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState

_ATTEMPTS = 8
_log = logging.getLogger(__name__)


@dataclass
class MergeResult:
    """What one merge pass did."""

    merged: dict[str, list[int]] = field(default_factory=dict)  # region -> generations
    rows_upserted: int = 0
    rows_deleted: int = 0
    conflicts: int = 0
    seconds: float = 0.0


def merge_region(
    table: TableState,
    region_id: str,
    *,
    max_generations: int | None = None,
    up_to: int | None = None,
    result: MergeResult | None = None,
) -> MergeResult:
    """Merge ``region_id``'s unmerged generations (up to generation ``up_to``) into the base
    table, oldest first.

    Example:
        ``merge_region(tbl, tbl.regions()[0]).merged``
    """
    result = result or MergeResult()
    t0 = time.perf_counter()
    manifests = RegionManifestStore(table.store, region_id)
    pk = list(table.primary_key)
    done = 0
    attempts = 0
    while max_generations is None or done < max_generations:
        ds = table.dataset()
        floor = table.merged_generations(ds).get(region_id, 0)
        manifest = manifests.latest()
        check_not_behind_index(region_id, manifest, floor)
        pending = sorted(
            (
                g
                for g in (manifest.flushed_generations if manifest else [])
                if floor < g.generation <= (up_to if up_to is not None else g.generation)
            ),
            key=lambda g: g.generation,
        )
        if not pending:
            break
        if max_generations is not None:
            pending = pending[: max_generations - done]
        # All pending generations of the region go in one commit (one scan of the base table):
        # concatenated oldest first, the newest version of each key wins, and the progress
        # marker names the newest generation, which covers the older ones.
        tables = []
        for gen in pending:
            uri = table.store.uri_for(f"{layout.region_dir(region_id)}/{gen.path}")
            # Verified first: damage must fail the merge, never be copied into the base table.
            tables.append(open_generation(uri, table.storage_options or None).to_table())
        rows = latest_per_key(pa.concat_tables(tables, promote_options="permissive"), pk)
        dead = rows.filter(rows.column(TOMBSTONE)) if TOMBSTONE in rows.column_names else None
        live = rows.filter(pc.invert(rows.column(TOMBSTONE))) if dead is not None else rows
        # In the base's schema, which a schema change may have widened since the generations
        # were written: a column they lack is NULL (an upsert replaces the whole row).
        live = conform(live, pa.schema(list(ds.schema)))
        seq = table.sequence_column
        if seq is not None and dead is not None and dead.num_rows:
            # Before the commit that deletes their base rows (formats/merged_tombstones.py).
            append_merged_tombstones(
                table.store.uri_for(layout.MERGED_TOMBSTONES),
                dead.select([*pk, seq]).filter(pc.is_valid(dead.column(seq))),
                table.storage_options,
            )
        builder = (
            ds.merge_insert(pk)
            # A sequence table's writes drop rows older than their key's current one, so a
            # generation never holds one; the condition keeps a row a writer that ignores the
            # sequence (Lance's own) put from replacing a newer base row.
            .when_matched_update_all(
                None if seq is None else f"source.{_sql_name(seq)} >= target.{_sql_name(seq)}"
            )
            .when_not_matched_insert_all()
            .use_index(False)  # the index path skips the inserted-key conflict check (above)
        )
        if dead is not None and dead.num_rows:
            # A tombstoned key is never among the live rows (they are deduplicated), so its base
            # row is "not matched by source" and this predicate selects it.
            builder = builder.when_not_matched_by_source_delete(sql_key_predicate(dead.select(pk)))
        try:
            builder.mark_sstables_as_compacted(
                [CompactedSsTable(region_id, pending[-1].generation)]
            ).execute(live)
        except OSError as e:
            if not is_commit_conflict(e):
                raise
            result.conflicts += 1
            attempts += 1
            if attempts >= _ATTEMPTS:
                raise CommitConflictError(
                    f"merging region {region_id} generations up to {pending[-1].generation} "
                    "kept conflicting "
                    "with other mergers; retry later"
                ) from e
            continue  # another merger got there first: re-read the progress
        result.rows_upserted += live.num_rows
        result.rows_deleted += dead.num_rows if dead is not None else 0
        result.merged.setdefault(region_id, []).extend(g.generation for g in pending)
        done += len(pending)
    result.seconds += time.perf_counter() - t0
    return result


def sql_key_predicate(keys: pa.Table) -> str:
    """A SQL predicate true for exactly the given keys (integer, string or binary columns).

    Example:
        >>> sql_key_predicate(pa.table({"k": [1, 2]}))
        'k IN (1, 2)'
        >>> sql_key_predicate(pa.table({"a": ["x"], "b": [3]}))
        "(a = 'x' AND b = 3)"
    """
    literals = [_sql_literals(keys.column(name).combine_chunks()) for name in keys.column_names]
    names = [_sql_name(n) for n in keys.column_names]
    if len(names) == 1:
        return f"{names[0]} IN ({', '.join(literals[0])})"
    return " OR ".join(
        "(" + " AND ".join(f"{n} = {v}" for n, v in zip(names, row)) + ")" for row in zip(*literals)
    )


def _sql_name(name: str) -> str:
    return name if name.isidentifier() and name.islower() else '"' + name.replace('"', '""') + '"'


def _sql_literals(col: pa.Array) -> list[str]:
    t = col.type
    if pa.types.is_integer(t):
        return pc.cast(col, pa.string()).to_pylist()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        quoted = pc.binary_join_element_wise("'", pc.replace_substring(col, "'", "''"), "'", "")
        return quoted.to_pylist()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return [f"X'{v.hex()}'" for v in col.to_pylist()]
    raise InvalidInputError(f"cannot merge deletes of a primary key of type {t}")


def merge_table(
    table: TableState,
    config: MaintenanceConfig | None = None,
    *,
    regions: Sequence[str] | None = None,
) -> MergeResult:
    """One merge pass over every region (or over ``regions``, in that order), of at most
    ``config.max_generations_per_region`` generations of each. The base
    table's indexes then lag behind the merged rows until
    :func:`~memwal_sql.maintenance.indexes.catch_up_indexes` runs (reads stay indexed
    meanwhile through the generations of the gap).

    A region holding an unmerged version of a key that another region holds too is not merged
    (whichever merged last would win): the other regions are, and then
    :class:`~memwal_sql.errors.KeyInTwoRegionsError` names the keys. Naming both regions in
    ``regions`` merges them in that order, so the last one's versions win: the repair when
    the order of their writes is known (their unflushed rows must be flushed first).

    Example:
        ``merge_table(tbl, regions=[older_region, newer_region]).merged``
    """
    config = config or MaintenanceConfig()
    result = MergeResult()
    # A region the index has merged from but whose directory is gone fails the pass loudly.
    known = sorted(set(table.regions()) | set(table.merged_generations()))
    order = known if regions is None else _named_regions(regions, known)
    check = _check_keys(table, order if regions is not None else ())
    for rid in order:
        if rid not in check.held:
            merge_region(
                table,
                rid,
                max_generations=config.max_generations_per_region,
                up_to=check.seen.get(rid, 0) if check.seen is not None else None,
                result=result,
            )
    _log.info(
        "merge of %s: %d generation(s) of %d region(s), %d rows upserted, %d deleted, "
        "%d conflict(s), %.2f s",
        table.uri,
        sum(len(g) for g in result.merged.values()),
        len(result.merged),
        result.rows_upserted,
        result.rows_deleted,
        result.conflicts,
        result.seconds,
    )
    if check.shared is not None and check.held:
        raise key_in_two_regions(check.shared, table.primary_key)
    return result


class _KeyCheck(NamedTuple):
    """What the merger's key check found (see :func:`_check_keys`)."""

    shared: pa.Table | None  # keys with unmerged versions in two regions
    held: set[str]  # regions not to merge for them
    seen: dict[str, int] | None  # per region, the newest generation checked (None: no check)


def _check_keys(table: TableState, named: Sequence[str]) -> _KeyCheck:
    """The keys with unmerged versions in two regions (see :mod:`planner.regions`); the
    regions that must not be merged for them: each such region, but where both of a key's
    regions are ``named`` (an ordered merge); and the newest generation of each region the
    check saw (one flushed after it waits for the next pass's check). A strong snapshot (every
    WAL tail) is read only where the spec lets two regions hold a key."""
    spec = table.region_spec
    if spec is not None and not regions_may_share_keys(
        spec,
        table.primary_key,
        (region_values(spec, rid, m) for rid, m in table.region_manifests()),
    ):
        return _KeyCheck(None, set(), None)
    snapshot = take_read_snapshot(table, "strong")
    seen = {
        r.region_id: max((g.generation for g in r.generations), default=0) for r in snapshot.regions
    }
    shared = keys_in_two_regions_of(snapshot, spec)
    if shared is None:
        return _KeyCheck(None, set(), seen)
    pairs = list(zip(shared.column(REGION).to_pylist(), shared.column(OTHER_REGION).to_pylist()))
    ordered = {r for a, b in pairs if {a, b} <= set(named) for r in (a, b)}
    unflushed = [r.region_id for r in snapshot.regions if r.unflushed and r.region_id in ordered]
    if unflushed:
        raise InvalidInputError(
            f"region(s) {', '.join(unflushed)} hold unflushed rows: an ordered merge of regions "
            "that share keys needs their versions flushed first (`with "
            "tbl.writer(region_id=...): pass` flushes a region); nothing was merged"
        )
    held = {r for a, b in pairs if not {a, b} <= set(named) for r in (a, b)}
    return _KeyCheck(shared, held, seen)


def _named_regions(regions: Sequence[str], known: Sequence[str]) -> list[str]:
    if isinstance(regions, str):
        raise InvalidInputError("regions is a list of region ids, not one string")
    out = [layout.region_id_of(r) for r in regions]
    unknown = [r for r in out if r not in known]
    if unknown:
        raise UnknownRegionError(f"no region {unknown[0]} in this table; its regions are {known}")
    return out


__all__ = ["MergeResult", "merge_region", "merge_table"]
