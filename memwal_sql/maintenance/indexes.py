"""The base-table index builder: bring every index over the merged rows.

Merges add rows the base table's indexes (primary-key btree, vector, full-text) do not cover;
until they are optimized, reads of those rows go through the gap generations
(:mod:`planner.indexed`) and the garbage collector keeps the generations. Each pass optimizes the
indexes that lag (Lance's ``optimize_indices``: the new rows go into the index). A btree gets
the new rows as a delta segment of its own instead of being rewritten: rewriting it on every
pass left a whole copy of it per pass for the retention window to keep (docs/maintenance.md#retention),
more than the table itself over an hour of ten-minute passes. Once :data:`BTREE_SEGMENTS` segments
gathered, the deltas are merged into one (all but the oldest segment, which holds the rows from
before: compaction rewrites that one anyway when it remaps the index). Lance compacts no two
fragments that different segments cover, so compaction first merges the deltas too
(:func:`merge_btree_segments`). Lance 14 records
the catch-up progress (``index_catchup`` in the MemWAL index details) in that same commit; our
readers and the garbage collector derive it from what each index covers instead
(:mod:`memwal_sql.formats.index_catchup`), which stays exact even for an index rebuilt by other means.

When Lance fails, each lagging index is tried on its own, so one cannot hold the others back.
A vector index whose new rows all have NULL vectors is one Lance 14 cannot optimize (it looks
for IVF partition files it never wrote): it is committed as covering them without adding a row
(:func:`~memwal_sql.formats.lance_manifest.cover_fragments`), which is exact, as a NULL vector
never matches a search. One whose new rows hold a vector no index can place (written before
vectors were checked at write: :func:`~memwal_sql.writer.rows.unusable_vectors`) stays behind,
and :class:`~memwal_sql.errors.IndexCatchupError` names the row.

Example:
    ``catch_up_indexes(tbl).caught_up  # {"id_pk_btree": {"<region id>": 7}}``
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memwal_sql._proto.memwal_pb2 import MemWalIndexDetails
from memwal_sql.compat.lance import is_commit_conflict
from memwal_sql.errors import IndexCatchupError
from memwal_sql.formats.index_catchup import index_coverage
from memwal_sql.formats.lance_manifest import cover_fragments
from memwal_sql.formats.memwal_index import region_generations
from memwal_sql.writer.rows import is_vector_type, unusable_vectors

if TYPE_CHECKING:
    import lance

    from memwal_sql.table_state import TableState

#: Segments a btree gathers before a catch-up merges its delta segments into one. Each is probed
#: on a lookup, and a merge rewrites all but the oldest, which is small between compactions.
BTREE_SEGMENTS = 8


@dataclass
class CatchupResult:
    """What one index catch-up pass did."""

    optimized: list[str] = field(default_factory=list)  # indexes that lagged and were optimized
    caught_up: dict[str, dict[str, int]] = field(default_factory=dict)  # index -> region -> gen
    seconds: float = 0.0


def catch_up_indexes(table: TableState) -> CatchupResult:
    """Optimize every base-table index that does not cover all merged rows; if one of them
    cannot be, the others still are, then :class:`IndexCatchupError` names it and why.

    Example:
        ``tbl.merge(); catch_up_indexes(tbl).optimized``
    """
    t0 = time.perf_counter()
    result = CatchupResult()
    ds = table.dataset()
    behind = [c.name for c in index_coverage(table.store, ds) if not c.complete]
    problems: list[str] = []
    try:
        if behind:
            _optimize(ds, behind)
    except (OSError, ValueError, RuntimeError) as e:
        if is_commit_conflict(e):
            raise
        for name in behind:  # one at a time: one Lance cannot optimize holds none back
            problem = _catch_up_one(table, name)
            if problem is None:
                result.optimized.append(name)
            else:
                problems.append(problem)
    else:
        result.optimized = behind
    result.caught_up = {
        c.name: dict(c.caught_up)
        for c in index_coverage(table.store, table.dataset())
        if c.caught_up is not None
    }
    result.seconds = time.perf_counter() - t0
    if problems:
        raise IndexCatchupError(
            f"{len(problems)} index(es) of {table.uri} could not be caught up "
            f"({', '.join(result.optimized) or 'none'} could): " + "; ".join(problems)
        )
    return result


def _catch_up_one(table: TableState, name: str) -> str | None:
    """Bring index ``name`` over the merged rows; None when done, else what stops it."""
    ds = table.dataset()
    coverage = next((c for c in index_coverage(table.store, ds) if c.name == name), None)
    if coverage is None or coverage.complete:
        return None  # dropped, or caught up by someone else meanwhile
    try:
        _optimize(ds, [name])
        return None
    except (OSError, ValueError, RuntimeError) as e:
        if is_commit_conflict(e):
            raise
        failure = e
    column = coverage.columns[0]
    if len(coverage.columns) != 1 or not is_vector_type(table.schema.field(column).type):
        return f"{name}: {failure}"
    uncovered = [f for f in ds.get_fragments() if f.fragment_id not in coverage.fragment_ids]
    rows = ds.scanner(
        columns=[*table.primary_key, column], fragments=uncovered, with_row_address=True
    ).to_table()
    vectors = rows.column(column)
    if vectors.null_count == len(vectors):  # nothing to index, which Lance 14 cannot do
        cover_fragments(ds, table.store, name, [f.fragment_id for f in uncovered])
        return None
    bad = unusable_vectors(vectors)
    if bad is None:
        return f"{name}: {failure}"
    row, why = bad
    key = {k: rows.column(k)[row].as_py() for k in table.primary_key}
    fragment = rows.column("_rowaddr")[row].as_py() >> 32
    return (
        f"{name}: the vector of key {key} (base fragment {fragment}) {why}, which no index "
        f"can place; upsert that key with a usable vector, or NULL, and maintain again"
    )


def _optimize(ds: lance.LanceDataset, names: list[str]) -> None:
    """Bring indexes ``names`` over the rows they lack: btrees by a delta segment (merging the
    deltas once :data:`BTREE_SEGMENTS` gathered), the others as Lance optimizes them."""
    segments = {d.name: len(d.segments) for d in ds.describe_indices() if d.index_type == "BTree"}
    others = [n for n in names if n not in segments]
    if others:
        ds.optimize.optimize_indices(index_names=others)
    for name in names:
        if name in segments:
            n = segments[name]
            ds.optimize.optimize_indices(
                index_names=[name], num_indices_to_merge=n - 1 if n >= BTREE_SEGMENTS else 0
            )


def merge_btree_segments(table: TableState, *, keep_oldest: bool) -> list[str]:
    """Merge each btree's segments into one (``keep_oldest``: its delta segments into one,
    leaving the oldest), as compaction bins only fragments one segment covers; the names of
    the btrees merged.

    Example:
        ``merge_btree_segments(tbl, keep_oldest=True)  # ["id_pk_btree"]``
    """
    ds = table.dataset()
    keep = 2 if keep_oldest else 1
    merged = []
    for d in ds.describe_indices():
        if d.index_type == "BTree" and len(d.segments) > keep:
            ds.optimize.optimize_indices(
                index_names=[d.name], num_indices_to_merge=len(d.segments) - keep + 1
            )
            merged.append(d.name)
    return merged


def recorded_catchup(details: MemWalIndexDetails) -> dict[str, dict[str, int]]:
    """``index_catchup`` of the details: index name -> region id -> generation."""
    return {
        p.index_name: region_generations(p.caught_up_generations) for p in details.index_catchup
    }
