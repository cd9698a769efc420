"""Debezium change events, decoded into the upserts and deletes they stand for.

Debezium's JSON envelope (https://debezium.io/documentation/reference/stable/connectors/
postgresql.html#postgresql-events) carries ``before``, ``after``, ``op`` and ``source``, either
bare or as the ``payload`` of a ``{"schema": ..., "payload": ...}`` message:

- ``c`` (create), ``r`` (a snapshot read) and ``u`` (update): the ``after`` row is upserted;
- ``d`` (delete): the key of the ``before`` row is deleted;
- a tombstone (a null value, which Debezium sends after a delete for Kafka's log compaction)
  changes nothing.

Applied in order, only each key's last event decides its state, so a batch of events becomes
one upsert of the keys whose last event writes a row and one delete of those whose last event
deletes it. For a table with a sequence column, each event carries its sequence in that column:
the row's own value if it has one, else the event's ``source.lsn`` (PostgreSQL's log position),
else ``source.ts_ms``; then each key's event with the highest sequence decides (the later on a
tie), whatever the order the events came in.

Example:
    >>> events = [
    ...     {"op": "c", "before": None, "after": {"id": 1, "v": "a"}, "source": {"lsn": 10}},
    ...     {"op": "u", "before": {"id": 1, "v": "a"}, "after": {"id": 1, "v": "b"}, "source": {"lsn": 11}},
    ...     {"op": "d", "before": {"id": 2, "v": "x"}, "after": None, "source": {"lsn": 12}},
    ...     None,
    ... ]
    >>> changes = decode_debezium(events, ["id"])
    >>> changes.upserts, changes.deletes, changes.tombstones
    ([{'id': 1, 'v': 'b'}], [{'id': 2, 'v': 'x'}], 1)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memwal_sql.errors import InvalidInputError

_WRITES = {"c", "r", "u"}


@dataclass
class Changes:
    """What a batch of change events does: rows to upsert, and the ``before`` rows of keys to
    delete (each key in one of them at most, by its last event); how many events there were,
    and how many were tombstones, which change nothing."""

    upserts: list[dict[str, Any]] = field(default_factory=list)
    deletes: list[dict[str, Any]] = field(default_factory=list)
    tombstones: int = 0
    events: int = 0


def decode_debezium(
    events: Iterable[Any], primary_key: Sequence[str], sequence: str | None = None
) -> Changes:
    """The upserts and deletes of Debezium ``events`` (dicts, JSON text or bytes, or None for
    a tombstone), applied in the order given, or by the ``sequence`` column when given.

    Example:
        ``decode_debezium(kafka_values, ["id"], sequence="lsn").upserts``
    """
    last: dict[tuple[Any, ...], tuple[bool, dict[str, Any]]] = {}
    out = Changes()
    for n, raw in enumerate(events):
        out.events += 1
        event = _envelope(raw, n)
        if event is None:
            out.tombstones += 1
            continue
        op = event.get("op")
        if op not in _WRITES and op != "d":
            raise InvalidInputError(
                f"change event {n} has op {op!r}: Debezium's are 'c', 'r', 'u' and 'd' "
                "(a 't' truncate is not applied: delete the rows with tbl.delete(filter=...))"
            )
        row = _row(event, "after" if op in _WRITES else "before", op, n)
        key = _key(row, primary_key, n)
        if sequence is not None:
            row = {**row, sequence: _sequence(event, row, sequence, n)}
            earlier = last.get(key)
            if earlier is not None and earlier[1][sequence] > row[sequence]:
                continue  # an older event that came late changes nothing
        last[key] = (op in _WRITES, row)
    for writes, row in last.values():
        (out.upserts if writes else out.deletes).append(row)
    return out


def _envelope(raw: Any, n: int) -> dict[str, Any] | None:
    if raw is None:
        return None
    if isinstance(raw, (str, bytes, bytearray)):
        if not raw:
            return None  # an empty Kafka value: a tombstone as some converters write it
        try:
            raw = json.loads(raw)
        except ValueError as e:
            raise InvalidInputError(f"change event {n} is not JSON: {e}") from None
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InvalidInputError(
            f"change event {n} is a {type(raw).__name__}, not a Debezium envelope (an object "
            "with op, before, after and source)"
        )
    if "payload" in raw and "op" not in raw:  # the JSON converter's schemas.enable=true form
        return _envelope(raw["payload"], n)
    return raw


def _row(event: dict[str, Any], side: str, op: str, n: int) -> dict[str, Any]:
    row = event.get(side)
    if not isinstance(row, dict):
        advice = (
            " (a PostgreSQL table needs REPLICA IDENTITY to send the deleted key)"
            if side == "before"
            else ""
        )
        raise InvalidInputError(f"change event {n} (op {op!r}) has no {side!r} row{advice}")
    return row


def _sequence(event: dict[str, Any], row: dict[str, Any], sequence: str, n: int) -> Any:
    if row.get(sequence) is not None:
        return row[sequence]
    source = event.get("source") or {}
    for name in ("lsn", "ts_ms"):
        if source.get(name) is not None:
            return source[name]
    raise InvalidInputError(
        f"change event {n} has no sequence: its row has no {sequence!r} and its source no "
        "'lsn' or 'ts_ms'"
    )


def _key(row: dict[str, Any], primary_key: Sequence[str], n: int) -> tuple[Any, ...]:
    missing = [c for c in primary_key if row.get(c) is None]
    if missing:
        raise InvalidInputError(
            f"change event {n} has no value for key column(s) {missing}: the source table's "
            "key must be the MemWAL table's primary key"
        )
    return tuple(row[c] for c in primary_key)
