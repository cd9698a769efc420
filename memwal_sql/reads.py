"""The read API of a MemWalTable: scans through DataFusion, point lookups, plans.

Scans run as SQL over the table registered in a private DataFusion session, so a SQL filter
string gets exactly DataFusion's semantics (the pushed part is applied by our nodes after
deduplication, the rest by DataFusion). Lookups run the point-lookup plan directly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from exec_nodes.base import GEN, ROWADDR
from exec_nodes.keyset import KeySet
from memwal_sql.errors import InvalidInputError, SchemaMismatchError
from memwal_sql.session import (
    MemWalContext,
    MemWalDataset,
    connect,
    read_failures,
    typed_errors,
)
from memwal_sql.snapshot import take_snapshot
from planner.lookup import LookupPlan, plan_lookup

if TYPE_CHECKING:
    from memwal_sql.table import MemWalTable


class TableReads:
    """Reads of one table (see the MemWalTable methods of the same names)."""

    def __init__(self, table: MemWalTable) -> None:
        self.table = table
        self._ctx: MemWalContext | None = None
        self._lock = threading.Lock()
        self.last_lookup_plan: LookupPlan | None = None

    def _sql(self, what: str, filter: str | None, consistency: str,
             system_columns: bool) -> tuple[MemWalContext, Any, str, MemWalDataset | None]:
        """Plan ``SELECT what FROM table WHERE filter``: the context, the DataFrame, the table's
        name in the context, and the dataset this query reads (for its errors)."""
        with self._lock:
            if self._ctx is None:
                self._ctx = connect()
            name = f"t_{consistency}_{int(system_columns)}"
            self._ctx.register(name, self.table, consistency=consistency,  # type: ignore[arg-type]
                               system_columns=system_columns)
            sql = f"SELECT {what} FROM {name}" + (f" WHERE {filter}" if filter else "")
            try:
                df = self._ctx.sql(sql)
            except Exception as e:  # noqa: BLE001 - DataFusion's planning errors are untyped
                raise InvalidInputError(
                    f"invalid filter {filter!r}: {_datafusion_message(e, name)}"
                ) from e
            return self._ctx, df, name, self._ctx.memwal_schema.last_datasets.get(name)

    def _columns(self, columns: Sequence[str] | None, system_columns: bool) -> str:
        if columns is None:
            return "*"
        wanted = self._checked(columns, system_columns)
        if system_columns:
            wanted += [c for c in (GEN, ROWADDR) if c not in wanted]
        return ", ".join(_quote(c) for c in wanted)

    def _checked(self, columns: Sequence[str], system_columns: bool) -> list[str]:
        if isinstance(columns, str):
            raise InvalidInputError(f"columns must be a list of names, not the string {columns!r}")
        known = set(self.table.schema.names) | ({GEN, ROWADDR} if system_columns else set())
        unknown = [c for c in columns if c not in known]
        if unknown:
            raise SchemaMismatchError(
                f"no column(s) {unknown} in the table; its columns are {self.table.schema.names}"
                + ("" if system_columns else " (with_system_columns=True adds _gen and _rowaddr)")
            )
        return list(columns)

    def to_arrow(self, columns: Sequence[str] | None, filter: str | None, consistency: str,
                 system_columns: bool) -> pa.Table:
        _, df, _, ds = self._sql(self._columns(columns, system_columns), filter, consistency,
                                 system_columns)
        with typed_errors(ds):
            return _plain_strings(df.to_arrow_table())

    def scan(self, columns: Sequence[str] | None, filter: str | None, consistency: str,
             system_columns: bool) -> pa.RecordBatchReader:
        _, df, _, ds = self._sql(self._columns(columns, system_columns), filter, consistency,
                                 system_columns)
        with typed_errors(ds):
            stream = pa.RecordBatchReader.from_stream(df)

        def batches() -> Iterator[pa.RecordBatch]:
            with typed_errors(ds):
                yield from stream

        return pa.RecordBatchReader.from_batches(stream.schema, batches())

    def count_rows(self, filter: str | None, consistency: str) -> int:
        _, df, _, ds = self._sql("count(*) AS n", filter, consistency, False)
        with typed_errors(ds):
            return int(df.to_pydict()["n"][0])

    def explain(self, filter: str | None, columns: Sequence[str] | None,
                consistency: str) -> str:
        ctx, df, name, ds = self._sql(self._columns(columns, False), filter, consistency, False)
        with typed_errors(ds):
            df.execution_plan()  # physical planning runs our planner (get_fragments)
        plan = ctx.last_plan(name)
        assert plan is not None
        return plan.explain()

    def _lookup_plan(self, keys: Any, consistency: str) -> tuple[LookupPlan, pa.Table]:
        t = self.table
        key_table = t._rows.keys(keys)
        plan = plan_lookup(take_snapshot(t, consistency), t.store, t.region_spec,  # type: ignore[arg-type]
                           key_table)
        return plan, key_table

    def lookup(self, keys: Any, columns: Sequence[str] | None, consistency: str,
               system_columns: bool) -> pa.Table:
        names = (self._checked(columns, system_columns) if columns is not None
                 else list(self.table.schema.names))
        plan, key_table = self._lookup_plan(keys, consistency)
        self.last_lookup_plan = plan
        with read_failures(f"lookup in {self.table.uri}"):
            rows = plan.execute()
        if rows.num_rows:  # input order, first occurrence of each key
            where = KeySet(key_table).positions(rows.select(list(self.table.primary_key)))
            rows = rows.take(pa.array(np.argsort(where, kind="stable")))
        if system_columns:
            names += [c for c in (GEN, ROWADDR) if c not in names]
        return rows.select(names)

    def explain_lookup(self, keys: Any, consistency: str) -> str:
        return self._lookup_plan(keys, consistency)[0].explain()


def _datafusion_message(e: Exception, table_name: str) -> str:
    """DataFusion's error text without its prefix and the private name of the table."""
    text = str(e).removeprefix("DataFusion error: ")
    return text.replace(f"{table_name}.", "").replace(table_name, "the table")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _plain_strings(table: pa.Table) -> pa.Table:
    """Cast DataFusion's view types back to plain string/binary (Spark and pandas want those)."""
    fields = []
    changed = False
    for f in table.schema:
        if pa.types.is_string_view(f.type):
            f, changed = f.with_type(pa.string()), True
        elif pa.types.is_binary_view(f.type):
            f, changed = f.with_type(pa.binary()), True
        fields.append(f)
    return table.cast(pa.schema(fields, metadata=table.schema.metadata)) if changed else table
