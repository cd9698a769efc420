"""The change feed: what changed between two pinned snapshots (``tbl.changes``).

Every write reaches its region's WAL, in order, at consecutive positions, and a pinned snapshot
records how far each region's WAL reached. So the writes between snapshots ``a`` and ``b`` are
the WAL entries after ``a``'s position up to ``b``'s, per region: no table scan, and merges and
compaction, which move rows without writing the WAL, are no changes. Garbage collection keeps
those entries while it keeps ``a``: they belong to generations newer than any ``a`` reads.

A change row is the table's columns plus Delta's change-feed columns:

* ``_change_type``: ``insert``, ``update_preimage``, ``update_postimage`` or ``delete`` (a
  delete's row is the row it deleted);
* ``_commit_position``: the write's WAL position and its row in the entry
  (``position << 28 | row``), orderable among the changes of a key (a key lives in one
  region; positions of different regions are not comparable).

``mode="net"`` gives, per key written in ``(a, b]``, its row at ``a`` (if any) and at ``b`` (if
any); ``mode="all"`` gives every write in order, each judged against the key's row just before
it. The rows at ``a`` come from one lookup of the written keys as of ``a``.

Example:
    ``a = tbl.snapshot(); tbl.upsert(rows); tbl.changes(a)  # an insert or update per key``
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.errors import (
    InvalidInputError,
    InvalidSnapshotError,
    MissingWalEntryError,
    SnapshotExpiredError,
)
from memwal_sql.formats.source_rows import FOUND
from memwal_sql.formats.wal import TOMBSTONE, conform_batch, read_wal_range
from memwal_sql.read_snapshot import PinnedSnapshot
from memwal_sql.reads import TableReads

CHANGE_TYPE = "_change_type"
COMMIT_POSITION = "_commit_position"
ChangeMode = Literal["net", "all"]
_ROW_BITS = 28  # a WAL entry's rows: fewer than 2^28; positions: below 2^35
_POS = "__position"


def change_feed(
    reads: TableReads, start: PinnedSnapshot, end: PinnedSnapshot, mode: ChangeMode = "net"
) -> pa.Table:
    """The changes from ``start`` to ``end`` (see the module docstring).

    Example:
        ``change_feed(tbl._reads, a, b, "all")``
    """
    if mode not in ("net", "all"):
        raise InvalidInputError(f"mode is 'net' or 'all', not {mode!r}")
    table = reads.table
    pk = list(table.primary_key)
    writes = _writes(start, end)
    out_schema = pa.schema(
        [*table.schema, pa.field(CHANGE_TYPE, pa.string()), pa.field(COMMIT_POSITION, pa.int64())]
    )
    if writes.num_rows == 0:
        return out_schema.empty_table()
    writes = writes.take(
        pc.sort_indices(writes, [*((k, "ascending") for k in pk), (_POS, "ascending")])
    )
    n = writes.num_rows
    first = np.ones(n, dtype=bool)  # the first write of its key
    if n > 1:
        same = np.ones(n - 1, dtype=bool)
        for k in pk:
            col = writes.column(k)
            same &= pc.equal(col.slice(1), col.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        first[1:] = ~same
    group = np.cumsum(first) - 1  # each write's key, numbered in key order
    before = reads.lookup(writes.filter(pa.array(first)).select(pk), None, start, False, True)
    found = before.column(FOUND).to_numpy(zero_copy_only=False).astype(bool)
    rows = _in(writes, table.schema)  # each write's row (a delete's: its key)
    tomb = writes.column(TOMBSTONE).to_numpy(zero_copy_only=False).astype(bool)
    position = writes.column(_POS).to_numpy()
    # Every row a change may show: the keys' rows at `start`, then the writes.
    pool = pa.concat_tables([_in(before, table.schema), rows])
    n_before = before.num_rows
    if mode == "all":
        # The row just before each write: the previous write of its key, else its row at start.
        prev_index = np.where(first, group, n_before + np.arange(n) - 1)
        prev_present = np.where(first, found[group], ~np.roll(tomb, 1))
        post_index, pre_index, live_after, had_before = (
            n_before + np.arange(n),
            prev_index,
            ~tomb,
            prev_present,
        )
        at = position
    else:
        last = np.ones(n, dtype=bool)
        last[:-1] = first[1:]
        post_index = n_before + np.flatnonzero(last)
        pre_index = group[last]
        live_after, had_before = ~tomb[last], found[group[last]]
        at = position[last]
    pieces = [
        (pre_index[had_before & live_after], "update_preimage", at[had_before & live_after], 0),
        (post_index[had_before & live_after], "update_postimage", at[had_before & live_after], 1),
        (post_index[~had_before & live_after], "insert", at[~had_before & live_after], 1),
        (pre_index[had_before & ~live_after], "delete", at[had_before & ~live_after], 1),
    ]
    taken = []
    order = []
    for index, kind, positions, rank in pieces:
        if len(index) == 0:
            continue
        part = pool.take(pa.array(index))
        part = part.append_column(CHANGE_TYPE, pa.array([kind] * len(index), pa.string()))
        taken.append(part.append_column(COMMIT_POSITION, pa.array(positions, pa.int64())))
        order.append(np.stack([positions, np.full(len(index), rank)]))
    if not taken:
        return out_schema.empty_table()
    result = pa.concat_tables(taken)
    keys = np.concatenate(order, axis=1)
    return result.take(pa.array(np.lexsort((keys[1], keys[0])))).cast(out_schema)


def _writes(start: PinnedSnapshot, end: PinnedSnapshot) -> pa.Table:
    """Every write from ``start`` to ``end``: the WAL rows, with ``__position``."""
    table = end.table
    for rc in start.cut.regions:
        later = end.cut.region(rc.region_id)
        if start.base_version > end.base_version or (
            later is None or later.wal_position < rc.wal_position
        ):
            raise InvalidSnapshotError(
                f"the start snapshot is newer than the end one (region {rc.region_id} is at WAL "
                f"position {rc.wal_position}, then at {later.wal_position if later else 0}): "
                "give the older first"
            )
    batches: list[pa.RecordBatch] = []
    schema = pa.schema([*table.wal_schema, pa.field(_POS, pa.int64())])
    for rc in end.cut.regions:
        after = start.cut.wal_position_of(rc.region_id)
        if rc.wal_position == after:
            continue
        try:
            entries = table.store.run_io(
                f"reading the changes of region {rc.region_id}",
                lambda rc=rc, after=after: read_wal_range(  # type: ignore[misc]
                    table.store, rc.region_id, after, rc.wal_position
                ),
            )
        except MissingWalEntryError as e:
            raise SnapshotExpiredError(
                f"the changes of region {rc.region_id} from WAL position {after} on were "
                f"collected ({e}): the start snapshot is older than the retention "
                "(base_versions_older_than); tag snapshots a change feed starts from"
            ) from e
        for entry in entries:
            if entry.is_sentinel:
                continue
            offset = 0
            for b in entry.batches:
                b = conform_batch(b, table.wal_schema)
                rows = np.arange(offset, offset + b.num_rows, dtype=np.int64)
                if b.num_rows and rows[-1] >= 1 << _ROW_BITS:
                    raise InvalidInputError(
                        f"WAL entry {entry.position} of region {rc.region_id} holds more than "
                        f"2^{_ROW_BITS} rows: too many to number in a change feed"
                    )
                positions = (entry.position << _ROW_BITS) | rows
                batches.append(b.append_column(_POS, pa.array(positions, pa.int64())))
                offset += b.num_rows
    return pa.Table.from_batches(batches, schema=schema)


def _in(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows``' columns of ``schema``, in its order and types."""
    return pa.table([rows.column(f.name).cast(f.type) for f in schema], schema=schema)


__all__: Sequence[str] = ["CHANGE_TYPE", "COMMIT_POSITION", "ChangeMode", "change_feed"]
