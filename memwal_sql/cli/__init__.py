"""The ``memwal`` command line: create, ingest, sql, lookup, inspect, merge, gc, maintain,
verify, set-aside, demo (``memwal --help``; each command's ``--help`` has examples).

A failure is one line on stderr, ``memwal: error: ...``, saying what to do next; the exit status
is 1, or 2 for a bad command line. Ctrl-C exits with status 130 and no traceback, also while the
libraries load: this module imports nothing heavy (pyarrow, Lance, DataFusion) before
:func:`main` has its SIGINT handler in place, and sets ``LANCE_LOG`` before Lance is loaded.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TextIO

import memwal_sql
from memwal_sql.cli.failures import FAILED, INTERRUPTED, describe, flatten

# Lance's Rust logger reads LANCE_LOG once, when lance is imported. "off" itself would break
# pylance's Python logger setup ("OFF" is no Python level); a spec of module directives only
# turns every Rust target off and leaves pylance's Python logger at its default.
QUIET_LANCE_LOG = "lance=off"

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``memwal`` with ``argv`` (default: the process's arguments)."""
    if os.environ.get("LANCE_LOG") in (None, memwal_sql.QUIET_LANCE_LOG):
        os.environ["LANCE_LOG"] = QUIET_LANCE_LOG  # the library's default, unless the user's
    # Loading pyarrow, Lance and DataFusion takes a second or more: a Ctrl-C meanwhile has
    # nothing to save, so it ends the process at once, quietly.
    loading = (
        threading.current_thread() is threading.main_thread()  # where signals are handled
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    if loading:
        signal.signal(signal.SIGINT, _interrupted_while_loading)
    try:
        from memwal_sql.cli import parser
    finally:
        if loading:
            signal.signal(signal.SIGINT, signal.default_int_handler)
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
    except KeyboardInterrupt as e:  # a command may say what was done (ingest's rows)
        print(f"memwal: interrupted{f': {e}' if str(e) else ''}", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    except Exception as e:
        text = describe(e)
        if text is None:  # not a failure we expect: a bug
            if args.verbose:
                import traceback

                traceback.print_exc()
            text = (
                f"unexpected {type(e).__name__}: {flatten(str(e))} "
                "(run with -v for the traceback, and please report it)"
            )
        print(f"memwal: error: {text}", file=sys.stderr)
        raise SystemExit(getattr(e, "status", FAILED)) from None


def _interrupted_while_loading(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write("memwal: interrupted\n")
    sys.stderr.flush()
    os._exit(INTERRUPTED)


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
