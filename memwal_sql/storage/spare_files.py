"""Temporary files created ahead of time, so that a durable put does not wait for one.

A durable put on local disk writes its data to a temporary file and renames it into place.
Creating that file is the one step that does not depend on the data, and it is costly: a new
inode and a directory entry. So for the directories of hot append paths (a writer's WAL), a
background thread keeps up to ``per_directory`` empty temporary files created, refilled half at
a time, and a put takes one. RocksDB recycles WAL files and Kafka preallocates segments for the
same reason. Batches are large (32 files) because what costs a put is the thread waking up and
taking the GIL, not the files: against the floor in ``benchmarks/bench_write.py``, durable
upserts came closer to it with each larger batch, up to 32 (docs/performance.md).

Spares are never fsynced: a put's own fsync writes the file's new name (or, where it does not,
the put fsyncs the directory), and a spare that a power loss takes is simply not there. So the
thread never takes a device flush from the puts; and Linux reports a failed write-back to one
fsync only, which must be a put's.

Spares are named like the temporary files of any put (``.spare.<hex>.tmp``): listings hide them,
closing or releasing removes them, and the ones a crash leaves behind are removed like a crashed
put's leftovers, only later (:data:`SPARE_MAX_AGE`: an idle writer keeps its spares). Spares
are per process: a forked child never uses its parent's.

Example:
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> spares = SpareFiles()
    >>> spares.keep(d); spares.wait_idle()
    >>> os.path.getsize(spares.take(d))  # an empty file, now the caller's
    0
    >>> spares.take(tempfile.mkdtemp()) is None  # not kept: the caller creates its own file
    True
    >>> spares.close()
"""

from __future__ import annotations

import os
import secrets
import threading
import weakref

TEMP_SUFFIX = ".tmp"
SPARE_MAX_AGE = 24 * 3600.0
"""Seconds after which a clean-up of temporary files removes a spare nobody took."""
_SPARE_STEM = "spare"
_ALL: weakref.WeakSet[SpareFiles] = weakref.WeakSet()


def create_temp_file(directory: str, stem: str) -> tuple[str, int]:
    """A new, empty temporary file in ``directory``: its path and a descriptor open for writing."""
    path = f"{directory}/.{stem}.{secrets.token_hex(6)}{TEMP_SUFFIX}"
    return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)


def open_spare(path: str) -> tuple[str, int]:
    """Open the spare file ``path`` for writing; FileNotFoundError if it was removed meanwhile
    (any other failure removes it)."""
    try:
        return path, os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        raise
    except BaseException:
        _discard([path])
        raise


def is_temp_file(path: str) -> bool:
    """True for the name of a put's temporary file or a spare (hidden from listings)."""
    name = path.rsplit("/", 1)[-1]
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def is_spare(path: str) -> bool:
    """True for the name of a spare file."""
    return path.rsplit("/", 1)[-1].startswith(f".{_SPARE_STEM}.") and is_temp_file(path)


class SpareFiles:
    """Up to ``per_directory`` ready temporary files in each kept directory, at most
    ``max_dirs`` directories. Spares hold no file descriptor."""

    def __init__(self, per_directory: int = 64, max_dirs: int = 64) -> None:
        self.per_directory = per_directory
        self.max_dirs = max_dirs
        # Entered directly (cheaper than the Condition's with). Re-entrant: a store's finalizer
        # calls close(), and the garbage collector may run it in this class's own thread while
        # that thread holds the lock.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._ready: dict[str, list[str]] = {}  # kept directory -> paths of its spares
        self._creating: str | None = None
        self._failed: set[str] = set()  # creation failed; retried after the next take there
        self._closed = False
        self._thread: threading.Thread | None = None
        _ALL.add(self)

    def keep(self, directory: str) -> None:
        """Keep spare files ready in ``directory`` from now on (ignored beyond ``max_dirs``)."""
        with self._mutex:
            if self._closed or directory in self._ready or len(self._ready) >= self.max_dirs:
                return
            self._ready[directory] = []
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="memwal-spare-files", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def release(self, directory: str) -> None:
        """Stop keeping spare files in ``directory`` and remove its spares."""
        with self._mutex:
            while self._creating == directory:
                self._cond.wait()
            spares = self._ready.pop(directory, [])
            self._failed.discard(directory)
        _discard(spares)

    def take(self, directory: str) -> str | None:
        """The path of a spare file of ``directory``, now the caller's to write and rename or
        remove; None if none.

        When every spare is taken and more are being created, they are waited for: they are
        further along than a new file would be.
        """
        with self._mutex:
            self._failed.discard(directory)
            while self._creating == directory and not self._ready.get(directory):
                self._cond.wait()
            spares = self._ready.get(directory)
            if not spares:
                if spares is not None:
                    self._cond.notify_all()  # kept, but its last batch failed: try again
                return None
            spare = spares.pop(0)
            if self._lacks(spares):
                self._cond.notify_all()  # the thread makes the next batch
            return spare

    def holds(self, path: str) -> bool:
        """True if ``path`` is one of the spares ready here (not to be removed as a leftover)."""
        directory = path.rpartition("/")[0]
        with self._mutex:
            return path in self._ready.get(directory, ())

    def wait_idle(self) -> None:
        """Block until every kept directory has its spare files (for tests)."""
        with self._mutex:
            while self._creating is not None or self._next_directory() is not None:
                self._cond.wait()

    def close(self) -> None:
        """Remove every spare file and stop the background thread."""
        with self._mutex:
            self._closed = True
            spares = [s for ready in self._ready.values() for s in ready]
            self._ready.clear()
            self._cond.notify_all()
        _discard(spares)

    def _next_directory(self) -> str | None:
        # Caller holds the lock. The directory with the fewest spares, if any is down to half
        # (spares are made in batches, so the thread wakes once per batch, not once per put).
        lacking = [
            (len(spares), d)
            for d, spares in self._ready.items()
            if self._lacks(spares) and d not in self._failed
        ]
        return min(lacking)[1] if lacking else None

    def _lacks(self, spares: list[str]) -> bool:
        # Woken only then: a wake-up per put would take the GIL from the put.
        return 2 * len(spares) <= self.per_directory

    def _run(self) -> None:
        while True:
            with self._mutex:
                while not self._closed and (directory := self._next_directory()) is None:
                    self._cond.wait()
                if self._closed:
                    return
                # The wait above ends only once closed or once a directory lacks spares.
                assert directory is not None
                self._creating = directory
                missing = self.per_directory - len(self._ready[directory])
            made: list[str] = []
            try:
                made = _create(directory, missing)
            except Exception:
                pass
            finally:  # whatever happens, no take() or release() waits for this batch forever
                with self._mutex:
                    self._creating = None
                    ready = self._ready.get(directory)
                    if made and ready is not None and not self._closed:
                        ready.extend(made)
                        made = []
                    elif not made:
                        self._failed.add(directory)
                    self._cond.notify_all()
                _discard(made)  # released or closed meanwhile


def _create(directory: str, count: int) -> list[str]:
    """``count`` new spares in ``directory``; [] if that fails (the directory is gone, or the
    disk fails: a put then makes its own file, and reports what fails)."""
    made: list[str] = []
    try:
        for _ in range(count):
            path, fd = create_temp_file(directory, _SPARE_STEM)
            made.append(path)
            os.close(fd)
    except OSError:
        _discard(made)
        return []
    return made


def _discard(spares: list[str]) -> None:
    # Best effort: a spare left behind is removed later as a leftover.
    for path in spares:
        try:
            os.unlink(path)
        except OSError:
            pass


def _after_fork_in_child() -> None:
    # The child has one thread; the parent owns the spare files and the background thread, and
    # the lock may have been held by that thread at the fork.
    for spares in list(_ALL):
        spares._mutex = threading.RLock()
        spares._cond = threading.Condition(spares._mutex)
        spares._ready.clear()
        spares._creating = None
        spares._thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
