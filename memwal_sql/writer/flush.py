"""Flush a frozen MemTable to a generation: a standalone Lance dataset, as Lance 14 writes it.

The layout it writes is read by :mod:`memwal_sql.formats.generation`.

``_mem_wal/{region}/{hex8}_gen_{n}/`` holds the deduplicated rows (base columns + ``_tombstone``)
as a Lance dataset with its own data file, the ``_pk_index/`` BTree sidecar that Lance's
``LsmScanner`` requires, and ``bloom_filter.bin``. Nothing references it until the region
manifest is committed, so a crash mid-flush leaves only an orphan directory for GC; on local
disk every file is fsynced before that commit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import lance
import pyarrow as pa

from memwal_sql._proto.memwal_pb2 import FlushedGeneration
from memwal_sql.compat.lance import data_file_paths, write_dataset_with_field_ids
from memwal_sql.formats.bloom import bloom_filter_bytes, pk_hashes
from memwal_sql.formats.generation import BLOOM_FILTER
from memwal_sql.formats.key_index import (
    PK_INDEX_DIR,
    PK_INDEX_FILES,
    SortedKeys,
    write_pk_index,
)
from memwal_sql.formats.maintained_indexes import MaintainedIndex
from memwal_sql.storage import ObjectStore, layout
from memwal_sql.storage.checksums import (
    record_checksums,
)

_log = logging.getLogger(__name__)


def write_generation(
    store: ObjectStore,
    region_id: str,
    generation: int,
    rows: pa.Table,
    primary_key: Sequence[str],
    *,
    data_storage_version: str,
    field_ids: Sequence[int] | None = None,
    in_memory_bytes: int,
    indexes: Sequence[MaintainedIndex] = (),
    wal_entry_position: int | None = None,
    sorted_keys: SortedKeys | None = None,
) -> FlushedGeneration:
    """Write deduplicated ``rows`` as generation ``generation``; return its manifest entry.

    ``indexes`` (the table's maintained indexes) are built on the generation under their base
    names; one that cannot be built (say, a vector index over a generation of deletes only)
    is left out, and readers search that generation without it. Every call writes a fresh
    directory, so a retried flush never meets a failed one's files. ``wal_entry_position``
    is the last WAL position the rows came from, recorded for GC; ``sorted_keys`` are the rows'
    keys sorted, when the caller has them. ``field_ids`` are the base's ids of the rows'
    columns (``_tombstone`` aside), when they are not their positions.
    """
    name = layout.new_generation_dir_name(generation)
    path = f"{layout.region_dir(region_id)}/{name}"
    uri = store.uri_for(path)
    if field_ids is None:
        lance.write_dataset(
            rows,
            uri,
            mode="create",
            # The base dataset's version, a str from LanceDataset.data_storage_version; lance's
            # write_dataset types the same values as a Literal.
            data_storage_version=data_storage_version,  # type: ignore[arg-type]
            storage_options=store.storage_options or None,
        )
    else:  # the base's ids, by which Lance's reader matches a generation's columns
        write_dataset_with_field_ids(
            rows,
            uri,
            field_ids,
            data_storage_version=data_storage_version,
            storage_options=store.storage_options or None,
        )
    dataset = lance.dataset(uri, storage_options=store.storage_options or None)
    if indexes:
        for index in indexes:
            try:
                index.build(dataset)
            except (OSError, ValueError, RuntimeError) as e:
                _log.warning(
                    "generation %s: index %s not built (%s); the generation is searched without it",
                    path,
                    index.name,
                    e,
                )
    keys = rows.select(list(primary_key))
    write_pk_index(uri, sorted_keys or keys, store.storage_options or None)
    store.put(f"{path}/{BLOOM_FILTER}", bloom_filter_bytes(pk_hashes(keys)))
    # What readers open by name must be in the record, however short a listing came back.
    required = [
        BLOOM_FILTER,
        *(f"{PK_INDEX_DIR}/{f}" for f in PK_INDEX_FILES),
        *(f"data/{p}" for fragment in dataset.get_fragments() for p in data_file_paths(fragment)),
    ]
    record_crc32c = record_checksums(
        store, path, wal_entry_position=wal_entry_position, required=required
    )
    # Lance writes without fsync; the manifest commit that follows lets GC delete the WAL
    # entries these rows came from, so the files must be on disk first.
    store.sync_tree(path)
    return FlushedGeneration(
        generation=generation,
        path=name,
        in_memory_bytes=in_memory_bytes,
        physical_rows=rows.num_rows,
        primary_key_bytes=keys.nbytes,
        checksums_crc32c=record_crc32c,
    )
