"""Flushed generations on disk: open one, read its key index, check its files.

``_mem_wal/{region}/{hex8}_gen_{n}/`` holds the deduplicated rows (base columns + ``_tombstone``)
as a Lance dataset with its own data file, the ``_pk_index/`` BTree sidecar that Lance's
``LsmScanner`` requires, and ``bloom_filter.bin``. The flush that writes one is
:mod:`memwal_sql.writer.flush`.
"""

from __future__ import annotations

import lance
import pyarrow as pa

from memwal_sql.errors import (
    CorruptGenerationError,
    GenerationCollectedError,
    MemWalError,
    StorageError,
)
from memwal_sql.formats.key_index import (
    PK_INDEX_DIR,
    PK_INDEX_FILES,
    read_pk_index,
)
from memwal_sql.formats.region_manifest import RegionManifestStore
from memwal_sql.storage.checksums import (
    checksums_known,
    expect_checksums,
    generation_store,
    verify_generation_once,
)

BLOOM_FILTER = "bloom_filter.bin"
# What Lance opens to read a generation's rows (its manifests, data and deletion files), and
# its indexes: a read that opens no index verifies none (a cold exact search verified a third
# more bytes than it read, in 12 of each generation's 21 files that it never opens).
ROW_FILES = ("_versions/", "data/", "_deletions/")
INDEX_FILES = ("_indices/",)


def open_generation(
    uri: str, storage_options: dict[str, str] | None = None, files: tuple[str, ...] | None = None
) -> lance.LanceDataset:
    """The generation at ``uri`` as a Lance dataset, its files verified against the checksums
    recorded at flush (once per process): :class:`CorruptGenerationError` if one is damaged.
    ``files`` (names or directories ending in ``/``) limits the check to what the caller's
    reads open, such as :data:`ROW_FILES` for rows read without an index; it verifies the
    rest (:func:`verify_generation_files`) before it opens more.

    Example:
        ``open_generation(gen.uri, None, ROW_FILES).to_table(columns=["id"])``
    """
    try:
        _verify(uri, storage_options, files)
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


def verify_generation_files(
    uri: str, storage_options: dict[str, str] | None, files: tuple[str, ...]
) -> None:
    """Verify some files of the generation (names, or directories ending in ``/``) before a
    read opens them, once per process: :class:`CorruptGenerationError` if one is damaged.

    Example:
        ``verify_generation_files(gen.uri, None, INDEX_FILES)  # before a search by its index``
    """
    try:
        _verify(uri, storage_options, files)
    except CorruptGenerationError as e:
        raise _collected(uri, storage_options) or e from None


def _unreadable(what: str, e: BaseException) -> BaseException:
    """A Rust panic of Lance's reader (a ``BaseException``) on a damaged file that no checksum
    recorded: a typed error like the rest. Anything else is raised as it is."""
    if type(e).__name__ != "PanicException":
        return e
    return CorruptGenerationError(
        f"Lance could not read {what} (it panicked: {e}); a file of the generation is "
        "damaged. Restore the generation directory from a backup"
    )
