"""Flush a frozen MemTable to a generation: a standalone Lance dataset, as Lance 14 writes it.

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
from memwal_sql.compat.lance import data_file_paths
from memwal_sql.errors import (
    CorruptGenerationError,
    GenerationCollectedError,
    MemWalError,
    StorageError,
)
from memwal_sql.formats.bloom import bloom_filter_bytes, pk_hashes
from memwal_sql.formats.key_index import (
    PK_INDEX_DIR,
    PK_INDEX_FILES,
    SortedKeys,
    read_pk_index,
    write_pk_index,
)
from memwal_sql.formats.maintained_indexes import MaintainedIndex
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.storage import ObjectStore, layout
from memwal_sql.storage.checksums import (
    checksums_known,
    expect_checksums,
    generation_store,
    record_checksums,
    verify_generation_once,
)

BLOOM_FILTER = "bloom_filter.bin"
_log = logging.getLogger(__name__)


def write_generation(
    store: ObjectStore,
    region_id: str,
    generation: int,
    rows: pa.Table,
    primary_key: Sequence[str],
    *,
    data_storage_version: str,
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
    keys sorted, when the caller has them.
    """
    name = layout.new_generation_dir_name(generation)
    path = f"{layout.region_dir(region_id)}/{name}"
    uri = store.uri_for(path)
    lance.write_dataset(
        rows,
        uri,
        mode="create",
        # The base dataset's version, a str from LanceDataset.data_storage_version; lance's
        # write_dataset types the same values as a Literal.
        data_storage_version=data_storage_version,  # type: ignore[arg-type]
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


def open_generation(uri: str, storage_options: dict[str, str] | None = None) -> lance.LanceDataset:
    """The generation at ``uri`` as a Lance dataset, its files verified against the checksums
    recorded at flush (once per process): :class:`CorruptGenerationError` if one is damaged."""
    try:
        _verify(uri, storage_options)
        return lance.dataset(uri, storage_options=storage_options or None)
    except CorruptGenerationError as e:
        raise _collected(uri, storage_options) or e from None
    except (OSError, ValueError) as e:  # a manifest names it: it must be there
        raise _collected(uri, storage_options) or CorruptGenerationError(
            f"generation {uri} cannot be opened ({e}): it is missing or damaged. Restore the "
            "generation directory from a backup"
        ) from e
    except BaseException as e:
        raise _unreadable(uri, e) from e


def _verify(
    uri: str, storage_options: dict[str, str] | None, names: tuple[str, ...] | None = None
) -> None:
    """:func:`verify_generation_once`, once this process knows whether the generation's region
    manifest records its checksum record: a strong read's manifests have told it; an eventual
    read's region snapshot does not carry it, so the region's manifest is read (once: it tells
    of every generation it lists)."""
    store, directory = generation_store(uri, storage_options)
    key = store.uri_for(directory)
    if not checksums_known(key):
        _, region_id, _ = directory.rsplit("/", 2)
        RegionManifestStore(store, region_id).latest()
        if not checksums_known(key):
            expect_checksums(key, None)  # no manifest lists it now: merged and collected
    verify_generation_once(uri, storage_options, names)


def _collected(uri: str, storage_options: dict[str, str] | None) -> GenerationCollectedError | None:
    """:class:`GenerationCollectedError` for a generation GC collected after it was merged
    (GC drops a generation from the region manifest before it deletes its files); None if
    the manifest still names it: then a missing file is damage."""
    store, directory = generation_store(uri, storage_options)
    _, region_id, name = directory.rsplit("/", 2)
    try:
        manifest = RegionManifestStore(store, region_id).latest()
    except MemWalError:
        return None
    if manifest is None or any(g.path == name for g in manifest.flushed_generations):
        return None
    return GenerationCollectedError(
        f"generation {uri} was merged into the base table and collected after this read's "
        "snapshot was taken; read again"
    )


def read_generation_pk_index(uri: str, storage_options: dict[str, str] | None = None) -> pa.Table:
    """The generation's ``_pk_index`` as ``(values, ids)``, verified first (see
    :func:`open_generation`)."""
    try:
        _verify(uri, storage_options, tuple(f"{PK_INDEX_DIR}/{f}" for f in PK_INDEX_FILES))
    except CorruptGenerationError as e:
        raise _collected(uri, storage_options) or e from None
    try:
        return read_pk_index(uri, storage_options)
    except StorageError as e:
        raise _collected(uri, storage_options) or CorruptGenerationError(
            f"{e}: the generation's key index is missing or damaged. Restore the generation "
            "directory from a backup"
        ) from e
    except BaseException as e:
        raise _unreadable(f"{uri}/{PK_INDEX_DIR}", e) from e


def verify_bloom_filter(uri: str, storage_options: dict[str, str] | None = None) -> None:
    """Verify the generation's ``bloom_filter.bin`` (see :func:`open_generation`)."""
    _verify(uri, storage_options, (BLOOM_FILTER,))


def _unreadable(what: str, e: BaseException) -> BaseException:
    """A Rust panic of Lance's reader (a ``BaseException``) on a damaged file that no checksum
    recorded: a typed error like the rest. Anything else is raised as it is."""
    if type(e).__name__ != "PanicException":
        return e
    return CorruptGenerationError(
        f"Lance could not read {what} (it panicked: {e}); a file of the generation is "
        "damaged. Restore the generation directory from a backup"
    )
