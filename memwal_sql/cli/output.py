"""Writing rows to stdout: an aligned text table, CSV, or JSON Lines.

Example:
    >>> import pyarrow as pa
    >>> write_rows(pa.table({"id": [1, 20], "v": ["a", None]}), "table")
    id | v
    ---+-----
     1 | a
    20 | NULL
    (2 rows)
    >>> write_rows(pa.table({"id": [1], "v": ["a"]}), "json")
    {"id": 1, "v": "a"}
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import pyarrow as pa

OUTPUTS = ("table", "csv", "json")
OUTPUT_HELP = "table: aligned text (default); csv: with a header row; json: one object per line"
MAX_CELL = 60  # characters of one cell in the text table; longer values end in "..."


def write_rows(rows: pa.Table, output: str, out: TextIO | None = None) -> None:
    out = out if out is not None else sys.stdout
    if output == "csv":
        _csv(rows, out)
    elif output == "json":
        for row in rows.to_pylist():
            out.write(json.dumps({k: _plain(v) for k, v in row.items()}, ensure_ascii=False))
            out.write("\n")
    else:
        _text(rows, out)


def text_table(header: Sequence[str], lines: Sequence[Sequence[Any]]) -> str:
    """``lines`` under ``header`` in aligned columns, numbers right-aligned."""
    cells = [[_cell(v) for v in line] for line in lines]
    widths = [max([len(h), *(len(c[i]) for c in cells)]) for i, h in enumerate(header)]
    numeric = [
        bool(lines) and all(isinstance(line[i], (int, float)) or line[i] is None for line in lines)
        for i in range(len(header))
    ]

    def fmt(values: Sequence[str]) -> str:
        return " | ".join(
            v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)
        ).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([fmt(list(header)), rule, *(fmt(c) for c in cells)])


def size(n: float) -> str:
    """A byte count for people: ``1.5 MB``.

    Example:
        >>> size(512), size(1536)
        ('512 B', '1.5 KB')
    """
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _text(rows: pa.Table, out: TextIO) -> None:
    lines = [[row[c] for c in rows.column_names] for row in rows.to_pylist()]
    out.write(text_table(rows.column_names, lines) + "\n")
    out.write(f"({rows.num_rows} row{'' if rows.num_rows == 1 else 's'})\n")


def _csv(rows: pa.Table, out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(rows.column_names)
    for row in rows.to_pylist():
        writer.writerow(["" if v is None else _flat(v) for v in row.values()])


def _cell(value: Any) -> str:
    text = "NULL" if value is None else _flat(value)
    text = text.replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def _flat(value: Any) -> str:
    """One value as text: nested values as JSON, bytes as text or base64."""
    if isinstance(value, (list, dict)):
        return json.dumps(_plain(value), ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    plain = _plain(value)
    return plain if isinstance(plain, str) else str(plain)


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode("ascii")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)
