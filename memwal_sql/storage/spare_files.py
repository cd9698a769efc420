"""Anonymous files created ahead of time, so that a durable put does not wait for one.

A durable put on local disk writes a new file, fsyncs it and renames it into place. Creating the
file is the one step that does not depend on the data, and on some systems it is the costliest:
on this project's CI machines (ext4 without a journal, in a VM) a new inode takes 0.3-1 ms of
system time while files are being deleted, more than the fsync. So for the directories of hot
append paths (a writer's WAL), a background thread keeps two anonymous files (``O_TMPFILE``) open
and ready; a put takes one, gives it its temporary name, and the thread makes the next while the
caller goes on. RocksDB recycles WAL files and Kafka preallocates segments for the same reason.

An unused spare is an unlinked inode: closing it, or a crash, frees it and leaves nothing behind.
Spares are per process: a forked child never uses its parent's (both would write one inode).

Example:
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> spares = SpareFiles()
    >>> spares.keep(d); spares.wait_idle()
    >>> fd = spares.take(d); os.close(fd)
    >>> spares.take(tempfile.mkdtemp()) is None  # not kept: the caller creates its own file
    True
    >>> spares.close()
"""

from __future__ import annotations

import os
import threading
import weakref

_O_TMPFILE = getattr(os, "O_TMPFILE", 0)
_ALL: weakref.WeakSet[SpareFiles] = weakref.WeakSet()


def open_anonymous(directory: str) -> int:
    """A new anonymous file in ``directory`` (open for writing); raises OSError."""
    return os.open(directory, _O_TMPFILE | os.O_WRONLY, 0o644)


class SpareFiles:
    """``per_directory`` ready anonymous files in each kept directory, at most ``max_dirs``
    directories (two file descriptors each)."""

    def __init__(self, per_directory: int = 2, max_dirs: int = 64) -> None:
        self.per_directory = per_directory
        self.max_dirs = max_dirs
        self._cond = threading.Condition()
        self._ready: dict[str, list[int]] = {}  # kept directory -> its spare files
        self._creating: str | None = None
        self._failed: set[str] = set()  # creation failed; retried after the next take there
        self._closed = False
        self._thread: threading.Thread | None = None
        _ALL.add(self)

    def keep(self, directory: str) -> None:
        """Keep spare files ready in ``directory`` from now on (ignored beyond ``max_dirs``)."""
        with self._cond:
            if self._closed or directory in self._ready or len(self._ready) >= self.max_dirs:
                return
            self._ready[directory] = []
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memwal-spare-files",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def release(self, directory: str) -> None:
        """Stop keeping spare files in ``directory`` and close its spares."""
        with self._cond:
            while self._creating == directory:
                self._cond.wait()
            fds = self._ready.pop(directory, [])
        for fd in fds:
            os.close(fd)

    def take(self, directory: str) -> int | None:
        """A spare file of ``directory``, now the caller's to write and close; None if none.

        When every spare is taken and one is being created, that one is waited for: it is
        further along than a new one would be.
        """
        with self._cond:
            self._failed.discard(directory)
            while self._creating == directory and not self._ready.get(directory):
                self._cond.wait()
            fds = self._ready.get(directory)
            if not fds:
                return None
            fd = fds.pop(0)
            self._cond.notify_all()  # the thread makes the next one
            return fd

    def wait_idle(self) -> None:
        """Block until every kept directory has its spare files (for tests)."""
        with self._cond:
            while self._creating is not None or self._next_directory() is not None:
                self._cond.wait()

    def close(self) -> None:
        """Close every spare file and stop the background thread."""
        with self._cond:
            self._closed = True
            fds = [fd for ready in self._ready.values() for fd in ready]
            self._ready.clear()
            self._cond.notify_all()
        for fd in fds:
            os.close(fd)

    def _next_directory(self) -> str | None:
        # Caller holds the lock. The directory with the fewest spares, if any lacks one.
        lacking = [
            (len(fds), d)
            for d, fds in self._ready.items()
            if len(fds) < self.per_directory and d not in self._failed
        ]
        return min(lacking)[1] if lacking else None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (directory := self._next_directory()) is None:
                    self._cond.wait()
                if self._closed:
                    return
                self._creating = directory
            try:
                fd: int | None = open_anonymous(directory)
            except OSError:
                fd = None  # the directory is gone (or not on a local file system)
            with self._cond:
                self._creating = None
                ready = self._ready.get(directory)
                if fd is not None and ready is not None and not self._closed:
                    ready.append(fd)
                    fd = None
                elif fd is None:
                    self._failed.add(directory)
                self._cond.notify_all()
            if fd is not None:
                os.close(fd)  # released or closed meanwhile


def _after_fork_in_child() -> None:
    # The child has one thread; the parent owns the spare files and the background thread, and
    # the lock may have been held by that thread at the fork.
    for spares in list(_ALL):
        spares._cond = threading.Condition()
        for ready in spares._ready.values():
            for fd in ready:
                os.close(fd)
        spares._ready.clear()
        spares._creating = None
        spares._thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
