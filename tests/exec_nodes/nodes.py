"""Hand-built inputs the exec-node tests share: a small table's schemas, rows, and the
contract every node keeps."""

from __future__ import annotations

import pyarrow as pa

from exec_nodes.base import ExecNode
from exec_nodes.base_source import BaseSourceExec
from exec_nodes.source import Scan
from memwal_sql.formats.source_rows import (
    TOMBSTONE,
    source_schema,
)
from memwal_sql.structures.cache import Caches

BASE = pa.schema(
    [pa.field("id", pa.int64(), False), pa.field("v", pa.string()), pa.field("f", pa.float64())]
)
WAL = pa.schema([*BASE, pa.field(TOMBSTONE, pa.bool_())])
SOURCE = source_schema(WAL)

#: The caches the node tests share (a table owns its own; these nodes are built by hand).
CACHES = Caches()


def wal_rows(ids, v, dead=None, f=None):
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "v": [v] * n,
            "f": f if f is not None else [float(i) for i in ids],
            TOMBSTONE: dead if dead is not None else [False] * n,
        },
        schema=WAL,
    )


def check_contract(node: ExecNode, want_rows: int | None = None) -> pa.Table:
    """What every node promises: batches of exactly its schema in every partition, and a
    tree it can explain."""
    assert node.partitions >= 1
    batches = [b for p in range(node.partitions) for b in node.execute(p)]
    assert all(b.schema.equals(node.schema) for b in batches), node.name
    lines = node.explain().splitlines()
    assert lines[0].lstrip().startswith(node.name)
    assert len(lines) >= 1 + len(node.children)
    table = pa.Table.from_batches(batches, schema=node.schema)
    if want_rows is not None:
        assert table.num_rows == want_rows
    return table


def base_scan(dataset, columns, predicate, ranges=None, in_memory=False) -> BaseSourceExec:
    """The base table's leaf scanning ``columns`` (and ``_rowaddr``) where ``predicate``
    holds, optionally only row ``ranges``; ``in_memory``: over its fragments kept whole."""
    scan = Scan(
        tuple(columns), predicate, None if ranges is None else tuple(ranges), None, in_memory
    )
    return BaseSourceExec(dataset, SOURCE if in_memory else dataset.schema, scan, caches=CACHES)
