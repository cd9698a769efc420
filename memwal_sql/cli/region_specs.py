"""``--region-spec`` text: one region field per transform, composed with ``+``.

Example:
    >>> parse("bucket:id:8").describe()
    'spec 1: bucket = bucket(id, 8)'
    >>> parse("identity:tenant+day:ts").describe()
    'spec 1: identity = identity(tenant); day = day(ts)'
    >>> parse("expression:id:int64:col0 % 10").describe()
    'spec 1: expression = col0 % 10 WITH (col0..) = (id) -> int64'
"""

from __future__ import annotations

import re

from memwal_sql.cli.failures import UsageError
from memwal_sql.partitioning.region_spec import RegionField, RegionSpec

FORMS = (
    "bucket:COL:N",
    "identity:COL",
    "unsharded",
    "year:COL",
    "month:COL",
    "day:COL",
    "hour:COL",
    "truncate:COL:WIDTH",
    "multi_bucket:COL1,COL2:N",
    "expression:COL1,COL2:RESULT_TYPE:SQL (over col0, col1, ...)",
)
HELP = (
    "how rows are split into regions: "
    + " | ".join(FORMS)
    + "; join fields with + (e.g. identity:tenant+bucket:id:4); default: unsharded"
)
_DATE_PARTS = ("year", "month", "day", "hour")
_KINDS = ("bucket", "identity", "unsharded", *_DATE_PARTS, "truncate", "multi_bucket", "expression")
# A "+" starts a new field only before a transform name, so an expression's SQL may hold "+".
_FIELD_BREAK = re.compile(r"\+(?=(?:" + "|".join(_KINDS) + r")(?::|\+|$))")


def parse(text: str) -> RegionSpec:
    """The region spec ``text`` describes; a :class:`UsageError` naming the accepted forms if it
    describes none."""
    parts = _FIELD_BREAK.split(text.strip())
    composed = len(parts) > 1
    used: dict[str, int] = {}
    fields = []
    for part in parts:
        kind = part.split(":", 1)[0]
        field_id = None
        if composed:  # the single-field defaults ("bucket" for Lance's three) would collide
            used[kind] = used.get(kind, 0) + 1
            field_id = kind if used[kind] == 1 else f"{kind}_{used[kind]}"
        fields.append(_field(part, field_id, text))
    return RegionSpec.compose(*fields)


def _field(part: str, field_id: str | None, text: str) -> RegionField:
    kind, _, rest = part.partition(":")
    named = {} if field_id is None else {"field_id": field_id}
    if kind == "expression":
        cols, _, rest = rest.partition(":")
        result_type, _, sql = rest.partition(":")
        if cols and result_type and sql.strip():
            return RegionField.sql(sql, _columns(cols, text), result_type, **named)
        raise _bad(text)
    args = rest.split(":") if rest else []
    if kind == "unsharded" and not args:
        return RegionField.unsharded(**named)
    if kind == "identity" and len(args) == 1 and args[0]:
        return RegionField.identity(args[0], **named)
    if kind in _DATE_PARTS and len(args) == 1 and args[0]:
        return RegionField.date_part(kind, args[0], **named)
    if kind == "bucket" and len(args) == 2 and args[0]:
        return RegionField.bucket(args[0], _count(args[1], text), **named)
    if kind == "truncate" and len(args) == 2 and args[0]:
        return RegionField.truncate(args[0], _count(args[1], text), **named)
    if kind == "multi_bucket" and len(args) == 2:
        return RegionField.multi_bucket(_columns(args[0], text), _count(args[1], text), **named)
    raise _bad(text)


def _columns(text: str, spec: str) -> list[str]:
    cols = [c.strip() for c in text.split(",")]
    if not all(cols):
        raise _bad(spec)
    return cols


def _count(text: str, spec: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise _bad(spec) from None
    if n < 1:
        raise _bad(spec)
    return n


def _bad(text: str) -> UsageError:
    return UsageError(
        f"bad --region-spec {text!r}: use {', '.join(FORMS)}, or several joined with +"
    )
