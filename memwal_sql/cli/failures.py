"""How the command line reports a failure: one line on stderr, saying what to do next.

Example:
    >>> from memwal_sql.errors import TableExistsError
    >>> one_line(TableExistsError("a table already exists at /t; use mw.open_table"))
    'a table already exists at /t; use `memwal ingest` to write to it or `memwal inspect` to look at it'
"""

from __future__ import annotations

from memwal_sql import errors

USAGE = 2  # exit status of a bad command line, as argparse's own
FAILED = 1  # exit status of a command that could not do its job
INTERRUPTED = 130  # exit status after Ctrl-C, as a shell reports a SIGINT (128 + 2)


class CliError(Exception):
    """A failure the command line explains itself; ``status`` is the exit status."""

    def __init__(self, message: str, status: int = FAILED) -> None:
        super().__init__(message)
        self.status = status


class UsageError(CliError):
    """The command line itself is wrong (exit status 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, USAGE)


# What to do next, in command-line terms, for errors whose own advice names the Python API.
_HINTS: tuple[tuple[type[BaseException], str], ...] = (
    (
        errors.TableNotFoundError,
        "check the URI and --storage-options, or create the table with `memwal create`",
    ),
    (
        errors.TableExistsError,
        "use `memwal ingest` to write to it or `memwal inspect` to look at it",
    ),
    (errors.AuthenticationError, "check the credentials given with --storage-options"),
)


def flatten(text: str) -> str:
    """``text`` on one line, without the debug dump an object-store error carries."""
    text = text.split("\nDebug source:", 1)[0]
    return "; ".join(p.strip().rstrip(":") for p in text.splitlines() if p.strip())


def one_line(e: BaseException) -> str:
    """The message of ``e`` on one line, Python-API advice replaced by command-line advice."""
    text = flatten(str(e)) or type(e).__name__
    hint = next((h for kind, h in _HINTS if isinstance(e, kind)), None)
    if hint is None:
        return text
    # Clauses that tell a Python caller what to call ("use mw.open_table") give way to the hint.
    kept = [p for p in text.split("; ") if "mw." not in p and "storage_options" not in p]
    return "; ".join([*kept, hint])


def describe(e: BaseException) -> str | None:
    """The one-line report of an error the command line expects, or None for a bug."""
    if isinstance(e, (CliError, errors.MemWalError)):
        return one_line(e)
    if isinstance(e, FileNotFoundError):
        return f"no such file or directory: {e.filename or e}"
    import pyarrow as pa  # here: the command line loads it only once Ctrl-C is handled

    if isinstance(e, pa.ArrowInvalid):
        return f"cannot read the input: {flatten(str(e))}"
    if isinstance(e, OSError):
        return flatten(str(e))
    return None
