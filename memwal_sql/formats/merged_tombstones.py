"""The merged deletes of a table with a sequence column: each deleted key and its sequence.

A merge removes a deleted key's base row, and with it the only record that the key was deleted,
and at which sequence. An upsert that arrives later carrying an older sequence must stay deleted
(the sequence column's promise; Paimon and Delta keep it only until compaction), so the merger
appends the key and sequence of every delete it merges to a Lance dataset under
``_mem_wal/merged_tombstones`` *before* it commits the base table. A merge that fails between the
two leaves tombstones its generations still hold: a key's sequence only grows, so a tombstone
recorded early changes no decision. Appends commute, so concurrent mergers never conflict here;
a key may be recorded more than once, and its highest sequence is the one that counts.

Only writes read it (for the keys they write), never scans: the base table no longer holds
these keys, and Lance's readers, which ignore this dataset, read the table correctly.

Example:
    ``append_merged_tombstones(uri, pa.table({"id": [3], "ts": [17]}), None)``
"""

from __future__ import annotations

from collections.abc import Mapping

import lance
import pyarrow as pa

from memwal_sql.compat.lance import is_not_found


def append_merged_tombstones(
    uri: str, tombstones: pa.Table, storage_options: Mapping[str, str] | None
) -> None:
    """Record ``tombstones`` (the key columns and the sequence column) at ``uri``.

    Example:
        ``append_merged_tombstones(uri, dead.select(["id", "ts"]), tbl.storage_options)``
    """
    if not tombstones.num_rows:
        return
    opts = dict(storage_options) if storage_options else None
    exists = read_merged_tombstones(uri, storage_options, known_version=-1)[0] > 0
    try:
        lance.write_dataset(
            tombstones, uri, mode="append" if exists else "create", storage_options=opts
        )
    except (OSError, ValueError):
        if exists or read_merged_tombstones(uri, storage_options, known_version=-1)[0] == 0:
            raise
        # Another merger created it first.
        lance.write_dataset(tombstones, uri, mode="append", storage_options=opts)


def read_merged_tombstones(
    uri: str, storage_options: Mapping[str, str] | None, known_version: int | None = None
) -> tuple[int, pa.Table | None]:
    """The latest version of the tombstones at ``uri`` (0 if none were ever merged) and their
    rows, or ``None`` for the rows when that version is ``known_version`` (the caller has them;
    -1 asks for the version only).

    Example:
        ``version, rows = read_merged_tombstones(uri, None, known_version=last_version)``
    """
    try:
        ds = lance.dataset(uri, storage_options=dict(storage_options) if storage_options else None)
    except (OSError, ValueError) as e:
        if is_not_found(e):
            return 0, None
        raise
    if known_version in (ds.version, -1):
        return ds.version, None
    return ds.version, ds.to_table()
