"""A shared/exclusive gate for a table's routed writes.

Upserts and deletes pass side by side (a durable write waits for its WAL put, and writes that
wait together share group commits); a partial update passes alone, so that no write of the same
table object lands between its read of the keys' rows and its write of the updated rows.

Example:
    >>> gate = WriteGate()
    >>> with gate.shared():
    ...     pass
    >>> with gate.exclusive():
    ...     pass
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class WriteGate:
    """Many holders of :meth:`shared`, or one of :meth:`exclusive`."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Pass beside other shared holders, not beside an exclusive one."""
        with self._changed:
            self._changed.wait_for(lambda: not self._exclusive)
            self._shared += 1
        try:
            yield
        finally:
            with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Pass alone."""
        with self._changed:
            self._changed.wait_for(lambda: not self._exclusive and not self._shared)
            self._exclusive = True
        try:
            yield
        finally:
            with self._changed:
                self._exclusive = False
                self._changed.notify_all()
