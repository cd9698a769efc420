"""The ``memwal`` command line: create, ingest, sql, lookup, inspect, merge, gc, maintain,
verify, set-aside, demo (``memwal --help``; each command's ``--help`` has examples).

A failure is one line on stderr, ``memwal: error: ...``, saying what to do next; the exit status
is 1, or 2 for a bad command line. Nothing here may import Lance before :func:`main` has set
``LANCE_LOG`` (the package imports its table code on first use).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from memwal_sql.cli import parser
from memwal_sql.cli.failures import FAILED, INTERRUPTED, describe, flatten

# Lance's Rust logger reads LANCE_LOG once, when lance is imported. "off" itself would break
# pylance's Python logger setup ("OFF" is no Python level); a spec of module directives only
# turns every Rust target off and leaves pylance's Python logger at its default.
QUIET_LANCE_LOG = "lance=off"

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``memwal`` with ``argv`` (default: the process's arguments)."""
    os.environ.setdefault("LANCE_LOG", QUIET_LANCE_LOG)
    args = parser.build().parse_args(argv)
    _log_to_stderr(args.verbose)
    try:
        with _one_line_warnings():
            args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``memwal inspect --json | head -1``): stop quietly. Python
        # flushes stdout again at exit, so it is pointed at devnull first (as the docs say).
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        raise SystemExit(FAILED) from None
    except KeyboardInterrupt:
        print("memwal: interrupted", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    except Exception as e:
        text = describe(e)
        if text is None:  # not a failure we expect: a bug
            if args.verbose:
                traceback.print_exc()
            text = (
                f"unexpected {type(e).__name__}: {flatten(str(e))} "
                "(run with -v for the traceback, and please report it)"
            )
        print(f"memwal: error: {text}", file=sys.stderr)
        raise SystemExit(getattr(e, "status", FAILED)) from None


def _log_to_stderr(verbose: int) -> None:
    if not verbose:
        return
    log = logging.getLogger("memwal_sql")
    log.setLevel(logging.INFO if verbose == 1 else logging.DEBUG)
    if not any(getattr(h, "memwal_cli", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("memwal: %(levelname)s %(name)s: %(message)s"))
        handler.memwal_cli = True  # type: ignore[attr-defined]
        log.addHandler(handler)


@contextmanager
def _one_line_warnings() -> Iterator[None]:
    """The library's warnings (a torn WAL entry read past, ...) as ``memwal: warning: ...``."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        print(f"memwal: warning: {flatten(str(message))}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
