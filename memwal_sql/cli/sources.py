"""Input files: Parquet, CSV, JSON Lines or Arrow IPC, one file or a directory of them, the
format told by the extension unless ``--format`` names it.

CSV values are read as they are written: ``NaN`` is NaN in a float column, and a string column
keeps every field as text (``NA``, ``null``, an empty field: pyarrow would read these and more
as NULL). An empty field in a column of any other type (a number, a date) is NULL: pyarrow has
no other value for it, and refusing such files would refuse most exports. ``--null-values``
names the markers of NULL instead (:func:`null_values`): then a field equal to one, or empty,
is NULL in every column, as SQL reads CSV; a quoted field is always text (``""`` is the empty
string). JSON means JSON Lines, one object per line.

Example:
    >>> format_of("events.ndjson"), format_of("events.feather"), format_of("x.txt", "csv")
    ('json', 'arrow', 'csv')
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as pads

from memwal_sql.cli.failures import CliError, UsageError, flatten

FORMATS = ("parquet", "csv", "json", "arrow")
EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "json",
    ".ndjson": "json",
    ".json": "json",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
}
NULL_VALUES_HELP = (
    "comma-separated CSV values that mean NULL, e.g. 'NA,null,N/A'; then these and an empty "
    "field are NULL in every column, and a quoted field is always text. Default: none, every "
    "field of a string column is text (NaN is NaN; an empty number or date is NULL)"
)
FORMAT_HELP = (
    "input format: parquet, csv, json (JSON Lines) or arrow (IPC file or stream); default: "
    "from the extension (.parquet .pq .csv .jsonl .ndjson .json .arrow .feather .ipc)"
)


def format_of(path: str, given: str | None = None) -> str:
    """The format of the file or directory ``path``: ``given``, else told by extension."""
    if given is not None:
        return given
    p = Path(path)
    if p.is_dir():
        found = {
            EXTENSIONS[f.suffix.lower()]
            for f in p.rglob("*")
            if f.is_file() and f.suffix.lower() in EXTENSIONS and not f.name.startswith((".", "_"))
        }
        if len(found) == 1:
            return found.pop()
        what = "no files" if not found else f"files of several formats ({', '.join(sorted(found))})"
        raise UsageError(f"directory {path} holds {what} memwal can read; pass --format")
    fmt = EXTENSIONS.get(p.suffix.lower())
    if fmt is None:
        raise UsageError(
            f"cannot tell the format of {path} from its extension; pass --format "
            f"({', '.join(FORMATS)})"
        )
    return fmt


@dataclass
class Source:
    """One input file or directory, opened (its schema read)."""

    path: str
    format: str
    dataset: pads.Dataset

    @property
    def schema(self) -> pa.Schema:
        return self.dataset.schema

    def known_rows(self) -> int | None:
        """The number of rows when it is cheap to know (Parquet and Arrow: from metadata)."""
        if self.format in ("csv", "json"):
            return None
        with self._reading():
            return int(self.dataset.count_rows())

    def batches(
        self, batch_rows: int, columns: Sequence[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        with self._reading():
            for batch in self.dataset.to_batches(
                columns=list(columns) if columns is not None else None, batch_size=batch_rows
            ):
                if batch.num_rows:
                    yield batch

    def to_table(self) -> pa.Table:
        with self._reading():
            return self.dataset.to_table()

    def _reading(self) -> AbstractContextManager[None]:
        return reading(self.path, self.format)


@contextmanager
def reading(path: str, fmt: str) -> Iterator[None]:
    """Arrow's failure to parse ``path`` as ``fmt`` as a :class:`CliError`."""
    try:
        yield
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        reason = flatten(str(e))
        reason = reason.split("?: ", 1)[-1].rstrip(".")  # after "... Is this a 'csv' file?: "
        raise CliError(
            f"cannot read {path} as {fmt}: {reason}; check the file, or pass --format if its "
            "extension is wrong"
        ) from None
    except FileNotFoundError:
        raise CliError(f"no such file or directory: {path}") from None


def null_values(text: str | None) -> list[str] | None:
    """The ``--null-values`` list (None: not given).

    Example:
        >>> null_values("NA,null,N/A"), null_values(""), null_values(None)
        (['NA', 'null', 'N/A'], [''], None)
    """
    return None if text is None else text.split(",")


def open_source(
    path: str,
    fmt: str | None = None,
    column_types: Mapping[str, pa.DataType] | None = None,
    nulls: Sequence[str] | None = None,
) -> Source:
    """Open ``path`` (reading its schema). ``column_types`` are the types CSV columns are read
    as (a key ``007`` stays a string when the table says so); ``nulls`` the CSV values that
    mean NULL (see the module docstring)."""
    if not os.path.exists(path):
        raise CliError(f"no such file or directory: {path}")
    fmt = format_of(path, fmt)
    if nulls is not None and fmt != "csv":
        raise UsageError(f"--null-values applies to CSV input; {path} is {fmt}")
    with reading(path, fmt):
        return Source(path, fmt, _dataset(path, fmt, column_types or {}, nulls))


def _dataset(
    path: str, fmt: str, column_types: Mapping[str, pa.DataType], nulls: Sequence[str] | None
) -> pads.Dataset:
    if fmt == "csv":
        convert = pacsv.ConvertOptions(
            column_types=dict(column_types),
            # An empty field is NULL where a type has no empty value; string columns take
            # nulls only from markers the user names (pyarrow's own list has NA, NaN, null...).
            null_values=["", *(nulls or ())],
            strings_can_be_null=nulls is not None,
            quoted_strings_can_be_null=False,
        )
        return pads.dataset(path, format=pads.CsvFileFormat(convert_options=convert))
    if fmt == "arrow":
        try:
            return pads.dataset(path, format="ipc")
        except pa.ArrowInvalid:
            if os.path.isdir(path):
                raise
            with pa.ipc.open_stream(path) as stream:  # the IPC stream format
                return pads.dataset(stream.read_all())
    return pads.dataset(path, format=fmt)
