"""Region pruning: which regions can hold rows matching a filter.

A region holds only rows whose region values equal the region's own (recorded in its manifest).
For each region the filter's predicate tree is evaluated in three-valued style: a comparison on a
region-spec source column is decided from the region's value where the transform allows it, and
everything else is "may match". A region is pruned only when the predicate is certainly false for
every row it can hold.

* ``bucket``: ``col = v`` and ``col IN (...)`` (the bucket of each literal).
* ``identity``: every comparison, exactly (the region's rows all have that value).
* ``year`` and ``truncate`` are monotone: ranges too. ``month``/``day``/``hour``: equality.
* ``multi_bucket``, ``unsharded`` and SQL expressions: no pruning.

Region-spec columns must not change for a key (a key lives in one region), as the spec assumes.

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> from memwal_sql.index.region_spec import RegionSpec
    >>> spec = RegionSpec.identity("country").bind(pa.schema([("country", pa.string())]))
    >>> pred = parse_filter(pc.field("country") == "nl", pa.schema([("country", pa.string())]))
    >>> [may_match(pred, spec, (c,), pa.schema([("country", pa.string())])) for c in ("nl", "de")]
    [True, False]
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from memwal_sql.index.region_spec import RegionField, RegionSpec
from planner.predicate import And, Cmp, In, Node, Not, Or, Unknown, parse_filter

__all__ = ["may_match", "parse_filter", "prune_regions"]

_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
            ">": operator.gt, ">=": operator.ge}
_MONOTONE = {"year", "truncate"}
_EQUALITY_ONLY = {"bucket", "month", "day", "hour"}


def may_match(node: Node | None, spec: RegionSpec, values: Sequence[Any] | None,
              schema: pa.Schema) -> bool:
    """False only if no row with region ``values`` under ``spec`` (a table of ``schema``) can
    satisfy ``node``."""
    if node is None or values is None:
        return True
    if isinstance(node, And):
        return may_match(node.left, spec, values, schema) and may_match(node.right, spec, values, schema)
    if isinstance(node, Or):
        return may_match(node.left, spec, values, schema) or may_match(node.right, spec, values, schema)
    if isinstance(node, Not):
        # Only a negated comparison can be decided; invert it.
        c = node.child
        if isinstance(c, Cmp):
            inv = {"==": "!=", "!=": "==", "<": ">=", "<=": ">", ">": "<=", ">=": "<"}[c.op]
            return may_match(Cmp(c.column, inv, c.value), spec, values, schema)
        return True
    if isinstance(node, Cmp):
        return all(_field_may_match(f, v, node.column, node.op, node.value, schema)
                   for f, v in zip(spec.fields, values))
    if isinstance(node, In):
        return any(all(_field_may_match(f, v, node.column, "==", x, schema)
                       for f, v in zip(spec.fields, values)) for x in node.values) \
            if node.values else False
    assert isinstance(node, Unknown)
    return True


def _field_may_match(field: RegionField, region_value: Any, column: str, op: str,
                     literal: Any, schema: pa.Schema) -> bool:
    if field.source_columns != (column,) or region_value is None or literal is None:
        return True
    t = field.transform
    if t == "identity":
        try:
            return bool(_COMPARE[op](region_value, literal))
        except TypeError:
            return True
    if t not in _MONOTONE and t not in _EQUALITY_ONLY:
        return True
    if op == "!=" or (t in _EQUALITY_ONLY and op != "=="):
        return True
    literal_value = _transform_literal(field, literal, schema.field(column).type)
    if literal_value is None:
        return True
    if op == "==":
        return bool(region_value == literal_value)
    # Monotone non-decreasing transform: rows below a bound have values at most transform(bound).
    return region_value <= literal_value if op in ("<", "<=") else region_value >= literal_value


def _transform_literal(field: RegionField, value: Any, typ: pa.DataType) -> Any:
    """The region value a row holding ``value`` would get (None if it cannot be computed)."""
    try:
        arr = pa.array([value], type=typ)
        return RegionSpec((field,)).region_values(
            pa.table({field.source_columns[0]: arr})).column(0)[0].as_py()
    except Exception:  # noqa: BLE001 - whatever fails here only means "cannot prune"
        return None


def prune_regions(node: Node | None, spec: RegionSpec | None, schema: pa.Schema,
                  regions: Sequence[tuple[str, Sequence[Any] | None]]) -> tuple[list[str], list[str]]:
    """Split region ids into (kept, pruned) for predicate ``node``."""
    if spec is None or node is None:
        return [r for r, _ in regions], []
    kept, pruned = [], []
    for rid, values in regions:
        (kept if may_match(node, spec, values, schema) else pruned).append(rid)
    return kept, pruned
