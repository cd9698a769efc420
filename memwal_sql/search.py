"""Search on a TableState: indexes on the base table, vector and full-text search over live data.

``tbl.create_index`` builds the index on the base table with Lance and records it in the MemWAL
index's ``maintained_indexes``, so writers know to maintain it; ``tbl.vector_search`` reads one
snapshot, searches every source and keeps each key's latest version (:mod:`planner.search`).
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from datafusion import SessionContext, Table, udtf

from memwal_sql.compat.datafusion import plain_strings
from memwal_sql.errors import InvalidInputError, MemWalError, SchemaMismatchError
from memwal_sql.expressions.predicate import And, Predicate, conjuncts
from memwal_sql.expressions.visitors import referenced_columns
from memwal_sql.formats.index_catchup import index_coverage
from memwal_sql.formats.lance_manifest import INDEX_NAME
from memwal_sql.formats.memwal_index import update_mem_wal_details
from memwal_sql.read_snapshot import ReadAt, ReadSnapshot, take_read_snapshot
from memwal_sql.reads import TableReads
from memwal_sql.session import MemWalContext, MemWalSchema, NodeDataset
from memwal_sql.storage import storage_failures
from memwal_sql.structures.vectors import METRICS
from planner.search import SearchPlan, SearchQuery, plan_search, prefetch_fts

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState

#: The largest ``k`` (and ``nprobes``, ``refine_factor``) a search takes. Below it ``k`` is
#: capped at the rows each source holds before it reaches Lance or numpy (a search never returns
#: more), so memory follows the data, never ``k``. Above it the value cannot be honoured by any
#: machine (over two billion rows in one in-memory answer) and overflows Lance's parameter types
#: (``refine_factor`` is a u32, ``k * refine_factor`` a usize), so it is refused.
MAX_SEARCH_K = 2**31 - 1

#: The longest full-text query, in UTF-8 bytes: a whole long document as the query ("more like
#: this") fits. Its handling is linear in its length (``benchmarks/bench_inputs.py``); a longer
#: one is refused rather than stall a reader.
MAX_FTS_QUERY_BYTES = 1 << 20

VECTOR_INDEX_TYPES = ("IVF_PQ", "IVF_FLAT", "IVF_HNSW_SQ", "IVF_HNSW_PQ", "IVF_SQ")
SCALAR_INDEX_TYPES = ("INVERTED", "BTREE", "BITMAP", "LABEL_LIST", "FTS")


@dataclass(frozen=True)
class IndexInfo:
    """One index of the base table, as :meth:`TableState.list_indexes` reports it.

    ``maintained``: recorded in the MemWAL index (writers maintain it); ``caught_up``: the
    index covers every row merged so far; ``lag_generations``: per region, how many merged
    generations it does not cover yet (None: unknown, the rows are read without the index).
    """

    name: str
    index_type: str
    columns: tuple[str, ...]
    maintained: bool
    caught_up: bool
    lag_generations: dict[str, int] | None


def create_index(
    table: TableState,
    column: str,
    index_type: str,
    *,
    name: str | None = None,
    replace: bool = True,
    **params: Any,
) -> IndexInfo:
    """Create ``index_type`` on ``column`` of the base table and maintain it (see
    :meth:`TableState.create_index`)."""
    kind = index_type.upper()
    if column not in table.schema.names:
        raise SchemaMismatchError(
            f"no column {column!r} in the table; its columns are {table.schema.names}"
        )
    if kind not in VECTOR_INDEX_TYPES + SCALAR_INDEX_TYPES:
        raise InvalidInputError(
            f"unknown index type {index_type!r}: one of "
            f"{', '.join(VECTOR_INDEX_TYPES + SCALAR_INDEX_TYPES)}"
        )
    ds = table.dataset()
    index_name = name or f"{column}_idx"
    with storage_failures(f"create index {index_name} on {table.uri}"):
        if kind in VECTOR_INDEX_TYPES:
            if not pa.types.is_fixed_size_list(table.schema.field(column).type):
                raise SchemaMismatchError(
                    f"a {kind} index needs a fixed-size-list vector "
                    f"column; {column!r} is "
                    f"{table.schema.field(column).type}"
                )
            ds.create_index(column, kind, name=index_name, replace=replace, **params)
        else:
            ds.create_scalar_index(
                column,
                # kind is one of SCALAR_INDEX_TYPES (checked above); lance types it as a Literal.
                "INVERTED" if kind == "FTS" else kind,  # type: ignore[arg-type]
                name=index_name,
                replace=replace,
                **params,
            )

        def maintain(details: Any) -> None:
            if index_name not in details.maintained_indexes:
                details.maintained_indexes.append(index_name)

        update_mem_wal_details(table.uri, table.store, maintain, table.storage_options or None)
    return next(i for i in list_indexes(table) if i.name == index_name)


def list_indexes(table: TableState) -> list[IndexInfo]:
    """The base table's indexes with their catch-up state (see
    :meth:`TableState.list_indexes`)."""
    ds = table.dataset()
    details = table.mem_wal_details(ds)
    maintained = set(details.maintained_indexes)
    merged = table.merged_generations(ds)
    coverage = {c.name: c for c in index_coverage(table.store, ds)}
    out = []
    for d in ds.describe_indices():
        if d.name == INDEX_NAME:
            continue
        stats = ds.index_statistics(d.name)
        stats = json.loads(stats) if isinstance(stats, str) else stats
        cov = coverage.get(d.name)
        lag = None
        if cov is not None and cov.caught_up is not None:
            lag = {rid: max(0, gen - cov.caught_up.get(rid, 0)) for rid, gen in merged.items()}
        out.append(
            IndexInfo(
                name=d.name,
                index_type=str(stats.get("index_type", "")),
                columns=tuple(d.field_names),
                maintained=details.maintain_all_indexes or d.name in maintained,
                caught_up=bool(cov is not None and cov.complete),
                lag_generations=lag,
            )
        )
    return out


def vector_column(table: TableState, column: str | None) -> str:
    """``column`` checked, or the table's only vector column."""
    vectors = [
        f.name
        for f in table.schema
        if pa.types.is_fixed_size_list(f.type) and pa.types.is_floating(f.type.value_type)
    ]
    if column is None:
        if len(vectors) != 1:
            raise InvalidInputError(
                "name the vector column (column=...): the table has "
                + (f"several: {vectors}" if vectors else "none (a fixed_size_list of floats)")
            )
        return vectors[0]
    if column not in vectors:
        raise SchemaMismatchError(
            f"{column!r} is not a vector column of the table; its vector columns are {vectors}"
        )
    return column


def text_column(table: TableState, column: str | None) -> str:
    """``column`` checked, or the table's only column with an inverted index (else its only
    string column)."""
    strings = [
        f.name
        for f in table.schema
        if pa.types.is_string(f.type)
        or pa.types.is_large_string(f.type)
        or pa.types.is_string_view(f.type)
    ]
    if column is None:
        ds = table.dataset()
        indexed = [
            d.field_names[0]
            for d in ds.describe_indices()
            if "Inverted" in d.type_url and len(d.field_names) == 1
        ]
        candidates = indexed or strings
        if len(candidates) != 1:
            raise InvalidInputError(
                "name the text column (column=...): the table has "
                + (f"several: {candidates}" if candidates else "none")
            )
        return candidates[0]
    if column not in strings:
        raise SchemaMismatchError(
            f"{column!r} is not a text column of the table; its text columns are {strings}"
        )
    return column


def query_vector(query: Any, dim: int) -> np.ndarray:
    """The query as a float32 vector of ``dim`` values."""
    try:
        q = np.asarray(
            query.to_numpy(zero_copy_only=False) if hasattr(query, "to_numpy") else query,
            dtype=np.float32,
        ).reshape(-1)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"the query must be a vector of {dim} numbers: {e}") from e
    if q.shape != (dim,):
        raise InvalidInputError(f"the query has {q.size} values; the column's vectors have {dim}")
    if not np.isfinite(q).all():
        raise InvalidInputError("the query vector has NaN or infinite values")
    return q


def _check_count(name: str, value: Any) -> None:
    """``value`` is a positive integer no larger than :data:`MAX_SEARCH_K`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{name} must be a positive integer, not {value!r}")
    if value > MAX_SEARCH_K:
        raise InvalidInputError(
            f"{name}={value} is above the limit of {MAX_SEARCH_K}; pass a smaller value "
            "(a search never returns more rows than the table holds)"
        )


def _check_text_query(query: Any) -> None:
    """``query`` is text of at most :data:`MAX_FTS_QUERY_BYTES`."""
    if not isinstance(query, str):
        raise InvalidInputError(f"a full-text query is text, not {type(query).__name__}")
    try:  # a text of more characters than the limit has more bytes: not encoded
        too_long = len(query) > MAX_FTS_QUERY_BYTES or len(query.encode()) > MAX_FTS_QUERY_BYTES
    except UnicodeEncodeError as e:
        raise InvalidInputError(
            f"the full-text query is not valid text ({e.reason} at position {e.start}); "
            "pass it without lone surrogates"
        ) from e
    if too_long:
        raise InvalidInputError(
            f"the full-text query is longer than the limit of {MAX_FTS_QUERY_BYTES} bytes "
            "(UTF-8); search with its most telling part"
        )


class TableSearch:
    """Searches of one table (see the TableState methods of the same names)."""

    def __init__(self, table: TableState, reads: TableReads) -> None:
        self.table = table
        self.reads = reads
        self.last_plan: SearchPlan | None = None

    def _filtered_snapshot(
        self, filter: str | None, consistency: ReadAt, pushed: Predicate | None = None
    ) -> tuple[ReadSnapshot, Predicate | None, Callable[[pa.Table], pa.Table] | None]:
        """The snapshot to search, the filter as a predicate tree, and a post-filter for the
        part of the filter DataFusion could not hand to the sources (None when none).
        ``pushed`` is a filter already decoded (what SQL pushes into a table function)."""
        if filter is None:
            return take_read_snapshot(self.table, consistency), pushed, None
        predicate, snapshot, residual = self.reads.pushed_filter(filter, consistency)
        post = None
        if residual:

            def post(rows: pa.Table, text: str = filter) -> pa.Table:
                ctx = SessionContext()
                df = ctx.from_arrow(rows)
                return plain_strings(df.filter(df.parse_sql_expr(text)).to_arrow_table())

        return snapshot, predicate, post

    def plan(
        self,
        search: SearchQuery,
        pushed: Predicate | None = None,
        residual: Predicate | None = None,
    ) -> SearchPlan:
        """The plan of ``search`` (checked; a text query is a full-text search): nothing is
        searched until it executes. ``pushed`` is a filter already decoded (what SQL pushes
        into a table function), ``residual`` one on the ranked rows.

        Example:
            ``tbl._search.plan(SearchQuery(query=[0.1, 0.2], k=5)).to_table()``
        """
        t = self.table
        checked = self._checked(search)
        if checked.is_text and checked.column is not None and isinstance(checked.query, str):
            # The base index's first reads start beside the snapshot (planner/search.py).
            prefetch_fts(t.uri, t.dataset, checked.column, checked.query, t.caches)
        snapshot, predicate, post = self._filtered_snapshot(
            search.filter, search.consistency, pushed
        )
        return plan_search(
            snapshot,
            t.store,
            t.region_spec,
            t.schema,
            checked,
            predicate=predicate,
            post_filter=post,
            residual=residual,
        )

    def _checked(self, search: SearchQuery) -> SearchQuery:
        """``search`` with its column named (and for a vector search its query a float32
        vector, its metric in lower case), or :class:`InvalidInputError` saying what is
        wrong."""
        t = self.table
        if search.is_text:
            column = text_column(t, search.column)
            _check_text_query(search.query)
            _check_count("k", search.k)
            return replace(search, column=column)
        column = vector_column(t, search.column)
        metric = search.metric
        if metric is not None and metric.lower() not in METRICS:
            raise InvalidInputError(f"unknown metric {metric!r}: one of {', '.join(METRICS)}")
        for name, v in (
            ("k", search.k),
            ("nprobes", search.nprobes),
            ("refine_factor", search.refine_factor),
        ):
            if v is not None:
                _check_count(name, v)
        q = query_vector(search.query, t.schema.field(column).type.list_size)
        return replace(search, query=q, column=column, metric=metric.lower() if metric else None)

    def search(self, search: SearchQuery) -> pa.Table:
        """Plan and run ``search``, bounded if the object store stops answering."""
        kind = "full-text search" if search.is_text else "vector search"

        def run() -> pa.Table:
            plan = self.plan(search)
            self.last_plan = plan
            return plan.to_table()

        return self.table.store.run_io(f"{kind} of {self.table.uri}", run)


__all__ = [
    "MAX_FTS_QUERY_BYTES",
    "MAX_SEARCH_K",
    "IndexInfo",
    "SearchQuery",
    "TableSearch",
    "create_index",
    "list_indexes",
]


def register_search_functions(ctx: MemWalContext) -> None:
    """Give ``ctx`` SQL's ``vector_search(...)`` and ``fts(...)`` table functions over its
    registered MemWAL tables."""
    for kind in ("vector_search", "fts"):
        ctx.register_udtf(udtf(_search_function(weakref.ref(ctx.memwal_schema), kind), kind))


def _search_function(schema: weakref.ref[MemWalSchema], kind: str) -> Any:
    """SQL ``vector_search('table', 'column', [q1, q2, ...], k)`` or
    ``fts('table', 'column', 'query text', k)`` over a registered MemWAL table (the column may
    be NULL: the table's only vector column, or its indexed text column)."""
    usage = (
        "vector_search('table', 'column', [0.1, 0.2, ...], k)"
        if kind == "vector_search"
        else "fts('table', 'column', 'query text', k)"
    )

    def dataset(provider: MemWalSchema | None, args: tuple[Any, ...]) -> SearchDataset:
        values = []
        for a in args:
            try:
                values.append(a.python_value().as_py())
            except Exception as e:
                raise InvalidInputError(f"{kind} takes literals: {usage}") from e
        if len(values) != 4 or not isinstance(values[0], str) or not isinstance(values[3], int):
            raise InvalidInputError(f"usage: {usage}")
        name, column, query, k = values
        entry = provider._memwal.get(name) if provider is not None else None
        if provider is None or entry is None:
            raise InvalidInputError(f"{kind}: no MemWAL table {name!r} is registered")
        table, options = entry
        consistency = options.get("consistency", "strong")
        search = SearchQuery(
            query=query,
            column=column,
            k=k,
            consistency=consistency,
            kind="vector" if kind == "vector_search" else "fts",
        )
        found = SearchDataset(table, search)
        provider.datasets.add(found)  # its errors are raised typed (see _Typed)
        return found

    def search(*args: Any) -> Table:
        provider = schema()
        try:
            return Table(dataset(provider, args))
        except MemWalError as e:
            if provider is not None:
                provider.planning_failed(e)
            raise

    return search


class SearchDataset(NodeDataset):
    """What SQL's ``vector_search('table', 'column', [...], k)`` and
    ``fts('table', 'column', 'query', k)`` read: the search's ``k`` rows. A ``WHERE`` on it is
    pushed here and becomes the search's filter (on each row's latest version, before
    ranking); terms on the score (``_distance``, ``_score``) apply to the ``k`` rows found.
    The search runs when DataFusion executes the plan, not while it plans."""

    def __init__(self, table: TableState, search: SearchQuery) -> None:
        self._table = table
        self._search = search
        self._score = "_score" if search.is_text else "_distance"
        self._schema = table.schema.append(pa.field(self._score, pa.float32()))
        self._lock = threading.Lock()
        self._reading = f"{'fts' if search.is_text else 'vector_search'} of {table.uri}"
        self.last_plan: SearchPlan | None = None

    def plan(self, predicate: Predicate | None) -> SearchPlan:
        score = self._score
        on_rows = [t for t in conjuncts(predicate) if score not in referenced_columns(t)]
        on_score = [t for t in conjuncts(predicate) if score in referenced_columns(t)]
        # The table's own search API plans it (same checks), with the pushed filter.
        plan = TableSearch(self._table, TableReads(self._table)).plan(
            self._search, pushed=_all_of(on_rows), residual=_all_of(on_score)
        )
        self.last_plan = plan
        return plan


def _all_of(terms: list[Predicate]) -> Predicate | None:
    return None if not terms else terms[0] if len(terms) == 1 else And(tuple(terms))
