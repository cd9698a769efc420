"""Checksums of a flushed generation's files, recorded at flush and verified before use.

Lance data files carry no checksum, so a flipped bit reads as a wrong value, and a damaged
``_pk_index`` can panic Lance's reader. At flush the writer records the size and CRC32C of
every file of the generation in ``_memwal_checksums.json`` at the generation's root, a name
Lance 14 does not read. Readers verify the files of a generation they open, once per process,
before they open them (the small ``_pk_index`` and ``bloom_filter.bin`` included; a file no
read opens, such as an index an exact search skips, is not read for it), and the merger every
file before it copies rows into the base table, so damage is a :class:`CorruptGenerationError`
naming the file.

The region manifest that lists the generation records the CRC32C of that record
(``FlushedGeneration.checksums_crc32c``), and every manifest read tells this module
(:func:`expect_checksums`): a missing record, a record edited or missing a file's entry, is
then damage too, so deleting a file cannot switch the checks off. A generation without either
(written by Lance's own writer) cannot be verified; it is read as it is.

Example:
    >>> from memwal_sql.storage import ObjectStore
    >>> store = ObjectStore("memory://checksums-doc")
    >>> store.put("gen/data/a.lance", b"rows")
    >>> crc = record_checksums(store, "gen")
    >>> verify_generation(store, "gen")
    True
    >>> store.put("gen/data/a.lance", b"rowz")
    >>> verify_generation(store, "gen")
    Traceback (most recent call last):
    memwal_sql.errors.CorruptGenerationError: ...
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence

import google_crc32c

from memwal_sql.errors import CorruptGenerationError, ObjectNotFoundError
from memwal_sql.storage import layout
from memwal_sql.storage.store import ObjectStore

CHECKSUMS = "_memwal_checksums.json"
_VERIFIED_MAX = 4096

# Generation uri -> the names of its files verified so far; None: every file.
_verified: OrderedDict[str, set[str] | None] = OrderedDict()
_verified_lock = threading.Lock()
# Generation uri -> the CRC32C of its record, as the region manifest listing it says. Kept for
# more generations than any process reads between a manifest read and the generation's.
_EXPECTED_MAX = 1 << 16
_expected: OrderedDict[str, int | None] = OrderedDict()  # None: the manifest records none
_stores: dict[tuple[str, tuple[tuple[str, str], ...]], ObjectStore] = {}


def record_checksums(
    store: ObjectStore,
    directory: str,
    *,
    wal_entry_position: int | None = None,
    required: Sequence[str] = (),
) -> int:
    """Record the size and CRC32C of every file under ``directory`` (read back as stored), and
    for a generation the last WAL position its rows came from (GC keeps WAL entries until the
    generation holding them is collected). Returns the CRC32C of the record, for the region
    manifest.

    ``required`` names files (relative to ``directory``) recorded even if a listing left them
    out: an object store's listing may come back short, and a file missing from a record the
    manifest vouches for could never be read (or never be checked)."""
    listed = {meta.path[len(directory) + 1 :] for meta in store.list(f"{directory}/")}
    files = {}
    for name in sorted((listed | set(required)) - {CHECKSUMS}):
        data = store.get(f"{directory}/{name}")
        files[name] = {"size": len(data), "crc32c": google_crc32c.value(data)}
    body: dict[str, object] = {"format": 1, "algorithm": "crc32c", "files": files}
    if wal_entry_position is not None:
        body["wal_entry_position"] = wal_entry_position
    raw = json.dumps(body, sort_keys=True).encode()
    store.put(f"{directory}/{CHECKSUMS}", raw)
    crc: int = google_crc32c.value(raw)
    expect_checksums(store.uri_for(directory), crc)
    return crc


def expect_checksums(uri: str, record_crc32c: int | None) -> None:
    """Note what the region manifest listing the generation at ``uri`` says of its checksum
    record: the record's CRC32C (it must then exist and match), or None (flushed by Lance's
    writer, or listed by a manifest Lance's writer rewrote: read unverified unless this
    process has already seen a manifest that records it).

    Example:
        ``expect_checksums(store.uri_for(gen_dir), flushed_generation.checksums_crc32c)``
    """
    with _verified_lock:
        if record_crc32c is None and _expected.get(uri) is not None:
            return
        _expected[uri] = record_crc32c
        _expected.move_to_end(uri)
        while len(_expected) > _EXPECTED_MAX:
            _expected.popitem(last=False)


def checksums_known(uri: str) -> bool:
    """Whether a region manifest has said (:func:`expect_checksums`) whether the generation at
    ``uri`` has a checksum record."""
    with _verified_lock:
        return uri in _expected


def _expected_crc(store: ObjectStore, directory: str) -> int | None:
    with _verified_lock:
        return _expected.get(store.uri_for(directory))


def recorded_checksums(store: ObjectStore, directory: str) -> dict[str, tuple[int, int]] | None:
    """``{file: (size, crc32c)}`` as recorded at flush; None if nothing was recorded and no
    manifest says a record was written (:func:`expect_checksums`)."""
    expected = _expected_crc(store, directory)
    try:
        raw = store.get(f"{directory}/{CHECKSUMS}")
    except ObjectNotFoundError as e:
        if expected is None:
            return None
        raise _damaged(
            store,
            directory,
            CHECKSUMS,
            "it is missing, though the region manifest says it was written",
        ) from e
    if expected is not None and google_crc32c.value(raw) != expected:
        raise _damaged(
            store, directory, CHECKSUMS, "it does not match the CRC32C its region manifest records"
        )
    try:
        files = json.loads(raw)["files"]
        return {name: (int(f["size"]), int(f["crc32c"])) for name, f in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise _damaged(store, directory, CHECKSUMS, f"it is not a checksum record ({e})") from e


def recorded_wal_entry_position(store: ObjectStore, directory: str) -> int | None:
    """The last WAL position whose rows the generation at ``directory`` holds, as recorded at
    flush; None without a record (a generation Lance wrote) or an unreadable one."""
    try:
        return int(json.loads(store.get(f"{directory}/{CHECKSUMS}"))["wal_entry_position"])
    except (ObjectNotFoundError, ValueError, KeyError, TypeError):
        return None


def verify_generation(
    store: ObjectStore,
    directory: str,
    names: Sequence[str] | None = None,
    skip: Collection[str] = (),
) -> bool:
    """Check the files of the generation at ``directory`` (or only ``names``; never those in
    ``skip``) against their record: :class:`CorruptGenerationError` for a missing, truncated
    or changed one. A name ending in ``/`` stands for every recorded file under it. Returns
    False for a generation without a record (nothing to check against).

    Example:
        ``verify_generation(store, gen_dir, ["data/", "_versions/"])  # what a row read opens``
    """
    record = recorded_checksums(store, directory)
    if record is None:
        return False
    _check(store, directory, record, _expand(names, record), skip)
    return True


def _check(
    store: ObjectStore,
    directory: str,
    record: Mapping[str, tuple[int, int]],
    names: Sequence[str],
    skip: Collection[str],
) -> None:
    strict = _expected_crc(store, directory) is not None
    todo = []
    for name in names:
        if name in skip:
            continue
        if name not in record:
            if not strict:
                continue
            raise _damaged(store, directory, name, "the checksum record has no entry for it")
        todo.append(name)
    # One call for all: an object store answers several requests at a time.
    for name, data in zip(todo, store.get_many([f"{directory}/{n}" for n in todo]), strict=True):
        size, crc = record[name]
        if data is None:
            raise _damaged(store, directory, name, "it is missing")
        if len(data) != size:
            raise _damaged(store, directory, name, f"it has {len(data)} bytes, not {size}")
        if google_crc32c.value(data) != crc:
            raise _damaged(store, directory, name, "its CRC32C does not match")


def _expand(names: Sequence[str] | None, record: Mapping[str, object]) -> list[str]:
    """``names`` (None: every recorded file) with each directory (a name ending in ``/``)
    replaced by its recorded files."""
    if names is None:
        return sorted(record)
    out: list[str] = []
    for name in names:
        if name.endswith("/"):
            out += sorted(n for n in record if n.startswith(name))
        else:
            out.append(name)
    return list(dict.fromkeys(out))


def verify_generation_once(
    uri: str, storage_options: Mapping[str, str] | None, names: tuple[str, ...] | None = None
) -> None:
    """:func:`verify_generation` for the generation at ``uri`` (every file, or ``names``:
    files, or directories ending in ``/``), each file at most once per process (generations
    never change once flushed: a file verified for a lookup is not read again when a search
    opens the generation), once its region manifest has said whether it has a record
    (:func:`checksums_known`).

    Example:
        ``verify_generation_once(gen.uri, None, ("bloom_filter.bin",))``
    """
    with _verified_lock:
        known = _verified.get(uri, set())
        if uri in _verified:
            _verified.move_to_end(uri)
        done = None if known is None else set(known)  # a copy: others may add to it
    if done is None or (names is not None and done.issuperset(names)):
        return
    store, directory = generation_store(uri, storage_options)
    record = recorded_checksums(store, directory)
    files = _expand(names, record or {})
    if record is not None:
        _check(store, directory, record, files, done)
    if not checksums_known(store.uri_for(directory)):
        return  # checked as far as known: a manifest read later may ask for more
    # A directory verified is remembered by its name as well as by its files.
    checked = {*files, *(names or ())}
    with _verified_lock:
        if names is None:
            _verified[uri] = None
        else:
            known = _verified.get(uri, set())
            _verified[uri] = None if known is None else known | checked
        _verified.move_to_end(uri)
        while len(_verified) > _VERIFIED_MAX:
            _verified.popitem(last=False)


def generation_store(
    uri: str, storage_options: Mapping[str, str] | None
) -> tuple[ObjectStore, str]:
    """The table's store (rooted above ``_mem_wal/``) and the generation's path in it."""
    root, sep, rest = uri.rpartition(f"/{layout.MEM_WAL_DIR}/")
    if not sep:
        raise ValueError(f"{uri} is not a generation directory under {layout.MEM_WAL_DIR}/")
    key = (root, tuple(sorted((storage_options or {}).items())))
    with _verified_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = ObjectStore(root, storage_options, durable=False)
    return store, f"{layout.MEM_WAL_DIR}/{rest}"


def _damaged(store: ObjectStore, directory: str, name: str, what: str) -> CorruptGenerationError:
    return CorruptGenerationError(
        f"generation file {store.uri_for(f'{directory}/{name}')} is damaged: {what}. Nothing "
        "was read from it. Restore the generation directory from a backup, or run "
        "`memwal verify` to list every damaged file"
    )
