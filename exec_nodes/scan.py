"""Leaf scans: the base table, a flushed generation, a live MemTable, a WAL tail.

Every leaf below the base table yields rows of its source (base columns and ``_tombstone``)
tagged with ``_gen`` and ``_rowaddr``, optionally only some columns or only rows matching a
filter: deduplication reads the key columns of every row (it must see every newer version of a
key, whatever the filter) and, for a filtered query, only the matching rows in full. The base
table is the large one; it takes the projection and the filter directly in Lance, except for
a fragment with a deletion vector, which is read from its data file (see
:meth:`BaseScanExec._direct_file`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lance.file import LanceFileReader

from exec_nodes.base import ExecNode
from memwal_sql.compat.lance import row_addr_treemap, single_data_file, storage_options_of
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.expressions.substrait import lance_filter
from memwal_sql.expressions.visitors import evaluate, referenced_columns
from memwal_sql.formats.source_rows import (
    BASE_GENERATION,
    ROWADDR,
)
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.rowmask import RowMask, split_addresses


@dataclass(frozen=True)
class FragmentRange:
    """Rows ``start`` to ``end`` (physical offsets, end excluded) of base fragment
    ``fragment_id``; ``end=None`` means to the fragment's end."""

    fragment_id: int
    start: int = 0
    end: int | None = None

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end is None

    def __str__(self) -> str:
        if self.whole:
            return str(self.fragment_id)
        return f"{self.fragment_id}[{self.start}:{'' if self.end is None else self.end}]"


# Each base batch costs a trip through Lance's stream, the deletion mask and ``conform`` in
# Python, so small batches multiply that work (a narrow scan of TPC-H ``lineitem``,
# benchmarks/bench_tpch.py).
# No column asked (``count(*)``): only row addresses, which cost nothing to make.
_ROWS_BATCH = 1 << 15
_ADDRESSES_BATCH = 1 << 16
# Batches Lance's file reader decodes ahead: a few keep both cores busy, more only hold memory
# (a batch each; benchmarks/bench_tpch.py after tbl.maintain()).
_FILE_READAHEAD = 4


def _deleted_rows(
    dataset: lance.LanceDataset, fragment: lance.LanceFragment, caches: Caches
) -> RowMask:
    """The rows of ``fragment`` that its deletion vector deletes, kept in ``caches.deletions``
    (a deletion file never changes: a new one gets a new id). Found once from the row addresses
    Lance's scanner returns for the fragment, which skip them."""
    dv = fragment.metadata.deletion_file
    assert dv is not None
    fid, rows = fragment.fragment_id, fragment.physical_rows

    def load() -> tuple[RowMask, int]:
        live = (
            dataset.scanner(
                columns=[],
                with_row_address=True,
                fragments=[fragment],
                batch_size=_ADDRESSES_BATCH,
            )
            .to_table()
            .column(ROWADDR)
            .to_numpy()
        )
        deleted = np.ones(rows, dtype=bool)
        deleted[split_addresses(live)[1]] = False
        addresses = (np.uint64(fid) << np.uint64(32)) | np.flatnonzero(deleted).astype(np.uint64)
        mask = RowMask(addresses, {fid: rows})
        return mask, mask.nbytes + 64

    key = f"{dataset.uri}#{fid}#{dv.id}-{dv.read_version}"
    return caches.deletions.get("deletions", key, load)


class BaseScanExec(ExecNode):
    """The base table at a pinned version, with projection and filter pushed into Lance;
    optionally only some fragments, or row ranges of them (a big fragment is split so that
    partitions are even)."""

    name = "BaseScanExec"

    def __init__(
        self,
        dataset: lance.LanceDataset,
        columns: Sequence[str],
        predicate: Predicate | None,
        *,
        ranges: Sequence[FragmentRange] | None = None,
        batch_size: int | None = None,
        caches: Caches,
    ) -> None:
        self.caches = caches
        self.dataset = dataset
        self.columns = list(columns)
        self.predicate = predicate
        schema = dataset.schema  # Lance builds it anew on each access
        self.filter, self.exact = lance_filter(predicate, schema)
        self.ranges = None if ranges is None else list(ranges)
        self.batch_size = batch_size
        fields = [schema.field(c) for c in self.columns]
        self._schema = pa.schema([*fields, pa.field(ROWADDR, pa.uint64(), False)])

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def execute(self, partition: int = 0) -> Iterator[pa.RecordBatch]:
        parts: list[tuple[lance.LanceFragment, FragmentRange | None]] = []
        if self.ranges is None:
            parts = [(f, None) for f in self.dataset.get_fragments()]
        for r in self.ranges or []:
            fragment = self.dataset.get_fragment(r.fragment_id)
            # The planner splits this very version's fragments into partitions.
            assert fragment is not None, f"fragment {r} not in version {self.dataset.version}"
            parts.append((fragment, r))
        files = [self._direct_file(f) for f, _ in parts]
        rest = [p for p, uri in zip(parts, files) if uri is None]
        if rest:
            every = self.ranges is None and len(rest) == len(parts)  # Lance lists them itself
            yield from self._lance_scan(None if every else rest)
        for (fragment, part), uri in zip(parts, files):
            if uri is not None:
                yield from self._file_scan(fragment, part, uri)

    def _lance_scan(
        self, parts: list[tuple[lance.LanceFragment, FragmentRange | None]] | None
    ) -> Iterator[pa.RecordBatch]:
        fragments = None if parts is None else [f for f, _ in parts]
        allow: bytes | None = None
        if parts is not None and not all(r is None or r.whole for _, r in parts):
            allow = row_addr_treemap(
                {
                    f.fragment_id: None
                    if r is None or r.whole
                    else range(r.start, r.end or f.physical_rows)
                    for f, r in parts
                }
            )
        # A filter Lance cannot take is applied here, on every column it may read.
        columns = self.columns if self.exact else None
        scanner = self.dataset.scanner(
            columns=columns,
            filter=self.filter,
            fragments=fragments,
            with_row_address=True,
            batch_size=self.batch_size or (_ROWS_BATCH if columns != [] else _ADDRESSES_BATCH),
            scan_in_order=True,
            row_addr_allowlist=allow,
        )
        for batch in scanner.to_batches():
            if not self.exact and batch.num_rows:
                assert self.predicate is not None  # lance_filter calls no predicate exact
                batch = batch.filter(pc.fill_null(evaluate(self.predicate, batch), False))
            if batch.num_rows:
                # Lance marks _rowaddr nullable; the node's schema says what it is (not null).
                yield pa.RecordBatch.from_arrays(
                    batch.select(self._schema.names).columns, schema=self._schema
                )

    def _direct_file(self, fragment: lance.LanceFragment) -> str | None:
        """The data file of a fragment with a deletion vector that is read here, not through
        Lance's scanner, or None.

        Lance's scanner reads a fragment that has a deletion vector (what every merge leaves)
        several times slower than one without, whatever the number of deleted rows, than its
        data file read with Lance's file reader and the deleted rows dropped here
        (benchmarks/bench_tpch.py, the stage after tbl.maintain(); docs/performance.md). Only a fragment whose one data
        file holds exactly the table's columns (names and types, in order: no column added,
        dropped or renamed since) is read so, only while the deletions cache keeps its deleted
        rows (finding them costs a scan of its row addresses), and not for a filter on an
        indexed column.
        """
        if fragment.metadata.deletion_file is None or self.caches.deletions.max_bytes == 0:
            return None
        if self.predicate is not None:
            # Lance answers a filter on an indexed column from the index, reading only the
            # matching rows; the file would be read whole.
            indexed = {f for i in self.dataset.list_indices() for f in i["fields"]}
            if indexed & referenced_columns(self.predicate):
                return None
        uri = single_data_file(self.dataset, fragment)
        if uri is None:
            return None
        options = storage_options_of(self.dataset)

        def load() -> tuple[pa.Schema, int]:
            file_schema = LanceFileReader(uri, storage_options=options).metadata().schema
            return file_schema, 64 * len(file_schema)

        stored = self.caches.scan.get("file_schema", uri, load)
        table = self.dataset.schema
        same = stored.names == table.names and stored.types == table.types
        return uri if same else None

    def _file_scan(
        self, fragment: lance.LanceFragment, part: FragmentRange | None, uri: str
    ) -> Iterator[pa.RecordBatch]:
        """The live rows of ``fragment`` (or of a row range of it) read from its data file:
        the deletion vector's rows dropped here, the filter evaluated here."""
        deleted = _deleted_rows(self.dataset, fragment, self.caches)
        fid = fragment.fragment_id
        start = 0 if part is None else part.start
        end = fragment.physical_rows if part is None or part.end is None else part.end
        wanted = [c for c in self._schema.names if c != ROWADDR]
        if self.predicate is None:
            names = wanted
        elif self.exact:
            names = list(dict.fromkeys([*wanted, *sorted(referenced_columns(self.predicate))]))
        else:  # an opaque part may address columns by position: every column, in order
            names = self.dataset.schema.names
        if names:
            reader = LanceFileReader(
                uri, storage_options=storage_options_of(self.dataset), columns=names
            )
            batches = reader.read_range(
                start, end - start, batch_size=_ROWS_BATCH, batch_readahead=_FILE_READAHEAD
            ).to_batches()
        else:  # count(*): the row addresses are all there is to read
            batches = (
                pa.RecordBatch.from_arrays(
                    [pa.nulls(min(_ADDRESSES_BATCH, end - o))], ["_"]
                ).select([])
                for o in range(start, end, _ADDRESSES_BATCH)
            )
        offset = start
        for batch in batches:
            n = batch.num_rows
            addresses = (np.uint64(fid) << np.uint64(32)) | np.arange(
                offset, offset + n, dtype=np.uint64
            )
            offset += n
            hit = deleted.hits(addresses)
            keep = np.ones(n, dtype=bool) if hit is None else ~hit
            if self.predicate is not None:
                true = pc.fill_null(evaluate(self.predicate, batch), False)
                keep &= true.to_numpy(zero_copy_only=False)
            if not keep.any():
                continue
            columns = [batch.column(c) for c in wanted] + [pa.array(addresses)]
            out = pa.RecordBatch.from_arrays(columns, schema=self._schema)
            yield out if keep.all() else out.filter(pa.array(keep))

    def describe(self) -> str:
        frags = "all" if self.ranges is None else f"[{', '.join(map(str, self.ranges))}]"
        return (
            f"{self.name}: version={self.dataset.version} gen={BASE_GENERATION} "
            f"fragments={frags} columns={self.columns} filter={self.filter}"
            + ("" if self.exact else f" then {self.predicate}")
        )
