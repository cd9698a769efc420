"""One storage interface over obstore: local disk, ``memory://`` and ``s3://``.

obstore binds the same Rust ``object_store`` crate Lance uses, so one ``storage_options`` dict
serves both. This wrapper normalises what differs between backends (listing order, deleting a
missing key, error types) and adds what obstore lacks: durability on local disk. obstore's
LocalStore publishes files atomically (temp file + link) but never fsyncs; with ``durable=True``
a put-if-not-exists on local disk writes the data under a temporary name, fsyncs the file, renames
it into place without replacing (``RENAME_NOREPLACE``, else ``link``: exactly one writer wins)
and fsyncs the directory. Readers never see a partial object, and a name never becomes durable
before its data.

A put of checksummed data (WAL entries) costs one device flush instead of two on ext4, XFS and
btrfs: the file's write-back is started, the file renamed, then fsynced, and on these file
systems the fsync of a file that has just got a name writes that name too (ext4's journal or,
without one, its parent sync; XFS's log; btrfs's log tree). Readers still never see a partial
object, and an acknowledged put survives a power loss; but a machine crash *during* the put may
leave a torn object under its name, which the reader's checksum detects (RocksDB's WAL has the
same contract). In directories a writer appends to, the temporary files are created ahead of
time in the background (:meth:`ObjectStore.keep_spare_files`).
"""

from __future__ import annotations

import builtins
import ctypes
import errno
import os
import re
import shutil
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast
from urllib.parse import urlparse

import obstore as obs
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import LocalStore, MemoryStore, S3Store

from memwal_sql.compat.lance import is_commit_conflict, is_io_error, is_unanswered
from memwal_sql.errors import (
    AuthenticationError,
    CommitConflictError,
    InvalidInputError,
    MemWalError,
    ObjectExistsError,
    ObjectNotFoundError,
    StorageError,
    StorageUnavailableError,
    SyncFailedError,
)
from memwal_sql.storage import layout
from memwal_sql.storage.spare_files import (
    SPARE_MAX_AGE,
    SpareFiles,
    create_temp_file,
    is_spare,
    is_temp_file,
    open_spare,
)

if TYPE_CHECKING:
    from obstore.store import ClientConfig, S3Config  # stub-only names

# Keys of a Lance storage_options dict that configure the HTTP client rather than the S3
# credentials; obstore panics if they are passed as S3 config.
_CLIENT_KEYS = {
    "allow_http",
    "aws_allow_http",
    "allow_invalid_certificates",
    "timeout",
    "connect_timeout",
    "pool_idle_timeout",
    "proxy_url",
}
_MEMORY_STORES: dict[str, MemoryStore] = {}
T = TypeVar("T")
_worker = threading.local()  # marks the threads ObjectStore.while_answering runs calls on
GET_MANY_REQUESTS = 64
"""Requests :meth:`ObjectStore.get_many` keeps in flight on an object store."""
# Lance's names for its object-store retries (obstore takes them as a retry config).
_LANCE_RETRY_KEYS = {"client_max_retries", "client_retry_timeout"}
#: Timeouts and retries of every object-store request, unless ``storage_options`` set them:
#: object_store's own defaults retry an endpoint that never answers for minutes, so that a
#: hung endpoint is a typed error within about the sum of these instead
#: (tests/storage/test_unanswered.py holds every operation to it; a request that takes longer
#: than ``timeout`` needs a larger value).
DEFAULT_TIMEOUTS = {
    "connect_timeout": "5s",
    "timeout": "10s",
    "client_max_retries": "2",
    "client_retry_timeout": "15",
}
Data = bytes | memoryview | Sequence[bytes | memoryview]
"""What a put stores: bytes, or parts whose concatenation is the object. Parts are written one
after another, never joined first on local disk, so a large WAL entry goes to disk from its
record batches' own memory (:class:`memwal_sql.formats.wal.WalEntryEncoder`)."""


def is_access_denied(error: BaseException) -> bool:
    """Whether an object store refused the credentials (S3's error codes, as Lance and
    obstore pass them on in their text)."""
    text = str(error)
    return any(code in text for code in _ACCESS_DENIED)


_NO_BUCKET = "NoSuchBucket"  # S3's error code, in Lance's and obstore's error text
_ACCESS_DENIED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403 Forbidden")


def _seconds(duration: str) -> float:
    """Seconds of a duration as object_store takes it ("10s", "500ms", "2m"; a bare number
    is seconds).

    Example:
        >>> _seconds("500ms"), _seconds("2m"), _seconds("7")
        (0.5, 120.0, 7.0)
    """
    text = duration.strip().lower()
    for unit, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(unit) and text[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return float(text[: -len(unit)]) * scale
    try:
        return float(text)
    except ValueError:
        raise InvalidInputError(
            f"storage option timeout={duration!r} is not a duration; write it as 10s or 500ms"
        ) from None


def with_default_timeouts(uri: str, storage_options: Mapping[str, str] | None) -> dict[str, str]:
    """``storage_options`` with :data:`DEFAULT_TIMEOUTS` filled in for an object store (as
    obstore and Lance both read them); unchanged for local paths.

    Example:
        >>> with_default_timeouts("s3://b/t", {"timeout": "60s"})["timeout"]
        '60s'
    """
    options = dict(storage_options or {})
    if urlparse(uri).scheme in ("s3", "s3a", "gs", "az", "abfss"):
        for key, value in DEFAULT_TIMEOUTS.items():
            options.setdefault(key, value)
    return options


@dataclass(frozen=True)
class ObjectMeta:
    """A listed object: its path relative to the store root, size in bytes, and when it was
    last written (seconds since the epoch)."""

    path: str
    size: int
    last_modified: float = 0.0


class ObjectStore:
    """Put-if-not-exists, get, head, sorted list and delete over one root uri.

    Example:
        >>> store = ObjectStore("memory://doc-example")
        >>> store.put_if_not_exists("a/1", b"x")
        >>> store.get("a/1")
        b'x'
        >>> [m.path for m in store.list("a/")]
        ['a/1']
    """

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, str] | None = None,
        *,
        durable: bool = True,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self.durable = durable
        parsed = urlparse(uri)
        self._local_root: Path | None = None
        self._spares: SpareFiles | None = None
        self._name_syncs_with_file: bool | None = None  # known after the first checksummed put
        self._probe: S3Store | None = None  # object stores: see while_answering
        self._answer_within = 0.0
        if parsed.scheme in ("", "file"):
            root = Path(parsed.path if parsed.scheme else uri).expanduser().resolve()
            root.mkdir(parents=True, exist_ok=True)
            self._local_root = root
            self.uri = str(root)
            self._store: LocalStore | MemoryStore | S3Store = LocalStore(root)
            if durable:
                self._spares = SpareFiles()
                weakref.finalize(self, self._spares.close)
        elif parsed.scheme == "memory":
            # One MemoryStore per name so that several handles on one uri see the same objects.
            self.uri = uri.rstrip("/")
            self._store = _MEMORY_STORES.setdefault(self.uri, MemoryStore())
        elif parsed.scheme == "s3":
            self.uri = uri.rstrip("/")
            options = with_default_timeouts(uri, self.storage_options)
            config = {
                k: v
                for k, v in options.items()
                if k not in _CLIENT_KEYS and k not in _LANCE_RETRY_KEYS
            }
            client = {k.removeprefix("aws_"): v for k, v in options.items() if k in _CLIENT_KEYS}

            def s3_store(max_retries: int) -> S3Store:
                return S3Store(
                    parsed.netloc,
                    prefix=parsed.path.strip("/") or None,
                    # Keys come from the caller's storage_options; obstore checks them at runtime.
                    config=cast("S3Config", config),
                    client_options=cast("ClientConfig", client),
                    retry_config={
                        "max_retries": max_retries,
                        "retry_timeout": timedelta(seconds=float(options["client_retry_timeout"])),
                        "backoff": {
                            "init_backoff": timedelta(milliseconds=100),
                            "max_backoff": timedelta(seconds=2),
                            "base": 2.0,
                        },
                    },
                )

            self._store = s3_store(int(options["client_max_retries"]))
            # One request, never retried: whether the endpoint answers at all.
            self._probe = s3_store(0)
            self._answer_within = _seconds(options["timeout"])
        else:
            raise StorageError(
                f"unsupported uri scheme {parsed.scheme!r} in {uri!r}; "
                "use a local path, file://, memory:// or s3://"
            )

    def while_answering(self, call: Callable[[], T], what: str) -> T:
        """``call()``, for Lance I/O against this store: on an object store it runs on a
        worker thread while this thread checks, every ``timeout`` (of ``storage_options``) that
        it runs, that the store still answers one request; if it does not,
        :class:`StorageUnavailableError` is raised at once and ``call`` is left to fail on its
        own. Local and memory stores just call it.

        Lance retries a request the endpoint never answers several times over (a listing six
        times, each with the client's own retries): minutes against an endpoint that stopped
        answering. A call that runs long against a store that answers is left to run. The
        worker is not a daemon thread: an interpreter that exits while a call it left is still
        inside Lance waits for Lance to give up (a daemon thread coming back into a finalizing
        interpreter would abort the process).

        Example:
            >>> ObjectStore("memory://doc-answering").while_answering(lambda: 42, "a call")
            42
        """
        if self._probe is None or getattr(_worker, "answering", False):
            return call()  # an outer call is already watched
        outcome: list[Any] = []

        def run() -> None:
            _worker.answering = True
            try:
                outcome.append((True, call()))
            except BaseException as e:
                outcome.append((False, e))

        worker = threading.Thread(target=run, name="memwal-store-call")
        worker.start()
        while True:
            worker.join(self._answer_within)
            if outcome:
                ok, value = outcome[0]
                if ok:
                    return cast("T", value)
                raise value
            if not self._answers():
                raise StorageUnavailableError(
                    f"{what} failed: {self.uri} did not answer a request within "
                    f"{self._answer_within:g} s (storage_options' timeout); check that the "
                    "endpoint is up and reachable, then run it again"
                )

    def run_io(self, what: str, call: Callable[[], T]) -> T:
        """``call()`` (I/O against this store, Lance's too) with its storage failures typed
        (:class:`storage_failures`) and bounded if the store stops answering
        (:meth:`while_answering`).

        Example:
            >>> ObjectStore("memory://doc-run-io").run_io("a merge", lambda: "merged")
            'merged'
        """
        with storage_failures(what):
            return self.while_answering(call, what)

    def steps_while_answering(self, items: Iterable[T], what: str) -> Iterator[T]:
        """``items``, each step taken as :meth:`while_answering` takes a call (for a stream of
        batches read by Lance).

        Example:
            >>> list(ObjectStore("memory://doc-steps").steps_while_answering([1, 2], "a read"))
            [1, 2]
        """
        if self._probe is None:
            yield from items
            return
        it = iter(items)
        end = object()
        while True:
            item = self.while_answering(lambda: next(it, end), what)
            if item is end:
                return
            yield cast("T", item)

    def _answers(self) -> bool:
        """Whether the object store answers one request (any answer: a missing key, a refusal)."""
        assert self._probe is not None
        try:
            obs.head(self._probe, layout.MEM_WAL_DIR)
        except FileNotFoundError:
            pass
        except BaseError as e:
            return not is_unanswered(e)
        return True

    @property
    def is_local(self) -> bool:
        """True when the store is a directory on local disk."""
        return self._local_root is not None

    def uri_for(self, path: str) -> str:
        """Absolute uri of ``path`` for Lance (which reads the same store directly)."""
        return f"{self.uri}/{path}" if path else self.uri

    def put_if_not_exists(
        self, path: str, data: Data, *, checksummed: bool = False, sync: bool = True
    ) -> None:
        """Create ``path`` atomically; raise :class:`ObjectExistsError` if it exists.

        ``data`` may be a sequence of parts (:data:`Data`). On local disk they are written as
        they are; an object store's conditional put takes one body, so there they are joined.

        ``checksummed``: the data carries a checksum that its readers verify, so on local disk
        the put may make its name and data durable in one device flush, with no order between
        them. Once the put returns both are durable; a machine crash before that may leave a
        torn object under the name (see the module docstring).

        ``sync=False``: on local disk, no fsync at all; the object is visible to every process
        at once but survives a power loss only once :meth:`sync_objects` has synced it (for
        several puts that one sync makes durable together). Object stores ignore it.

        Example:
            >>> store = ObjectStore("memory://doc-put")
            >>> store.put_if_not_exists("wal/1", b"entry", checksummed=True)
            >>> store.put_if_not_exists("wal/1", b"again")
            Traceback (most recent call last):
            memwal_sql.errors.ObjectExistsError: wal/1 already exists
        """
        with storage_failures(f"put of {path}"):
            if self._local_root is not None and self.durable:
                self._durable_local_create(path, data, checksummed, sync)
                return
            try:
                obs.put(self._store, path, _as_bytes(data), mode="create")
            except (AlreadyExistsError, PreconditionError, FileExistsError) as e:
                raise ObjectExistsError(f"{path} already exists") from e

    def keep_spare_files(self, prefix: str) -> None:
        """Prepare files ahead of time for durable puts into the directory ``prefix``, so that
        such a put does not wait to create one (local disk only; elsewhere a no-op). For the
        hot append paths: a region writer keeps them for its WAL directory.

        Example:
            >>> import tempfile
            >>> store = ObjectStore(tempfile.mkdtemp())
            >>> store.keep_spare_files("_mem_wal/r/wal")
            >>> store.put_if_not_exists("_mem_wal/r/wal/1.arrow", b"x")
            >>> store.release_spare_files("_mem_wal/r/wal")
        """
        if self._spares is not None:
            directory = f"{self.uri}/{prefix.strip('/')}"
            with storage_failures(f"creating {prefix}"):
                self._make_dirs(directory)
            self._spares.keep(directory)

    def close(self) -> None:
        """Stop preparing spare files (and remove them); the store still works without."""
        spares, self._spares = self._spares, None
        if spares is not None:
            spares.close()

    def release_spare_files(self, prefix: str) -> None:
        """Remove the files :meth:`keep_spare_files` prepared in ``prefix``."""
        if self._spares is not None:
            self._spares.release(f"{self.uri}/{prefix.strip('/')}")

    def put(self, path: str, data: Data) -> None:
        """Create or replace ``path`` atomically (readers never see a torn object)."""
        with storage_failures(f"put of {path}"):
            obs.put(self._store, path, _as_bytes(data))

    def get(self, path: str) -> bytes:
        """Read a whole object; raise :class:`ObjectNotFoundError` if missing."""
        with storage_failures(f"get of {path}"):
            if self._local_root is not None:
                # A plain read: obstore's get and the copy out of it cost 3-5 times as much on
                # local disk (a cold read's 86 WAL entries: 54-91 ms against 14-19).
                data = self._read_local(path)
                if data is None:
                    raise ObjectNotFoundError(f"{self.uri_for(path)} does not exist")
                return data
            try:
                return bytes(obs.get(self._store, path).bytes())
            except FileNotFoundError as e:
                raise ObjectNotFoundError(f"{self.uri_for(path)} does not exist") from e

    def get_many(self, paths: Sequence[str]) -> builtins.list[bytes | None]:
        """Read whole objects, each one's bytes or None if it is missing, in the order given.

        For thousands of small objects (a claim's WAL replay): on local disk a plain read of
        each (a third of obstore's cost per call), on object stores up to
        :data:`GET_MANY_REQUESTS` requests at a time, so that the time is not the sum of
        their latencies.

        Example:
            >>> store = ObjectStore("memory://doc-get-many")
            >>> store.put("a", b"x")
            >>> store.get_many(["a", "b"])
            [b'x', None]
        """
        if isinstance(self._store, S3Store) and len(paths) > 1:
            # After a failure the rest is not read: against an endpoint that stopped answering
            # only the requests in flight wait out its timeouts, not every one queued.
            failed = threading.Event()

            def get(path: str) -> bytes | None:
                if failed.is_set():
                    raise StorageError(f"get of {path} not sent: an earlier get failed")
                try:
                    return self._get_or_none(path)
                except BaseException:
                    failed.set()
                    raise

            with ThreadPoolExecutor(min(GET_MANY_REQUESTS, len(paths))) as pool:
                return list(pool.map(get, paths))
        if self._local_root is None:
            return [self._get_or_none(path) for path in paths]
        with storage_failures(f"reading {len(paths)} objects from {self.uri}"):
            return [self._read_local(path) for path in paths]

    def _read_local(self, path: str) -> bytes | None:
        """A local object's bytes by a plain read (a third of obstore's cost per call), or
        None if it does not exist."""
        try:
            with open(f"{self.uri}/{path}", "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _get_or_none(self, path: str) -> bytes | None:
        try:
            return self.get(path)
        except ObjectNotFoundError:
            return None

    def exists(self, path: str) -> bool:
        """True if an object exists at ``path`` (a HEAD request)."""
        if self._local_root is not None:  # a stat: a tenth of obstore's head on local disk
            return os.path.isfile(f"{self.uri}/{path}")
        with storage_failures(f"head of {path}"):
            try:
                obs.head(self._store, path)
                return True
            except FileNotFoundError:
                return False

    def list(self, prefix: str) -> list[ObjectMeta]:
        """Every object under ``prefix``, sorted by path on every backend (without the
        temporary files of durable puts on local disk)."""
        with storage_failures(f"list of {prefix}"):
            out = [
                ObjectMeta(m["path"], m["size"], m["last_modified"].timestamp())
                for chunk in obs.list(self._store, prefix)
                for m in chunk
                if not is_temp_file(m["path"])
            ]
        out.sort(key=lambda m: m.path)
        return out

    def list_names(self, directory: str) -> builtins.list[str]:
        """Names (last component) of the objects directly in ``directory``, unsorted.

        A listing that needs neither sizes nor sub-directories (the positions of a WAL of
        thousands of entries, which a claim lists): one directory read on local disk, at a
        tenth of :meth:`list`'s cost there.

        Example:
            >>> store = ObjectStore("memory://doc-names")
            >>> store.put("d/a", b""); store.put("d/e/b", b"")
            >>> store.list_names("d")
            ['a']
        """
        if self._local_root is None:
            prefix = directory.strip("/") + "/"
            return [
                m.path[len(prefix) :] for m in self.list(prefix) if "/" not in m.path[len(prefix) :]
            ]
        with storage_failures(f"list of {directory}"):
            try:
                with os.scandir(self._local_root / directory.strip("/")) as entries:
                    return [e.name for e in entries if e.is_file() and not is_temp_file(e.name)]
            except (FileNotFoundError, NotADirectoryError):
                return []

    def list_dirs(self, prefix: str) -> builtins.list[str]:
        """Names (last component) of the immediate sub-directories of ``prefix``, sorted."""
        if self._local_root is not None:  # as obstore lists them, at a fifth of its cost
            try:
                with os.scandir(self._local_root / prefix.strip("/")) as entries:
                    return sorted(e.name for e in entries if e.is_dir())
            except (FileNotFoundError, NotADirectoryError):
                return []
        with storage_failures(f"list of {prefix}"):
            try:
                res = obs.list_with_delimiter(self._store, prefix.rstrip("/") + "/")
            except FileNotFoundError:
                return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in res["common_prefixes"])

    def delete(self, path: str) -> None:
        """Delete ``path``; deleting a missing object is not an error."""
        with storage_failures(f"delete of {path}"):
            try:
                obs.delete(self._store, path)
            except FileNotFoundError:
                pass

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; return how many were deleted.

        On local disk the emptied directories go too (object stores have none to leave).
        """
        paths = [m.path for m in self.list(prefix)]
        for p in paths:
            self.delete(p)
        if self._local_root is not None and prefix.strip("/"):
            shutil.rmtree(self._local_root / prefix.strip("/"), ignore_errors=True)
        return len(paths)

    def _durable_local_create(self, path: str, data: Data, checksummed: bool, sync: bool) -> None:
        assert self._local_root is not None
        dst = f"{self.uri}/{path}"
        directory, _, name = dst.rpartition("/")
        if not sync:
            self._make_dirs(directory)
            self._publish(*create_temp_file(directory, name), data, dst, path, None)
            return
        if checksummed and self._name_syncs_with_file is None:
            self._make_dirs(directory)
            self._name_syncs_with_file = _file_sync_writes_new_name(directory)
        one_flush = checksummed and bool(self._name_syncs_with_file)
        spare = self._spares.take(directory) if self._spares is not None else None
        if spare is not None:
            try:
                self._publish(*open_spare(spare), data, dst, path, one_flush)
                return
            except FileNotFoundError:
                pass  # the spare or its directory was removed meanwhile: make a new file
        self._make_dirs(directory)
        self._publish(*create_temp_file(directory, name), data, dst, path, one_flush)

    @staticmethod
    def _publish(
        tmp: str, fd: int, data: Data, dst: str, path: str, one_flush: bool | None
    ) -> None:
        """Write the temporary file ``tmp`` (open as ``fd``) and rename it to ``dst`` unless that
        exists. Ordered: fsync it before the rename and the directory after, so that a name
        never becomes durable before its data. ``one_flush``: fsync it after the rename, one
        flush for its data, its inode and its new name; None: no fsync (the caller syncs)."""
        try:
            try:
                _write_all(fd, data)
                if one_flush:
                    _start_writeback(fd)
                elif one_flush is not None:
                    _sync(fd, path)
                _rename_no_replace(tmp, dst)
            except BaseException as e:
                _unlink_if_exists(tmp)
                if isinstance(e, FileExistsError):
                    raise ObjectExistsError(f"{path} already exists") from e
                raise
            if one_flush:
                try:
                    _sync(fd, path)
                except SyncFailedError:
                    # Linux reports a failed write-back once, to this fsync: a later fsync of
                    # the object, by anyone, would succeed with its data lost. But it has its
                    # name, and a new writer may have read it and appended after it (so it is
                    # never removed): write it again, durable before it takes the name.
                    _rewrite_durably(dst, data)
                    raise
        finally:
            os.close(fd)
        if one_flush is False:
            try:
                _fsync_path(dst.rpartition("/")[0])  # the new name must survive a power loss
            except OSError as e:  # not a retryable StorageError: a retry would find the name
                raise SyncFailedError(f"fsync of the directory of {path} failed: {e}") from e

    def sync_objects(self, paths: builtins.list[str]) -> None:
        """Make the objects at ``paths`` durable (on local disk, fsync each, then the
        directories holding them); object stores need nothing.

        For objects that someone else put and may not have synced: a claiming writer syncs the
        WAL entries it replays before it appends after them.
        """
        if self._local_root is None or not self.durable or not paths:
            return
        with storage_failures(f"syncing {paths[0]} and {len(paths) - 1} more"):
            directories = set()
            for path in paths:
                full = f"{self.uri}/{path}"
                _fsync_path(full)
                directories.add(full.rpartition("/")[0])
            for directory in directories:
                _fsync_path(directory)

    def written_before_boot(self, path: str) -> bool:
        """True if the local file ``path`` was last written before this machine last started:
        the machine crashed or restarted since (always False on object stores, whose puts are
        never torn); :class:`ObjectNotFoundError` if it does not exist."""
        if self._local_root is None:
            return False
        with storage_failures(f"stat of {path}"):
            try:
                return os.stat(f"{self.uri}/{path}").st_mtime < _boot_time()
            except FileNotFoundError as e:
                raise ObjectNotFoundError(f"{self.uri_for(path)} does not exist") from e

    def move(self, path: str, to: str) -> None:
        """Rename the object ``path`` to ``to``; :class:`ObjectExistsError` if ``to`` exists,
        :class:`ObjectNotFoundError` if ``path`` does not."""
        with storage_failures(f"move of {path} to {to}"):
            if self._local_root is not None:
                self._make_dirs(f"{self.uri}/{to}".rpartition("/")[0])
                try:
                    _rename_no_replace(f"{self.uri}/{path}", f"{self.uri}/{to}")
                except FileExistsError as e:
                    raise ObjectExistsError(f"{to} already exists") from e
                except FileNotFoundError as e:
                    raise ObjectNotFoundError(f"{self.uri_for(path)} does not exist") from e
                if self.durable:
                    _fsync_path(f"{self.uri}/{path}".rpartition("/")[0])
                    _fsync_path(f"{self.uri}/{to}".rpartition("/")[0])
                return
        data = self.get(path)
        self.put_if_not_exists(to, data)
        self.delete(path)

    def sync_tree(self, prefix: str) -> None:
        """Make everything under the directory ``prefix`` durable, as a put is: on local disk,
        fsync every file and directory in it, then the directories above it up to the root.

        For trees written by others (Lance writes a generation's files without fsync), before
        a manifest that references them is committed. Object stores need nothing.
        """
        if self._local_root is None or not self.durable:
            return
        top = self._local_root / prefix.strip("/")
        with storage_failures(f"syncing {prefix}"):
            for directory, _, files in os.walk(top, topdown=False, onerror=_raise):
                for name in files:
                    _fsync_path(os.path.join(directory, name))
                _fsync_path(directory)
            self._sync_parents(top)

    def sync_written_since(self, since: float, *, skip: str = layout.MEM_WAL_DIR) -> int:
        """On local disk, fsync every file under the root (outside the directory ``skip``)
        modified since ``since`` (seconds since the epoch, with a second of slack for coarse
        file-system clocks), then the directories holding them up to the root; return how many
        files. Object stores need nothing.

        For what others write without fsync (Lance's base-table commits), before anything
        relies on it surviving a power loss: a created table; GC, which deletes generations and
        WAL entries once a base version says they are merged.
        """
        if self._local_root is None or not self.durable:
            return 0
        root, cutoff = str(self._local_root), since - 1.0
        synced, directories = 0, set()
        with storage_failures("syncing the base table's new files"):
            for directory, subdirs, names in os.walk(root, onerror=_raise_unless_gone):
                if directory == root:
                    subdirs[:] = [d for d in subdirs if d != skip]
                for name in names:
                    path = os.path.join(directory, name)
                    try:
                        if os.stat(path).st_mtime < cutoff:
                            continue
                        _fsync_path(path)
                    except FileNotFoundError:
                        continue  # removed meanwhile (a cleanup of old versions)
                    synced += 1
                    holder = directory
                    while holder not in directories and holder.startswith(root):
                        directories.add(holder)  # and the ones holding its name, up to the root
                        holder = os.path.dirname(holder)
            for directory in sorted(directories, key=len, reverse=True):
                try:
                    _fsync_path(directory)
                except FileNotFoundError:
                    pass  # removed meanwhile (an index directory a cleanup dropped)
        return synced

    def sync_root_name(self) -> None:
        """On local disk, fsync the directories above the root, so that the root's name (and
        any parent ``mkdir`` made for it) survives a power loss."""
        if self._local_root is None or not self.durable:
            return
        with storage_failures(f"syncing the name of {self.uri}"):
            for parent in self._local_root.parents:
                try:
                    _fsync_path(str(parent))
                except PermissionError:
                    pass  # a directory we may not read (e.g. mode 711): not one we created

    def _sync_parents(self, path: Path) -> None:
        """fsync the directories holding ``path``'s name and its parents' names, up to the root."""
        while path != self._local_root and self._local_root in path.parents:
            path = path.parent
            _fsync_path(str(path))

    def _make_dirs(self, directory: str) -> None:
        """Create ``directory`` and its missing parents, each new name made durable."""
        missing = []
        path = Path(directory)
        while not path.exists():
            missing.append(path)
            path = path.parent
        os.makedirs(directory, exist_ok=True)
        if missing:
            self._sync_parents(missing[0])

    def remove_temp_files(self, prefix: str, older_than: float = 60.0) -> int:
        """Delete the temporary files that puts interrupted by a crash left in the directory
        ``prefix`` (local disk only), if older than ``older_than`` seconds (spare files: a day);
        return how many."""
        if self._local_root is None:
            return 0
        removed = 0
        cutoff = time.time() - older_than
        spare_cutoff = min(cutoff, time.time() - SPARE_MAX_AGE)  # an idle writer's spares stay
        try:
            entries = list(os.scandir(f"{self.uri}/{prefix.strip('/')}"))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if is_temp_file(entry.name) and not (self._spares and self._spares.holds(entry.path)):
                try:
                    if entry.stat().st_mtime < (spare_cutoff if is_spare(entry.name) else cutoff):
                        removed += _unlink_if_exists(entry.path)
                except FileNotFoundError:
                    pass
        return removed


class storage_failures:
    """Raise the ``kinds`` of error that storage code raises (by default the object store's
    and the OS's) as :class:`StorageError`; memwal-sql's own errors pass as they are.

    A class rather than a generator: it wraps every put of a WAL entry, where a generator's
    set-up costs more than the rest of the wrapping.

    Example:
        ``with storage_failures(f"merge of {uri}"): ...``
    """

    __slots__ = ("advice", "kinds", "what")

    def __init__(
        self,
        what: str,
        *,
        kinds: tuple[type[Exception], ...] = (OSError, BaseError),
        advice: str = "",
    ) -> None:
        self.what, self.kinds, self.advice = what, kinds, advice

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, MemWalError):
            return
        if not (isinstance(exc, self.kinds) or is_io_error(exc)):
            return
        raise storage_error(self.what, exc, self.advice) from exc


def storage_error(what: str, exc: BaseException, advice: str = "") -> MemWalError:
    """The typed error for the object store's or the OS's failure ``exc`` of ``what``: its
    cause on one line and what to do next (credentials, a missing bucket, ``allow_http``, a
    path that cannot be written).

    Example:
        >>> storage_error("creating /x", OSError("Permission denied (os error 13)")).args[0]
        'creating /x failed: Permission denied (os error 13); check that this process may create and write files there'
    """
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or is_access_denied(exc):
        return AuthenticationError(
            f"{what} was refused by the object store ({exc}); check the credentials "
            "in storage_options (aws_access_key_id, aws_secret_access_key) and what they "
            "may access"
        )
    if is_commit_conflict(exc):
        return CommitConflictError(f"{what} lost a race to another commit ({exc}); run it again")
    if _NO_BUCKET in str(exc):
        named = re.search(r"<BucketName>([^<]+)</BucketName>", str(exc))
        bucket = named.group(1) if named else "BUCKET"
        return StorageError(
            f"{what} failed: the bucket {bucket!r} does not exist ({_NO_BUCKET}); "
            f"create it first (for example `aws s3 mb s3://{bucket}`), or check the uri "
            "and aws_endpoint in storage_options"
        )
    if is_unanswered(exc):
        first_line = str(exc).partition("\n")[0]  # not obstore's debug dump
        return StorageUnavailableError(
            f"{what} failed: the object store did not answer ({first_line}); check "
            "that the endpoint is up and reachable (storage_options' timeout and retries "
            "bound the wait), then run it again"
        )
    cause = storage_cause(exc)
    advice = f". {advice}" if advice else ""
    hint = next((h for needle, h in _HINTS if needle in cause), "")
    return StorageError(f"{what} failed: {cause}{advice}{hint}")


# What to do next for the object store's and the OS's failures that say too little themselves.
_HINTS = (
    (
        "builder error",  # reqwest refuses an http:// URL unless the store allows it
        "; an http:// endpoint needs allow_http=true in storage_options",
    ),
    (
        "Permission denied",
        "; check that this process may create and write files there",
    ),
    (
        "Read-only file system",
        "; the path is on a read-only file system: pick a writable one",
    ),
    (
        "Not a directory",
        "; a part of the path is a file, not a directory: check the uri",
    ),
    (
        "No such file or directory",
        "; check that the path exists, or that its parent directories can be created",
    ),
)
_RUST_SOURCE = re.compile(r",? ?/\S+\.rs:\d+:\d+")


def storage_cause(exc: BaseException) -> str:
    """The first paragraph of ``exc``'s text on one line, without the debug dump or the Rust
    source location Lance and obstore append.

    Example:
        >>> storage_cause(OSError("LanceError(IO): No such file, /x/lance-io/src/s.rs:10:2"))
        'LanceError(IO): No such file'
    """
    text = str(exc).split("\n\nDebug source:", 1)[0].split("\n\n", 1)[0]
    return " ".join(_RUST_SOURCE.sub("", text).split())


def _unlink_if_exists(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def _rename_no_replace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``; FileExistsError if ``dst`` exists (exactly one winner)."""
    if _libc is not None and hasattr(_libc, "renameat2"):
        if (
            _libc.renameat2(
                _AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE
            )
            == 0
        ):
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), dst)
        if err not in (errno.EINVAL, errno.ENOSYS):  # EINVAL: no RENAME_NOREPLACE here
            raise OSError(err, os.strerror(err), dst)
    os.link(src, dst)  # unlike rename, link never replaces
    os.unlink(src)


# statfs f_type of the file systems whose fsync of a newly named file also writes the name.
_NAME_SYNCING_FILE_SYSTEMS = {0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs"}


def _file_sync_writes_new_name(directory: str) -> bool:
    """True if ``directory`` is on a file system whose fsync of a file just renamed into it
    also makes that name durable (elsewhere a put fsyncs the directory as well)."""
    if _libc is None or not hasattr(_libc, "statfs"):
        return False
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first field, a long
    if _libc.statfs(os.fsencode(directory), buf) != 0:
        return False
    size = ctypes.sizeof(ctypes.c_long)
    f_type = int.from_bytes(buf.raw[:size], sys.byteorder) & 0xFFFFFFFF
    return f_type in _NAME_SYNCING_FILE_SYSTEMS


def _boot_time() -> float:
    """When this machine started, in seconds since the epoch (0 if unknown)."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def _rewrite_durably(dst: str, data: Data) -> None:
    """Replace the file ``dst`` by a new copy of ``data``, fsynced before it takes the name,
    then fsync the directory. Best effort: if the disk fails that too, ``dst`` stays as it is
    (the caller reports the first failure)."""
    directory, _, name = dst.rpartition("/")
    try:
        tmp, fd = create_temp_file(directory, name)
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, dst)
        except BaseException:
            _unlink_if_exists(tmp)
            raise
        _fsync_path(directory)
    except (OSError, SyncFailedError):
        pass


def _write_all(fd: int, data: Data) -> None:
    """Write ``data`` at ``fd``'s offset, its parts in order, up to ``_IOV_MAX`` of them a
    system call."""
    parts = [memoryview(p).cast("B") for p in _parts(data)]
    i = 0
    while i < len(parts):
        n = os.writev(fd, parts[i : i + _IOV_MAX])
        while i < len(parts) and n >= len(parts[i]):
            n -= len(parts[i])
            i += 1
        if n:  # a short write: the rest of this part next
            parts[i] = parts[i][n:]


def _parts(data: Data) -> Sequence[bytes | memoryview]:
    return [data] if isinstance(data, (bytes, memoryview)) else data


def _sync(fd: int, what: str) -> None:
    try:
        os.fsync(fd)
    except OSError as e:
        raise SyncFailedError(
            f"fsync of {what} failed: {e}. The disk may have dropped written data; check it, "
            "then open a new writer (it replays what the WAL holds)"
        ) from e


def _fsync_path(path: str) -> None:
    """fsync the file or directory ``path``; :class:`SyncFailedError` if that fails."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _sync(fd, path)
    finally:
        os.close(fd)


def _raise(e: OSError) -> None:
    raise e


def _raise_unless_gone(e: OSError) -> None:
    if not isinstance(e, FileNotFoundError):
        raise e


_AT_FDCWD = -100
try:
    _IOV_MAX = max(16, os.sysconf("SC_IOV_MAX"))  # buffers a writev takes; 1024 on Linux
except (AttributeError, OSError, ValueError):
    _IOV_MAX = 16  # POSIX's least
_RENAME_NOREPLACE = 1
_SYNC_FILE_RANGE_WRITE = 2
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def _start_writeback(fd: int) -> None:
    """Start writing ``fd``'s dirty pages to the device without waiting (Linux), so that the
    data is on its way while the put renames the file; the fsync then waits for less. Like
    RocksDB's ``bytes_per_sync``. A hint only: it reports nothing, and the fsync still does
    (without a wait flag it does not consume a write-back error)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def _as_bytes(data: Data) -> bytes:
    # obstore takes a memoryview (or a list) for an iterable of chunks, so hand it bytes.
    if isinstance(data, bytes):
        return data
    return bytes(data) if isinstance(data, memoryview) else b"".join(data)
