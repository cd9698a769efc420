"""NumPy's huge-page advice on large arrays, turned off for this process.

NumPy (1.20+, on Linux) asks the kernel for transparent huge pages on every array of 4 MiB or
more (``madvise(MADV_HUGEPAGE)``). Where the kernel's THP ``defrag`` setting is ``madvise`` (a
common default), the first touch of such an array then *compacts memory* to find 2 MiB pages:
on a host whose memory is full of page cache (a table's files, read through it), that is
about 0.1 ms per fault, in the querying thread. A cold full-text search over a 10M-row base
allocates a few hundred MB of short-lived arrays (document lengths, postings, scores) and
spent 250 ms of kernel time in one 25 MB array (measured: ``user 4 ms, sys 250 ms`` for
1,960 faults), 0.2-0.9 s in all; with the advice off, the same arrays cost 30-50 ms. Lance's
own readers (Rust) never ask for huge pages.

The switch is NumPy's own (``NUMPY_MADVISE_HUGEPAGE=0`` read at its import, or the private
``_set_madvise_hugepage``, used when NumPy is already imported); a process that sets
``NUMPY_MADVISE_HUGEPAGE`` itself keeps its choice. ``tests/compat/test_upstream.py`` checks
the private call still exists.

Example:
    >>> _ = avoid_huge_page_stalls()
    >>> avoid_huge_page_stalls()  # off already (or left to the variable)
    False
"""

from __future__ import annotations

import os

import numpy as np

_ENV = "NUMPY_MADVISE_HUGEPAGE"


def avoid_huge_page_stalls() -> bool:
    """Turn NumPy's huge-page advice off unless ``NUMPY_MADVISE_HUGEPAGE`` says otherwise;
    whether it was on before (False when the variable decides or NumPy lacks the switch)."""
    if _ENV in os.environ:
        return False
    multiarray = getattr(np, "_core", None)  # NumPy >= 2
    switch = getattr(getattr(multiarray, "multiarray", None), "_set_madvise_hugepage", None)
    if switch is None:
        return False
    return bool(switch(False))


__all__ = ["avoid_huge_page_stalls"]
