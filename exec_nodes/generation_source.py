"""The generation leaf: a flushed generation (a standalone Lance dataset with its
``_pk_index`` and bloom filter), read by any access method.

A generation never changes, so what is read of it is kept in the table's caches: a small
one's rows whole (``caches.lookup``, shared by every access method), its key index, the few
columns deduplication reads (``caches.scan``), its terms (``caches.search``).
"""

from __future__ import annotations

from collections.abc import Sequence

import lance
import numpy as np
import pyarrow as pa

from exec_nodes.fts_index import IndexTerms, open_text_index
from exec_nodes.source import (
    Access,
    FullText,
    Knn,
    Lookup,
    Probe,
    SourceLeaf,
    lance_nearest,
    take_addresses,
    whole_fragment,
)
from memwal_sql.compat.lance import take_rows
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.expressions.substrait import lance_filter
from memwal_sql.expressions.visitors import matches
from memwal_sql.formats.generation import (
    INDEX_FILES,
    ROW_FILES,
    open_generation,
    read_generation_pk_index,
    verify_generation_files,
)
from memwal_sql.formats.source_rows import ROWADDR, TOMBSTONE, conform, stored_columns
from memwal_sql.formats.tokenizer import Tokenizer
from memwal_sql.structures.cache import Caches
from memwal_sql.structures.keyset import KeySet, encode_keys, last_per_key
from memwal_sql.writer.memtable_indexes import Piece

_FEW_COLUMNS = 6  # up to this many columns of a generation are kept (key columns, tombstone)
_DATASET_BYTES = 4096  # an opened generation, as the lookup cache counts it (its manifest)


def generation_rows(
    uri: str,
    storage_options: dict[str, str] | None,
    generation: int,
    schema: pa.Schema,
    caches: Caches,
) -> pa.Table | None:
    """A small generation's rows (every physical row, row ``i`` at offset ``i``, in the
    source ``schema``), read once and kept in ``caches.lookup``; None for a generation too big
    to keep (see :func:`~exec_nodes.source.whole_fragment`). Lookups, scans and searches share
    the entry.

    Example:
        ``generation_rows(gen.uri, None, gen.generation, source_schema(tbl.wal_schema), caches)``
    """

    def load() -> tuple[pa.Table | None, int]:
        ds = open_generation(uri, storage_options, ROW_FILES)
        frags = ds.get_fragments()
        if len(frags) != 1:
            return None, 64
        names = stored_columns(schema, ds)
        return whole_fragment(frags[0], names, generation, schema, caches.max_bytes)

    rows = caches.lookup.get("rows", uri, load)
    if rows is not None and not rows.schema.equals(schema):
        rows = conform(rows, schema, generation)  # kept before a schema change added columns
    return rows


def generation_dataset(
    uri: str, storage_options: dict[str, str] | None, caches: Caches
) -> lance.LanceDataset:
    """The generation at ``uri`` opened once, kept in ``caches.lookup``: a generation never
    changes, and each open reads its manifest again. The files a read of its rows opens are
    verified (:data:`ROW_FILES`); a read through an index verifies its files first.

    Example:
        ``generation_dataset(gen.uri, None, tbl.caches).count_rows()``
    """
    return caches.lookup.get(
        "dataset", uri, lambda: (open_generation(uri, storage_options, ROW_FILES), _DATASET_BYTES)
    )


def generation_columns(
    uri: str,
    storage_options: dict[str, str] | None,
    generation: int,
    schema: pa.Schema,
    caches: Caches,
) -> pa.Table:
    """Some columns of a generation's rows (``schema``, part of the source schema, with
    ``_gen`` and ``_rowaddr``): taken from its rows when the lookup cache keeps them, else
    read, those columns alone (not cached here: the caller keeps what it makes of them). An
    exact KNN reads so the keys, tombstones and vectors, about what Lance's flat search reads.

    Example:
        ``generation_columns(gen.uri, None, gen.generation, schema, tbl.caches)``
    """
    kept = caches.lookup.peek("rows", uri)
    if isinstance(kept, pa.Table):
        return kept.select(schema.names)
    ds = generation_dataset(uri, storage_options, caches)
    table = ds.to_table(columns=stored_columns(schema, ds), with_row_address=True)
    return conform(table, schema, generation).combine_chunks()


def generation_vector_index(
    uri: str, storage_options: dict[str, str] | None, column: str, metric: str, caches: Caches
) -> tuple[str, int] | None:
    """The name of the generation's vector index on ``column`` that ranks by ``metric`` (the
    one its flush built with the base index's centroids) and the rows it indexes, or None.
    Asked once per generation and column (``caches.search``).

    Example:
        ``generation_vector_index(gen.uri, None, "vec", "l2", tbl.caches)  # ("vec_idx", 15000)``
    """

    def load() -> tuple[tuple[str, int] | None, int]:
        ds = generation_dataset(uri, storage_options, caches)
        for d in ds.describe_indices():
            details = d.details if isinstance(d.details, dict) else {}
            if (
                d.field_names == [column]
                and "VectorIndex" in d.type_url
                and str(details.get("metric_type", "")).lower() == metric
            ):
                return (d.name, d.num_rows_indexed), 64
        return None, 64

    return caches.search.get("generation_vector_index", f"{uri}#{column}#{metric}", load)


def key_index(values: pa.Table, ids: np.ndarray) -> tuple[KeySet, np.ndarray]:
    """KeySet over distinct keys and, per key, the highest row id (a later duplicate that
    Lance's writer masked with a deletion vector is always the higher id), as
    :meth:`KeySet.indexing` pairs them."""
    if values.num_rows == 0:
        return KeySet.indexing(values, ids)
    return KeySet.indexing(*last_per_key(values, ids))


def stored_keys(index: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """A ``_pk_index``'s key column as a key table (composite keys are stored encoded)."""
    values = index.column("values")
    if len(primary_key) == 1:
        return pa.table({primary_key[0]: values})
    return pa.table({"__key": values.cast(pa.binary())})


def index_keys(keys: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """Probe keys in the form a ``_pk_index`` stores them."""
    if len(primary_key) == 1:
        return keys.select(list(primary_key))
    return pa.table({"__key": encode_keys(keys.select(list(primary_key)))})


class GenerationSourceExec(SourceLeaf):
    """A flushed generation at ``uri`` read by ``access``: a scan (its deletion vector
    applied), a lookup through its ``_pk_index``, a KNN through Lance (through the
    generation's own vector index when ``Knn.index`` names the base's; else flat, when it is
    too big for ``GenerationsKnnExec``, which searches the others exactly), its documents.

    Rows a generation's deletion vector hides (older duplicates of a key in the same flush)
    may be KNN candidates or documents here; they are never their key's newest version, so
    the parent drops them.

    Example:
        ``GenerationSourceExec("r", 3, gen.uri, schema, Lookup(("id",)), caches=c).probe(keys)``
    """

    name = "GenerationSourceExec"

    def __init__(
        self,
        region_id: str,
        generation: int,
        uri: str,
        schema: pa.Schema,
        access: Access,
        storage_options: dict[str, str] | None = None,
        *,
        caches: Caches,
        keys: pa.Table | None = None,
    ) -> None:
        super().__init__(region_id, generation, schema, access, caches=caches, keys=keys)
        self.uri = uri
        self.storage_options = storage_options
        self.in_lance = isinstance(access, Knn)

    def _where(self) -> str:
        return (
            f"region={(self.region_id or '')[:8]} gen={self.generation} "
            f"path={self.uri.rsplit('/', 1)[-1]}"
        )

    def _how(self) -> str:
        if isinstance(self.access, Lookup):
            return f"{self.access} via _pk_index"
        access = self.access
        if isinstance(access, FullText):
            indexed = isinstance(self.pieces()[0].tokens, IndexTerms)
            return f"{access} {'through its inverted index' if indexed else 'tokenized'}"
        if isinstance(access, Knn) and access.index is not None:
            return (
                f"{access} via its index {access.index} nprobes={access.nprobes} "
                f"refine_factor={access.refine_factor}"
            )
        return f"{access} flat" if isinstance(access, Knn) else str(access)

    def whole_rows(self) -> pa.Table | None:
        """The generation's rows in the source schema, kept in the lookup cache when small
        (the entry every access method uses); None for a big one."""
        return generation_rows(
            self.uri, self.storage_options, self.generation, self.source_schema, self.caches
        )

    def _rows(self) -> pa.Table:
        """Every physical row, from the lookup cache or (too big to keep) read now."""
        table = self.whole_rows()
        if table is None:
            ds = open_generation(self.uri, self.storage_options, ROW_FILES)
            names = stored_columns(self.source_schema, ds)
            rows = ds.to_table(columns=names, with_row_address=True)
            table = conform(rows, self.source_schema, self.generation)
        return table

    # Scan

    def read(self, schema: pa.Schema, predicate: Predicate | None) -> pa.Table:
        if predicate is None and len(schema) <= _FEW_COLUMNS:
            return self._few_columns(schema)
        whole = self.whole_rows()
        if whole is not None:
            # Every physical row, the deletion vector's too: an older duplicate is never its
            # key's newest version, so deduplication drops it like any stale row.
            return matches(predicate, whole).select(schema.names)
        ds = open_generation(self.uri, self.storage_options)
        names = stored_columns(schema, ds)
        pushed, exact = lance_filter(predicate, ds.schema)
        table = ds.to_table(columns=names, filter=pushed, with_row_address=True)
        if not exact:
            table = matches(predicate, table)
        return conform(table, schema, self.generation)  # Lance's row addresses kept

    def _few_columns(self, schema: pa.Schema) -> pa.Table:
        """A few whole columns (what deduplication reads: the keys and ``_tombstone`` of every
        row), read once and kept in ``caches.scan``: a generation never changes."""
        uri, opts = self.uri, self.storage_options

        def load() -> tuple[pa.Table, int]:
            ds = open_generation(uri, opts, ROW_FILES)
            names = stored_columns(schema, ds)
            table = conform(
                ds.to_table(columns=names, with_row_address=True), schema, self.generation
            ).combine_chunks()
            return table, table.nbytes

        return self.caches.scan.get("columns", f"{uri}#{','.join(schema.names)}", load)

    # Lookup

    def _probe(self, keys: pa.Table) -> Probe:
        uri, opts, pk = self.uri, self.storage_options, self.primary_key

        def load_index() -> tuple[tuple[KeySet, np.ndarray], int]:
            index = read_generation_pk_index(uri, opts)
            keyset, ids = key_index(stored_keys(index, pk), index.column("ids").to_numpy())
            return (keyset, ids), keyset.nbytes + ids.nbytes

        keyset, ids = self.caches.lookup.get("pk_index", uri, load_index)
        return self._take_newest(index_keys(keys, pk), keyset, ids, self.take_offsets)

    def take_offsets(self, offsets: np.ndarray) -> pa.Table:
        """The generation's rows at ``offsets`` (what its ``_pk_index`` stores) in the leaf's
        schema: with ``Lookup(versions=True)`` their versions only, from the few columns
        deduplication keeps (a search's stale check reads no generation whole)."""
        if self._needs(Lookup).versions:
            versions = self._few_columns(self.schema)
            addresses = versions.column(ROWADDR).to_numpy()
            at = np.minimum(np.searchsorted(addresses, offsets), max(len(addresses) - 1, 0))
            if len(addresses) and (addresses[at] == offsets).all():
                return versions.take(pa.array(at))
            rows = None  # a row its deletion vector hides: read those rows as they are
        else:
            rows = self.whole_rows()
        if rows is not None:
            return rows.take(pa.array(offsets))
        ds = generation_dataset(self.uri, self.storage_options, self.caches)
        names = stored_columns(self.schema, ds)
        # Row addresses of fragment 0 are the offsets the _pk_index stores.
        row_ids = pa.array(offsets.astype(np.uint64))
        out = conform(take_rows(ds, row_ids, names), self.schema, self.generation)
        return out.set_column(
            out.schema.get_field_index(ROWADDR), self.schema.field(ROWADDR), row_ids
        )

    # Knn

    def _nearest(self, n: int) -> pa.Table:
        access = self._needs(Knn)
        ds = generation_dataset(self.uri, self.storage_options, self.caches)
        if access.index is not None or self.predicate is not None:
            # Lance opens the vector index, or may answer the filter from a scalar one.
            verify_generation_files(self.uri, self.storage_options, INDEX_FILES)
        options: dict[str, object] = {"use_index": False}
        if access.index is not None:
            # Its index holds the base index's centroids and codebook: probed and refined
            # as the base is, its distances rank with the base's.
            options = {"nprobes": access.nprobes, "refine_factor": access.refine_factor}
            options = {k: v for k, v in options.items() if v}
        return lance_nearest(ds, self, n, options, self.generation)

    def rows(self, candidates: pa.Table) -> pa.Table:
        ds = generation_dataset(self.uri, self.storage_options, self.caches)
        addresses = candidates.column(ROWADDR).to_numpy()
        return take_addresses(ds, addresses, self.source_schema, self.generation)

    # FullText

    def _text_pieces(self) -> list[Piece]:
        access = self._needs(FullText)

        def load() -> tuple[Piece, int]:
            terms = self._index_terms(access)
            if terms is None:  # no index of the same tokenizer: tokenized here
                table = self._rows()
                piece = self._piece(table, table.column(ROWADDR).to_numpy().astype(np.int64))
            else:
                names = [*self.primary_key, TOMBSTONE, ROWADDR]
                table = self._few_columns(pa.schema([self.source_schema.field(n) for n in names]))
                present = ~table.column(TOMBSTONE).to_numpy(zero_copy_only=False).astype(bool)
                addresses = table.column(ROWADDR).to_numpy().astype(np.int64)
                piece = Piece(table.select(self.primary_key), addresses, terms, present)
            return piece, piece.tokens.nbytes + piece.keys.nbytes

        return [self.caches.search.get("fts", f"{self.uri}#{access.column}", load)]

    def _index_terms(self, access: FullText) -> IndexTerms | None:
        """The generation's documents through its own inverted index on the column (built at
        flush), when that index splits texts as the search does."""
        ds = generation_dataset(self.uri, self.storage_options, self.caches)
        frags = ds.get_fragments()
        if len(frags) != 1:
            return None
        opened = open_text_index(
            ds, access.column, {frags[0].fragment_id}, before_open=self._verify_index
        )
        if isinstance(opened, str) or len(opened[0]) != 1 or not opened[1]:
            return None
        files = opened[0][0]
        if Tokenizer(files.params).signature != access.tokenizer.signature:
            return None
        return IndexTerms(files, frags[0].metadata.physical_rows, self.caches)

    def _verify_index(self, uuid: str) -> None:
        """Verify the files of the generation's index ``uuid`` (before they are opened): a
        full-text search opens its inverted index only, not the vector or key indexes."""
        verify_generation_files(self.uri, self.storage_options, (f"{INDEX_FILES[0]}{uuid}/",))

    def piece_rows(self, piece: int, index: np.ndarray) -> pa.Table:
        return self._rows().take(pa.array(index))


__all__ = [
    "GenerationSourceExec",
    "generation_columns",
    "generation_dataset",
    "generation_rows",
    "generation_vector_index",
    "index_keys",
    "key_index",
    "stored_keys",
]
