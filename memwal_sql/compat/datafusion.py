"""datafusion-python 55 quirks memwal-sql works around.

* Results may hold ``string_view``/``binary_view`` columns (DataFusion's own scans produce
  them); pandas and Spark want plain ``string``/``binary`` (:func:`plain_strings`).
* A ``SchemaProvider``'s ``table_names`` is read as an attribute and must be a list (a
  method is ignored and hides the tables from ``SHOW TABLES``): see
  :class:`memwal_sql.session.MemWalSchema`.
* A pyarrow dataset must never return zero fragments: ``UnknownPartitioning(0)`` breaks
  ``ORDER BY`` plans (``SanityCheckPlan``). Our scan plan always has partition 0.
* A pushed filter is *Exact*: DataFusion never re-checks it, and it pushes SQL ``NOT IN`` as
  pyarrow's ``~is_in``, which is true for NULL; :mod:`planner.predicate` evaluates it with
  SQL semantics instead.
"""

from __future__ import annotations

import pyarrow as pa


def plain_strings(table: pa.Table) -> pa.Table:
    """``table`` with view types cast back to plain string/binary.

    Example:
        >>> plain_strings(pa.table({"s": pa.array(["a"], pa.string_view())})).schema.field("s").type
        DataType(string)
    """
    fields = []
    changed = False
    for f in table.schema:
        if pa.types.is_string_view(f.type):
            f, changed = f.with_type(pa.string()), True
        elif pa.types.is_binary_view(f.type):
            f, changed = f.with_type(pa.binary()), True
        fields.append(f)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata)) if changed else table
