"""Test helpers: read a MemWAL table through Lance 14's own LsmScanner, and a dict model."""

from __future__ import annotations

from typing import Any

import lance
import pyarrow as pa
from lance.mem_wal import LsmScanner, ShardSnapshot



def lance_snapshots(uri: str, storage_options: dict | None = None) -> list[ShardSnapshot]:
    """Snapshots of every region's flushed generations, read from the region manifests."""
    import memwal_sql as mw
    from memwal_sql.interop import lance_shard_snapshots

    return lance_shard_snapshots(mw.open_table(uri, storage_options))


def lance_latest_rows(uri: str, primary_key: list[str], storage_options: dict | None = None) -> pa.Table:
    """Latest row per key as Lance's LsmScanner reads the base table + flushed generations."""
    ds = lance.dataset(uri, storage_options=storage_options)
    out = LsmScanner.from_snapshots(ds, lance_snapshots(uri, storage_options)).to_table()
    out = out.select([n for n in ds.schema.names])
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
