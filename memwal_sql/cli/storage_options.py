"""``--storage-options KEY=VALUE`` and ``--storage-options-file FILE``: the object-store options
handed to ``open_table`` / ``create_table`` (credentials, endpoint, region, ...).

Example:
    >>> parse(["aws_region=us-east-1", "allow_http=true"], None)
    {'aws_region': 'us-east-1', 'allow_http': 'true'}
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from memwal_sql.cli.failures import UsageError

HELP = "an object-store option such as aws_endpoint=http://host:9000 (repeatable)"
FILE_HELP = (
    "read object-store options from FILE: a JSON object, or KEY=VALUE lines "
    "(# comments allowed); --storage-options given too win"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("object store")
    group.add_argument(
        "--storage-options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=HELP,
    )
    group.add_argument("--storage-options-file", metavar="FILE", help=FILE_HELP)


def from_args(args: argparse.Namespace) -> dict[str, str] | None:
    """The options ``args`` name (None: none given)."""
    return parse(args.storage_options, args.storage_options_file)


def parse(pairs: Sequence[str], file: str | None) -> dict[str, str] | None:
    options = _read_file(file) if file is not None else {}
    for n, pair in enumerate(pairs, 1):
        options.update([_pair(pair, f"--storage-options value #{n}")])
    return options or None


def _read_file(path: str) -> dict[str, str]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"cannot read --storage-options-file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--storage-options-file {path} is not UTF-8 text") from None
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--storage-options-file {path} is not valid JSON: {e}") from None
        if not isinstance(data, dict) or any(isinstance(v, (dict, list)) for v in data.values()):
            raise UsageError(
                f"--storage-options-file {path} must hold one JSON object of plain values"
            )
        return {str(k): _text(v) for k, v in data.items()}
    lines = ((n, line.strip()) for n, line in enumerate(text.splitlines(), 1))
    return dict(
        _pair(line, f"line {n} of --storage-options-file {path}")
        for n, line in lines
        if line and not line.startswith("#")
    )


def _pair(text: str, where: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        # The text itself is not echoed: it may be a secret missing its "KEY=".
        raise UsageError(f"bad {where}: write KEY=VALUE, e.g. aws_region=us-east-1")
    return key.strip(), value.strip()


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
