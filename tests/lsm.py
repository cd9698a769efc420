"""Test helpers: read a MemWAL table through Lance 14's own LsmScanner, and a dict model."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import lance
import pyarrow as pa
from lance.mem_wal import LsmScanner, ShardSnapshot


@contextlib.contextmanager
def cache_budget(max_bytes: int) -> Iterator[None]:
    """The process default caches (what tables opened without ``cache=`` share) limited to
    ``max_bytes`` (0: off) inside the block."""
    from memwal_sql.structures.cache import default_caches

    caches = default_caches()
    saved = caches.max_bytes
    caches.max_bytes = max_bytes
    try:
        yield
    finally:
        caches.max_bytes = saved


def lance_snapshots(uri: str, storage_options: dict | None = None) -> list[ShardSnapshot]:
    """Snapshots of every region's flushed generations, read from the region manifests."""
    import memwal_sql as mw
    from memwal_sql.interop import lance_shard_snapshots

    return lance_shard_snapshots(mw.open_table(uri, storage_options))


def lance_latest_rows(
    uri: str, primary_key: list[str], storage_options: dict | None = None
) -> pa.Table:
    """Latest row per key as Lance's LsmScanner reads the base table + flushed generations."""
    ds = lance.dataset(uri, storage_options=storage_options)
    out = LsmScanner.from_snapshots(ds, lance_snapshots(uri, storage_options)).to_table()
    out = out.select(list(ds.schema.names))
    return out.sort_by([(k, "ascending") for k in primary_key])


class Model:
    """The reference: a dict of key -> latest row."""

    def __init__(self, primary_key: list[str]) -> None:
        self.primary_key = primary_key
        self.rows: dict[Any, dict] = {}

    def key(self, row: dict) -> Any:
        return tuple(row[k] for k in self.primary_key)

    def upsert(self, table: pa.Table) -> None:
        for row in table.to_pylist():
            self.rows[self.key(row)] = row

    def delete(self, keys: pa.Table) -> None:
        for row in keys.to_pylist():
            self.rows.pop(self.key(row), None)

    def table(self, schema: pa.Schema) -> pa.Table:
        rows = [self.rows[k] for k in sorted(self.rows)]
        return pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()


def seeded_table(
    uri: str, rows: pa.Table, key: str, *, buckets: int | None, max_memtable_rows: int
) -> tuple[Any, Model]:
    """A table whose base holds ``rows`` (bucketed on ``key`` when ``buckets``), and its model."""
    import memwal_sql as mw

    tbl = mw.create_table(
        uri,
        rows,
        primary_key=key,
        region_spec=mw.RegionSpec.bucket(key, buckets) if buckets else None,
        writer_config=mw.WriterConfig(max_memtable_rows=max_memtable_rows),
    )
    model = Model([key])
    model.upsert(rows)
    return tbl, model


def op_sequences(max_key: int, max_keys: int, others: list[str]) -> Any:
    """A hypothesis strategy of (op, keys, seed) lists for :func:`apply_op`: upserts and deletes
    of up to ``max_keys`` distinct keys in ``[0, max_key]``, and the key-less ``others``."""
    from hypothesis import strategies as st

    keys = st.lists(st.integers(0, max_key), min_size=1, max_size=max_keys, unique=True)
    return st.lists(
        st.one_of(
            st.tuples(st.just("upsert"), keys, st.integers(0, 99)),
            st.tuples(st.just("delete"), keys, st.just(0)),
            st.tuples(st.sampled_from(others), st.just([]), st.just(0)),
        ),
        min_size=1,
        max_size=20,
    )


def layered_table(
    uri: str,
    batch: Any,
    *,
    base: list,
    width: int,
    step: int,
    deletes: list,
    storage_options: dict | None = None,
) -> tuple[Any, Model]:
    """A table bucketed into two regions with ``base`` keys in the base table, three flushed
    upserts of ``width`` keys every ``step``, then a flushed delete of ``deletes``; and its
    model. ``batch(keys, tag)`` makes the rows."""
    import memwal_sql as mw

    tbl = mw.create_table(
        uri,
        batch(base, "base"),
        primary_key="k",
        region_spec=mw.RegionSpec.bucket("k", 2),
        storage_options=storage_options,
    )
    model = Model(["k"])
    model.upsert(batch(base, "base"))
    for i in range(3):
        rows = batch(list(range(i * step, i * step + width)), f"g{i}-")
        tbl.upsert(rows)
        model.upsert(rows)
        tbl.flush()
    tbl.delete(deletes)
    model.delete(pa.table({"k": deletes}))
    tbl.flush()
    return tbl, model


def apply_op(
    tbl: Any,
    model: Model,
    op: str,
    keys: list,
    seed: int,
    uri: str,
    batch: Any,
    *,
    delete_columns: list[str] | None = None,
) -> Any:
    """Apply one generated operation to a table and the model; returns the table to go on with
    (a new handle after "reopen"). Deletes pass ``delete_columns`` of ``batch(keys, 0)``."""
    from datetime import timedelta

    import memwal_sql as mw

    if op == "upsert":
        tbl.upsert(batch(keys, seed))
        model.upsert(batch(keys, seed))
    elif op == "delete":
        rows = batch(keys, 0)
        tbl.delete(rows.select(delete_columns or model.primary_key))
        model.delete(rows.select(model.primary_key))
    elif op == "flush":
        tbl.flush()
    elif op == "crash":
        # Stop the writers as a dying process would: no MemTable flush, but buffered
        # non-durable WAL writes stored, because the model holds only acknowledged writes.
        for w in tbl.live_writers().values():
            w.release()
        tbl._writers.clear()
    elif op in ("close", "reopen"):  # a closed table takes no more writes: open it again
        tbl.close()
        return mw.open_table(
            uri, tbl.storage_options or None, writer_config=tbl.writer_config, cache=tbl.caches
        )
    elif op == "merge":
        tbl.merge()
    elif op == "gc":
        tbl.gc(base_versions_older_than=timedelta(0), keep_manifest_versions=2)
    elif op == "compact":  # every deletion vector materialized, small fragments merged
        tbl.compact(deletion_threshold=0.0)
    elif op == "catchup":
        tbl.catch_up_indexes()
    elif op == "snapshot":
        tbl.build_region_snapshots()
    elif op == "reindex":  # an index rebuild: a new base version, rows at the same addresses
        key = model.primary_key[0]
        tbl.dataset().create_scalar_index(key, "BTREE", name=f"{key}_pk_btree", replace=True)
    else:
        raise ValueError(op)
    return tbl


def files_under(root: Any) -> set[str]:
    """Every file path under ``root``."""
    return {os.path.join(d, n) for d, _, names in os.walk(root) for n in names}


def record_fsyncs(monkeypatch: Any) -> set[str]:
    """Patch ``os.fsync`` to add the path of every file or directory it syncs to the returned
    set (undone with the monkeypatch)."""
    synced: set[str] = set()
    real = os.fsync

    def recording(fd: int) -> None:
        synced.add(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return synced


def apply_changes(
    before: pa.Table, changes: pa.Table, schema: pa.Schema, key: str = "id"
) -> pa.Table:
    """``before`` with a change feed (``tbl.changes``) applied in ``_commit_position`` order per
    key, checking each pre-image and delete against the row it names (in "all" mode, the row
    just before it); the rows in ``schema``, sorted by ``key``."""
    rows = {r[key]: r for r in before.to_pylist()}
    for change in sorted(changes.to_pylist(), key=lambda r: (r[key], r["_commit_position"])):
        kind = change.pop("_change_type")
        change.pop("_commit_position")
        k = change[key]
        if kind == "insert":
            assert k not in rows, change
            rows[k] = change
        elif kind == "update_preimage":
            assert rows.get(k) == change, change
        elif kind == "update_postimage":
            assert k in rows, change
            rows[k] = change
        else:
            assert kind == "delete", kind
            assert rows.pop(k) == change, change
    out = [rows[k] for k in sorted(rows)]
    return pa.Table.from_pylist(out, schema=schema) if out else schema.empty_table()
