"""The read API of a TableState: scans through DataFusion, point lookups, plans.

Scans run as SQL over the table registered in a private DataFusion session, so a SQL filter
string gets exactly DataFusion's semantics (the pushed part is applied by our nodes after
deduplication, the rest by DataFusion). A filter DataFusion pushes whole into the scan (or
none), but for plain ``LIKE`` conditions, leaves DataFusion nothing to do that Arrow cannot:
``to_arrow`` then runs the plan itself, with the predicate DataFusion pushed the first time
it saw the filter, and applies the ``LIKE`` conditions with Arrow's ``match_like``. Lookups
run the point-lookup plan directly.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datafusion import col

from memwal_sql.compat.datafusion import plain_likes, plain_strings, refuse_long_sql, scan_only
from memwal_sql.errors import InvalidFilterError, InvalidInputError, SchemaMismatchError
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.formats.source_rows import FOUND, GEN, ROWADDR, TOMBSTONE
from memwal_sql.read_snapshot import PinnedSnapshot, ReadAt, ReadSnapshot, take_read_snapshot
from memwal_sql.session import (
    MemWalContext,
    MemWalDataset,
    read_failures,
    typed_errors,
)
from memwal_sql.structures.keyset import KeySet
from planner.lookup import LookupPlan, plan_lookup

# The filters whose pushed predicate a table's reads remember (then forget all at once).
_PUSHED_FILTERS = 256
# Runs a direct scan's other partitions beside the caller's (DataFusion runs each partition
# on a thread of its own; Lance's scans and Arrow's kernels release the GIL).
_PARTITIONS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memwal-scan")
# A LIKE filter's matching rows are looked up for the columns it does not read while they are
# at most this share of the rows the pushed predicate keeps (1/4): a lookup reads a row at
# random, about three times what a scan pays per row (docs/reads.md#like-filters).
_LATE_SHARE = 4
_PINNED_NAMES = 16  # pinned snapshots a table's read context keeps registered

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState


class TableReads:
    """Reads of one table (see the TableState methods of the same names)."""

    def __init__(self, table: TableState) -> None:
        self.table = table
        self._ctx: MemWalContext | None = None
        self._lock = threading.Lock()
        self.last_lookup_plan: LookupPlan | None = None
        # Per filter text: the table schema it was planned against and how to run it without
        # DataFusion (see _pushed_whole), or None when it needs DataFusion.
        self._pushed: dict[str, tuple[pa.Schema, _Direct | None]] = {}
        # The names pinned snapshots are registered under, per (token, system columns).
        self._pinned_names: dict[tuple[str, bool], str] = {}
        self._pinned_ids = itertools.count()

    def _frame(
        self,
        columns: Sequence[str] | None,
        filter: str | None,
        consistency: ReadAt,
        system_columns: bool,
    ) -> tuple[MemWalContext, Any, str, MemWalDataset | None]:
        """A DataFrame of the table, filtered and projected: the context, the DataFrame, the
        table's name in the context, and the dataset this query reads (for its errors).

        The filter is parsed as one SQL expression against the table's columns and applied
        with ``DataFrame.filter``; it is never spliced into a statement.
        """
        with self._lock:
            if self._ctx is None:
                self._ctx = MemWalContext()
            # Weakly: the context lives in Rust, where the garbage collector cannot see a
            # cycle back to the table, and would keep every table (and its threads) alive.
            proxy = weakref.proxy(self.table)
            if isinstance(consistency, PinnedSnapshot):
                key = (consistency.token, system_columns)
                name = self._pinned_names.pop(key, None) or f"t_pinned_{next(self._pinned_ids)}"
                self._pinned_names[key] = name  # the newest last
                if len(self._pinned_names) > _PINNED_NAMES:  # the oldest snapshot's name goes
                    oldest = next(iter(self._pinned_names))
                    self._ctx.memwal_schema.remove(self._pinned_names.pop(oldest))
                consistency = PinnedSnapshot(proxy, consistency.cut)
            else:
                name = f"t_{consistency}_{int(system_columns)}"
            self._ctx.memwal_schema.add(
                name, proxy, consistency=consistency, system_columns=system_columns
            )
            ctx = self._ctx
        # Outside the lock: the table's snapshot is taken here, and a store that does not
        # answer holds it for its whole timeout.
        df = ctx.table(name)
        if filter is not None:
            df = _filtered(df, filter, name)
        if columns is not None:
            df = df.select(*(col(c) for c in self._names(columns, system_columns)))
        return ctx, df, name, ctx.memwal_schema.last_datasets.get(name)

    def _names(self, columns: Sequence[str], system_columns: bool) -> list[str]:
        wanted = self._checked(columns, system_columns)
        if system_columns:
            wanted += [c for c in (GEN, ROWADDR) if c not in wanted]
        return wanted

    def _checked(self, columns: Sequence[str], system_columns: bool) -> list[str]:
        if isinstance(columns, str):
            raise InvalidInputError(f"columns must be a list of names, not the string {columns!r}")
        known = set(self.table.schema.names) | ({GEN, ROWADDR} if system_columns else set())
        unknown = [c for c in columns if c not in known]
        if unknown:  # added since this table last looked, in another process maybe
            self.table.follow_schema(self.table.dataset())
            known |= set(self.table.schema.names)
            unknown = [c for c in columns if c not in known]
        if unknown:
            raise SchemaMismatchError(
                f"no column(s) {unknown} in the table; its columns are {self.table.schema.names}"
                + ("" if system_columns else " (with_system_columns=True adds _gen and _rowaddr)")
            )
        return list(columns)

    def to_arrow(
        self,
        columns: Sequence[str] | None,
        filter: str | None,
        consistency: ReadAt,
        system_columns: bool,
    ) -> pa.Table:
        direct = None if system_columns else self._pushed_whole(filter, consistency)
        if direct is not None:
            predicate, likes = direct
            names = None if columns is None else self._checked(columns, False)
            if names is None or len(set(names)) == len(names):
                return self._run_plan(names, predicate, consistency, likes)
        _, df, _, ds = self._frame(columns, filter, consistency, system_columns)
        with typed_errors(ds):
            return plain_strings(df.to_arrow_table())

    def _pushed_whole(self, filter: str | None, consistency: ReadAt) -> _Direct | None:
        """How to run ``filter`` without DataFusion: the predicate DataFusion pushes into the
        scan, and the plain ``LIKE`` conditions it keeps; None if it keeps anything else.
        Learnt from DataFusion's planning the first time a filter is seen (and again after a
        schema change): then remembered."""
        if filter is None:
            return None, []
        if not isinstance(filter, str):
            return None  # DataFusion's path says what is wrong with it
        schema = self.table.schema
        with self._lock:
            known = self._pushed.get(filter)
        if known is None or not known[0].equals(schema):
            _, df, _, ds = self._frame(None, filter, consistency, False)
            direct = self._scan_only(df, ds) or self._pushed_but_likes(filter, consistency)
            known = (schema, direct)
            with self._lock:
                if len(self._pushed) >= _PUSHED_FILTERS:
                    self._pushed.clear()
                self._pushed[filter] = known
        return known[1]

    def _pushed_but_likes(self, filter: str, consistency: ReadAt) -> _Direct | None:
        """The predicate DataFusion pushes for ``filter`` without its plain ``LIKE``
        conditions, and those, if it pushes all the rest; else None."""
        _, df, _, ds = self._frame(None, None, consistency, False)
        rest, likes = plain_likes(df.parse_sql_expr(filter))
        types = {f.name: f.type for f in self.table.schema}
        strings = (pa.string(), pa.large_string())
        if not likes or any(types.get(c) not in strings for c, _, _ in likes):
            return None
        for e in rest:
            df = df.filter(e)
        found = self._scan_only(df, ds)
        return None if found is None else (found[0], likes)

    def _scan_only(self, df: Any, ds: MemWalDataset | None) -> _Direct | None:
        """The predicate DataFusion pushes into the scan of ``ds`` planning ``df`` (the
        table, filtered), if its plan is that scan and nothing else; else None."""
        with typed_errors(ds):
            plan = df.execution_plan().display_indent()
        return (ds.last_predicate, []) if ds is not None and scan_only(plan) else None

    def _run_plan(
        self,
        columns: list[str] | None,
        predicate: Predicate | None,
        consistency: ReadAt,
        likes: list[tuple[str, str, bool]] | None = None,
    ) -> pa.Table:
        """The rows the scan (or point-lookup) plan of ``predicate`` yields, where every plain
        ``LIKE`` of ``likes`` holds, ``columns`` (None: every column of the snapshot's
        schema): its partitions run side by side,
        without DataFusion, which would only pass them through (about 2 ms a query on 2 cores:
        issue 38's small layout).

        With ``LIKE``s and columns they do not need, the scan reads the keys and the ``LIKE``
        columns first, and only the rows that match are then looked up, in the same snapshot,
        for the rest: Lance materializes every column of the rows its pushed predicate keeps,
        and a ``LIKE`` usually keeps few of them (the filtered scan of ``bench_scale``: 20,009
        rows read, 1,684 kept, the vectors of the others never read)."""
        table = self.table
        what = f"reading {table.uri}"
        pk = list(table.primary_key)
        likes = likes or []
        like_columns = [c for c, _, _ in likes]
        narrow = list(dict.fromkeys([*pk, *like_columns]))

        def matching(rows: pa.Table) -> pa.Table:
            return rows.filter(_like_mask(rows, likes)) if likes and rows.num_rows else rows

        def run() -> pa.Table:
            with read_failures(what):
                ds = MemWalDataset(table, consistency=consistency)
                names = ds.schema.names if columns is None else columns
                whole = list(dict.fromkeys([*names, *like_columns]))
                if not likes or set(names) <= set(narrow):
                    return matching(_execute(ds.plan(predicate), ds.project(whole))).select(names)
                scanned = _execute(ds.plan(predicate), ds.project(narrow))
                rows = matching(scanned)
                if rows.num_rows > scanned.num_rows // _LATE_SHARE:
                    # Most rows match: reading the rest whole beats looking them up one by one.
                    rows = matching(_execute(ds.plan(predicate), ds.project(whole)))
                    return rows.select(names)
                if not rows.num_rows:
                    return ds.project(names).empty_table()
                keys = rows.select(pk)
                rows = plan_lookup(ds.snapshot(), table.store, table.region_spec, keys).to_table()
                if rows.num_rows > 1:  # the scan's order
                    where = KeySet(keys).positions(rows.select(pk))
                    rows = rows.take(pa.array(np.argsort(where, kind="stable")))
                return rows.select(names).cast(ds.project(names))  # the scan's schema

        return plain_strings(table.store.while_answering(run, what))

    def scan(
        self,
        columns: Sequence[str] | None,
        filter: str | None,
        consistency: ReadAt,
        system_columns: bool,
    ) -> pa.RecordBatchReader:
        _, df, _, ds = self._frame(columns, filter, consistency, system_columns)
        with typed_errors(ds):
            # A DataFusion stream, not the Arrow C stream: the session closes the streams it
            # handed out before the interpreter exits (see memwal_sql.session._ExitGuard).
            stream = df.execute_stream()

        def batches() -> Iterator[pa.RecordBatch]:
            with typed_errors(ds):
                for batch in stream:
                    yield batch.to_pyarrow()

        return pa.RecordBatchReader.from_batches(df.schema(), batches())

    def count_rows(self, filter: str | None, consistency: ReadAt) -> int:
        _, df, _, ds = self._frame(None, filter, consistency, False)
        with typed_errors(ds):
            return int(df.count())

    def explain(
        self, filter: str | None, columns: Sequence[str] | None, consistency: ReadAt
    ) -> str:
        ctx, df, name, ds = self._frame(columns, filter, consistency, False)
        with typed_errors(ds):
            df.execution_plan()  # physical planning runs our planner (get_fragments)
        plan = ctx.last_plan(name)
        assert plan is not None
        return plan.explain()

    def pushed_filter(
        self, filter: str, consistency: ReadAt
    ) -> tuple[Predicate | None, ReadSnapshot, bool]:
        """``filter`` parsed (:class:`InvalidFilterError` if it is not one boolean expression)
        and pushed as DataFusion pushes it into a scan: the predicate tree, the snapshot the
        planning pinned, and whether DataFusion kept a part of it to itself (a function
        pyarrow cannot express) that the caller must still apply."""
        _, df, _, ds = self._frame(None, filter, consistency, False)
        with typed_errors(ds):
            plan = df.execution_plan()  # physical planning pushes the filter into the dataset
        assert ds is not None
        return ds.last_predicate, ds.snapshot(), "FilterExec" in plan.display_indent()

    def _lookup_plan(
        self, keys: Any, consistency: ReadAt, tombstones: bool = False
    ) -> tuple[LookupPlan, pa.Table]:
        t = self.table
        key_table = t._rows.keys(keys)
        plan = plan_lookup(
            take_read_snapshot(t, consistency),
            t.store,
            t.region_spec,
            key_table,
            tombstones=tombstones,
        )
        return plan, key_table

    def lookup(
        self,
        keys: Any,
        columns: Sequence[str] | None,
        consistency: ReadAt,
        system_columns: bool,
        align: bool = False,
        tombstones: bool = False,
    ) -> pa.Table:
        pk = list(self.table.primary_key)
        names = None
        if columns is not None:  # the key columns always, so rows can be matched to the keys
            asked = self._checked(columns, system_columns)
            names = pk + [c for c in asked if c not in pk]

        def find() -> tuple[pa.Table, pa.Table, pa.Schema]:
            plan, key_table = self._lookup_plan(keys, consistency, tombstones)
            self.last_lookup_plan = plan
            with read_failures(f"lookup in {self.table.uri}"):
                return plan.to_table(), key_table, plan.snapshot.schema

        rows, key_table, schema = self.table.store.while_answering(
            find, f"lookup in {self.table.uri}"
        )
        if names is None:
            names = list(schema.names)
        if system_columns:
            names += [c for c in (GEN, ROWADDR) if c not in names]
        if tombstones:
            names.append(TOMBSTONE)
        if align:  # one row per key asked for, in its place; nulls for a missing key
            at = KeySet(rows.select(pk)).positions(key_table)
            rows = rows.select(names).take(pa.array(at, mask=at < 0))
            for name in pk:
                rows = rows.set_column(names.index(name), rows.field(name), key_table.column(name))
            # A missing key's row would otherwise look like a row whose values are null.
            return rows.append_column(pa.field(FOUND, pa.bool_(), False), pa.array(at >= 0))
        if rows.num_rows > 1:  # input order, first occurrence of each key
            where = KeySet(key_table).positions(rows.select(pk))
            rows = rows.take(pa.array(np.argsort(where, kind="stable")))
        return rows.select(names)

    def explain_lookup(self, keys: Any, consistency: ReadAt) -> str:
        return self._lookup_plan(keys, consistency)[0].explain()


# A filter run without DataFusion: the predicate it pushes, and plain LIKE conditions as
# (column, pattern, negated).
_Direct = tuple[Predicate | None, list[tuple[str, str, bool]]]


def _execute(root: Any, schema: pa.Schema) -> pa.Table:
    """The rows of plan ``root``, columns ``schema``: its partitions run side by side."""

    def part(i: int) -> list[pa.RecordBatch]:
        return list(root.execute_columns(i, schema))

    others = [_PARTITIONS.submit(part, i) for i in range(root.partitions - 1)]
    last = part(root.partitions - 1)
    return pa.Table.from_batches([b for f in others for b in f.result()] + last, schema=schema)


def _like_mask(rows: pa.Table, likes: list[tuple[str, str, bool]]) -> pa.ChunkedArray:
    """Where every ``column [NOT] LIKE 'pattern'`` of ``likes`` is TRUE (SQL's NULL: false)."""
    mask = None
    for column, pattern, negated in likes:
        hit = pc.match_like(rows.column(column), pattern)
        hit = pc.invert(hit) if negated else hit
        mask = hit if mask is None else pc.and_kleene(mask, hit)
    return pc.fill_null(mask, False)


def _datafusion_message(e: Exception, table_name: str) -> str:
    """DataFusion's error text without its prefix and the private name of the table."""
    text = str(e).removeprefix("DataFusion error: ")
    return text.replace(f"{table_name}.", "").replace(table_name, "the table")


# Expression kinds a filter may not contain: it reads this table's rows one at a time.
_NOT_IN_FILTERS = {
    "Exists": "a subquery",
    "InSubquery": "a subquery",
    "ScalarSubquery": "a subquery",
    "AggregateFunction": "an aggregate",
    "WindowFunction": "a window function",
    "Placeholder": "a parameter placeholder",
    "Alias": "an alias",
    "Wildcard": "a wildcard",
}


def _filtered(df: Any, text: str, table_name: str) -> Any:
    """``df`` filtered by ``text`` parsed as one boolean DataFusion expression over its
    columns, or :class:`InvalidFilterError` saying what the text is instead."""
    if not isinstance(text, str):
        raise InvalidFilterError(f"a filter is SQL text, not {type(text).__name__}")
    refuse_long_sql(text, "the filter", InvalidFilterError)
    try:
        expr = df.parse_sql_expr(text)
    except Exception as e:
        raise InvalidFilterError(
            f"invalid filter {text!r}: {_datafusion_message(e, table_name)}; a filter is one "
            'SQL boolean expression, such as "score > 0.5 AND name IS NOT NULL"'
        ) from e
    _check_filter_parts(expr, text)
    try:
        return df.filter(expr)  # DataFusion checks the type (boolean) here
    except Exception as e:
        raise InvalidFilterError(
            f"invalid filter {text!r}: {_datafusion_message(e, table_name)}"
        ) from e


def _check_filter_parts(expr: Any, text: str) -> None:
    stack = [expr]
    while stack:  # iterative: a long IN list or OR chain is thousands of nodes deep
        node = stack.pop()
        variant = node.variant_name()
        kind = _NOT_IN_FILTERS.get(variant)
        if kind is not None:
            raise InvalidFilterError(
                f"invalid filter {text!r}: it contains {kind}; a filter "
                "is a boolean expression over the table's own columns"
            )
        if variant in ("Column", "Literal"):
            continue
        try:
            stack.extend(node.rex_call_operands())
        except Exception:
            continue
