"""The deterministic write sequence of the crash tests, shared by the child and the checker."""

from __future__ import annotations

import pyarrow as pa

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])


def batch_for(i: int) -> tuple[str, pa.Table]:
    """Batch ``i``: mostly upserts over a small key space (so later batches update earlier keys),
    every fifth one a delete."""
    keys = [(i * 37 + j * 11) % 500 for j in range(40)]
    keys = list(dict.fromkeys(keys))
    if i % 5 == 4:
        return "delete", pa.table({"id": keys[:10]}, schema=pa.schema([SCHEMA.field("id")]))
    return "upsert", pa.table({"id": keys, "v": [f"b{i}-k{k}" for k in keys]}, schema=SCHEMA)


def apply_batch(state: dict[int, str], i: int) -> None:
    """Apply batch ``i`` to a key -> value ``state``."""
    kind, t = batch_for(i)
    if kind == "upsert":
        state.update(zip(t.column("id").to_pylist(), t.column("v").to_pylist()))
    else:
        for k in t.column("id").to_pylist():
            state.pop(k, None)


def model_after(n: int) -> dict[int, str]:
    """Latest value per key after batches 0..n-1."""
    state: dict[int, str] = {}
    for i in range(n):
        apply_batch(state, i)
    return state
