"""Region pruning: which regions can hold rows matching a filter.

A region holds only rows whose region values equal the region's own (recorded in its
manifest). The filter, in negation normal form, is *projected* onto the region values: each
comparison on a region-spec source column becomes, through that field's transform
(:meth:`~memwal_sql.partitioning.transforms.Transform.project`), a predicate on the region value that
every matching row's region value satisfies; anything else becomes TRUE. The projection is then
evaluated against a table of the regions' values, with the same three-valued evaluator the
rows get, and a region is kept only where it is TRUE. A NULL counts as "no": in negation normal
form a NULL can never turn into TRUE, and a projected comparison is NULL only for a region
whose rows all have a NULL region value, which no row that satisfies the comparison has.

Region-spec columns must not change for a key (a key lives in one region), as the spec assumes.

Example:
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> from memwal_sql.partitioning.region_spec import RegionSpec
    >>> schema = pa.schema([("country", pa.string())])
    >>> spec = RegionSpec.identity("country").bind(schema)
    >>> pred = decode_filter(pc.field("country") == "nl", schema)
    >>> prune_regions(pred, spec, schema, [("r1", ("nl",)), ("r2", ("de",))])
    (['r1'], ['r2'])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_sql.expressions.predicate import (
    And,
    Compare,
    Const,
    InList,
    IsNull,
    Not,
    Or,
    Predicate,
    negation_normal_form,
)
from memwal_sql.expressions.substrait import decode_filter
from memwal_sql.expressions.visitors import PredicateVisitor, evaluate, visit
from memwal_sql.partitioning.region_spec import RegionSpec

__all__ = ["decode_filter", "project_onto_regions", "prune_regions"]


def project_onto_regions(predicate: Predicate, spec: RegionSpec) -> Predicate:
    """The predicate on region values (columns named by field id) implied by ``predicate``.

    Example:
        >>> import pyarrow as pa
        >>> project_onto_regions(Compare("id", "=", pa.scalar(3)), RegionSpec.bucket("id", 8))
        InList(column='bucket', values=[3], has_null=False)
    """
    return visit(negation_normal_form(predicate), _ProjectOntoRegions(spec))


class _ProjectOntoRegions(PredicateVisitor[Predicate]):
    """Each atom of a predicate in negation normal form, projected through the region-spec
    fields that read its column; what no field can say about is TRUE (may match)."""

    def __init__(self, spec: RegionSpec) -> None:
        self.spec = spec

    def visit_leaf(self, p: Predicate) -> Predicate:
        return Const(True)  # a column comparison or an opaque function: may match

    def visit_const(self, p: Const) -> Predicate:
        return Const(bool(p.value))  # NULL is never TRUE: the same as FALSE here

    def visit_compare(self, p: Compare) -> Predicate:
        return self._implied(p, p)

    visit_in_list = visit_is_null = visit_compare  # type: ignore[assignment]

    def visit_and(self, p: And, children: list[Predicate]) -> Predicate:
        return And(tuple(children))

    def visit_or(self, p: Or, children: list[Predicate]) -> Predicate:
        return Or(tuple(children))

    def visit_not(self, p: Not, child: Predicate) -> Predicate:
        atom = p.child  # in negation normal form: IsNull, InList or Opaque
        return self._implied(atom, p) if isinstance(atom, (InList, IsNull)) else Const(True)

    def _implied(self, atom: Compare | InList | IsNull, p: Predicate) -> Predicate:
        implied = []
        for f in self.spec.fields:
            if f.source_columns == (atom.column,):
                projected = f.transform_impl.project(f.field_id, p)
                if projected is not None:
                    implied.append(projected)
        if not implied:
            return Const(True)
        return implied[0] if len(implied) == 1 else And(tuple(implied))


def prune_regions(
    predicate: Predicate | None,
    spec: RegionSpec | None,
    schema: pa.Schema,
    regions: Sequence[tuple[str, Sequence[Any] | None]],
) -> tuple[list[str], list[str]]:
    """Split region ids into (kept, pruned) for ``predicate``; a region whose values are
    unknown (None) is always kept."""
    if spec is None or predicate is None or not spec.fields:
        return [r for r, _ in regions], []
    projected = project_onto_regions(predicate, spec)
    known = [(rid, values) for rid, values in regions if values is not None]
    keep: dict[str, bool] = {rid: True for rid, values in regions if values is None}
    if known:
        try:
            types = spec.result_types()
        except Exception:
            types = None
        if types is None:
            keep.update({rid: True for rid, _ in known})
        else:
            columns = {
                f.field_id: pa.array([v[i] for _, v in known], type=t)
                for i, (f, t) in enumerate(zip(spec.fields, types))
            }
            mask = pc.fill_null(evaluate(projected, pa.table(columns)), False)
            for (rid, _), kept in zip(known, np.asarray(mask.to_numpy(zero_copy_only=False))):
                keep[rid] = bool(kept)
    kept_ids = [rid for rid, _ in regions if keep[rid]]
    pruned_ids = [rid for rid, _ in regions if not keep[rid]]
    return kept_ids, pruned_ids
