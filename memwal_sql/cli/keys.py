"""Primary-key values typed on the command line, parsed to the key columns' types.

Example:
    >>> import pyarrow as pa
    >>> schema = pa.schema([("tenant", pa.string()), ("id", pa.int64())])
    >>> parse_keys(["acme,7", "zeta,8"], schema, ("tenant", "id")).to_pydict()
    {'tenant': ['acme', 'zeta'], 'id': [7, 8]}
    >>> parse_keys(["a,b"], pa.schema([("name", pa.string())]), ("name",)).to_pydict()
    {'name': ['a,b']}
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from memwal_sql.cli.failures import UsageError


def parse_keys(texts: Sequence[str], schema: pa.Schema, key: Sequence[str]) -> pa.Table:
    """A table of the key columns holding one row per text. A composite key's parts are
    comma-separated (``tenant,id``); a single-column key is taken whole."""
    if len(key) == 1:
        parts = [[t] for t in texts]
    else:
        parts = [t.split(",") for t in texts]
        for t, p in zip(texts, parts):
            if len(p) != len(key):
                raise UsageError(
                    f"key {t!r} has {len(p)} part(s); the primary key ({', '.join(key)}) "
                    f"needs {len(key)}, comma-separated"
                )
    columns = {}
    for i, name in enumerate(key):
        target = schema.field(name).type
        values = [p[i].strip() if len(key) > 1 else p[i] for p in parts]
        columns[name] = _typed(values, target, name)
    return pa.table(columns)


def _typed(values: list[str], target: pa.DataType, column: str) -> pa.Array:
    text = pa.array(values, pa.string())
    try:
        return text.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    for v in values:  # find the value that does not parse, to name it
        try:
            pa.array([v], pa.string()).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise UsageError(
                f"key {v!r} is not a valid {target} value for key column {column!r}"
            ) from None
    raise UsageError(f"cannot parse keys for key column {column!r} of type {target}")
