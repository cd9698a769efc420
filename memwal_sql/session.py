"""DataFusion integration: MemWAL tables as datasets that take a fresh snapshot per query.

DataFusion 55 cannot run Python ExecutionPlans, but it drives any ``pyarrow.dataset.Dataset``
lazily: at physical planning it calls ``get_fragments(filter)`` with the pushed-down filter (our
planner runs there: snapshot, region pruning, node tree), and at execution it pulls batches from
each fragment's scanner (our exec nodes run there, one DataFusion partition per fragment). A
Python schema provider hands DataFusion a new dataset for every query, so each query sees the
latest acknowledged writes. Pushed filters are *Exact*: the nodes apply them after deduplication.

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> tbl = mw.create_table(tempfile.mkdtemp(), pa.schema([pa.field("id", pa.int64(), False)]),
    ...                       primary_key="id")
    >>> tbl.upsert({"id": [1, 2, 3]})
    >>> ctx = mw.connect()
    >>> ctx.register("t", tbl)
    >>> ctx.sql("SELECT count(*) AS n FROM t WHERE id > 1").to_pydict()
    {'n': [2]}
"""

from __future__ import annotations

import atexit
import gc
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from datafusion import DataFrame, SessionConfig, SessionContext, SQLOptions, Table
from datafusion import catalog as dfc
from datafusion.expr import DmlStatement
from datafusion.plan import LogicalPlan

from exec_nodes.base import ExecNode
from memwal_sql.compat.datafusion import refuse_long_sql, sql_error
from memwal_sql.errors import (
    InvalidInputError,
    InvalidSnapshotError,
    MemWalError,
    StatementNotAllowedError,
)
from memwal_sql.expressions.predicate import Predicate
from memwal_sql.expressions.substrait import decode_filter
from memwal_sql.read_snapshot import (
    Consistency,
    PinnedSnapshot,
    ReadAt,
    ReadSnapshot,
    take_read_snapshot,
)
from memwal_sql.storage import ObjectStore, storage_failures
from planner.lookup import LookupPlan, lookup_keys, plan_lookup
from planner.scan import ScanPlan, output_schema, plan_scan

if TYPE_CHECKING:
    from memwal_sql.table_state import TableState

CATALOG = "memwal"
SCHEMA = "public"


class Projection:
    """What ``Dataset.scanner()`` returns to DataFusion: only the projected schema is read."""

    def __init__(self, schema: pa.Schema) -> None:
        self.projected_schema = schema


class _NodeScanner:
    """What a fragment's ``scanner()`` returns: the batches of one partition of a plan."""

    def __init__(
        self, dataset: NodeDataset, root: ExecNode, partition: int, schema: pa.Schema
    ) -> None:
        self.dataset = dataset
        self.root = root
        self.partition = partition
        self.projected_schema = schema

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        with self.dataset.recording_errors():
            store = self.dataset.store
            yield from _EXIT.steps(
                store.steps_while_answering(
                    self.root.execute_columns(self.partition, self.projected_schema),
                    self.dataset._reading,
                )
            )


class NodeFragment:
    """One DataFusion partition of a plan: DataFusion gets one per partition of the plan's
    root at planning and pulls the batches of each through its scanner at execution."""

    def __init__(self, dataset: NodeDataset, root: ExecNode, partition: int) -> None:
        self.dataset = dataset
        self.root = root
        self.partition = partition

    def scanner(
        self,
        schema: Any = None,
        columns: list[str] | None = None,
        filter: pc.Expression | None = None,
        batch_size: int | None = None,
        **_: Any,
    ) -> _NodeScanner:
        return _NodeScanner(self.dataset, self.root, self.partition, self.dataset.project(columns))


def base_partitions() -> int:
    """How many DataFusion partitions the base table is read in by a local session.

    One Lance scan already decodes on every core of Lance's own pool; on 2 cores, a second
    concurrent scan of the same base (a part each) made every query shape measured slower
    (``benchmarks/bench_read.py`` at 0.5M and 3M base rows; ``bench_tpch.py`` no different), so a part per 4 cores (a guess past 2 cores: not measured). Spark reads split
    the base for their executors instead (``partitions`` option).
    """
    return max(1, (os.cpu_count() or 2) // 4)


class RecordsErrors:
    """A dataset that remembers the first memwal-sql error its planning or reading raised:
    DataFusion hands it back as a plain Exception holding only its text, so the session
    re-raises this one (see :func:`typed_errors` and :class:`_Typed`)."""

    _reading: str  # what the dataset does, for a storage error's message
    _lock: threading.Lock
    error: MemWalError | None = None

    @contextmanager
    def recording_errors(self) -> Iterator[None]:
        try:
            with read_failures(self._reading):
                yield
        except MemWalError as e:
            with self._lock:
                self.error = self.error or e
            raise


class NodeDataset(RecordsErrors, pds.Dataset):
    """A pyarrow Dataset whose rows a plan's root node yields: ``get_fragments`` plans (one
    :class:`NodeFragment` per partition of the root), the fragments' scanners execute.
    Subclasses say how to plan (:meth:`plan`)."""

    _schema: pa.Schema
    _table: TableState

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    @property
    def store(self) -> ObjectStore:
        return self._table.store

    def project(self, columns: list[str] | None) -> pa.Schema:
        if columns is None:
            return self._schema
        return pa.schema([self._schema.field(c) for c in columns])

    def scanner(
        self,
        columns: list[str] | None = None,
        filter: Any = None,
        **_: Any,
    ) -> Projection:
        return Projection(self.project(columns))

    def get_fragments(self, filter: pc.Expression | None = None) -> list[Any]:
        with self.recording_errors():
            root = self.plan(decode_filter(filter, self._schema))
        # Every plan has a partition: DataFusion breaks on zero fragments.
        return [NodeFragment(self, root, i) for i in range(root.partitions)]

    def plan(self, predicate: Predicate | None) -> ExecNode:
        """The root node of this query's plan, for the filter DataFusion pushed."""
        raise NotImplementedError


class MemWalDataset(NodeDataset):
    """A MemWAL table as a pyarrow Dataset that DataFusion scans through our exec nodes.

    The snapshot is taken when DataFusion asks for the table (once per query) and pinned for
    the dataset's life; the dataset's schema is the snapshot's, so a column another process
    added is seen from the first query that starts after it.
    """

    def __init__(
        self,
        table: TableState,
        *,
        consistency: ReadAt = "strong",
        system_columns: bool = False,
        partitions: int | None = None,
    ) -> None:
        self._table = table
        self._consistency = consistency
        self._system_columns = system_columns
        self._partitions = partitions or base_partitions()
        self._reading = f"reading {table.uri}"
        self._lock = threading.Lock()
        with self.recording_errors():
            self._snapshot = take_read_snapshot(table, consistency)
        self._schema = output_schema(self._snapshot.schema, system_columns)
        self.last_plan: ScanPlan | LookupPlan | None = None
        #: The filter DataFusion pushed into the last plan, decoded (None: no filter).
        self.last_predicate: Predicate | None = None

    def snapshot(self) -> ReadSnapshot:
        return self._snapshot

    def plan(self, predicate: Predicate | None) -> ScanPlan | LookupPlan:
        table, snapshot = self._table, self._snapshot
        self.last_predicate = predicate
        pinned = lookup_keys(predicate, table.primary_key, snapshot.schema)
        plan: ScanPlan | LookupPlan
        if pinned is not None:  # WHERE pk = v / pk IN (...): the point-lookup plan
            keys, rest = pinned
            plan = plan_lookup(snapshot, table.store, table.region_spec, keys, rest)
        else:
            plan = plan_scan(
                snapshot,
                table.region_spec,
                snapshot.schema,
                predicate,
                system_columns=self._system_columns,
                partitions=self._partitions,
            )
        self.last_plan = plan
        return plan


class MemWalSchema(dfc.SchemaProvider):
    """The session's default schema: MemWAL tables (fresh per query) and ordinary tables."""

    def __init__(self, directory: TableDirectory | None = None, name: str | None = None) -> None:
        self._memwal: dict[str, tuple[TableState, dict[str, Any]]] = {}
        self._tables: dict[str, Any] = {}
        self._lock = threading.Lock()
        # Tables nobody registered, found by name in a namespace (None: the default schema).
        self._directory, self._name = directory, name
        self._last = threading.local()
        self.datasets: weakref.WeakSet[RecordsErrors] = weakref.WeakSet()
        self._planning = threading.local()

    @property
    def last_datasets(self) -> dict[str, MemWalDataset]:
        """The dataset each table name was last planned with *in this thread*: DataFusion asks
        for a table in the thread that plans the query, so a query finds its own dataset (its
        snapshot and pushed predicate), never one another thread's query of the same name
        made in between."""
        datasets = getattr(self._last, "datasets", None)
        if datasets is None:
            datasets = self._last.datasets = {}
        return datasets

    @contextmanager
    def planning(self, statement: str) -> Iterator[None]:
        """Around DataFusion's planning of ``statement``: refuse one too big for its parser,
        and re-raise the memwal-sql error a table function raised (DataFusion hands it back
        as a plain error holding only its text)."""
        if isinstance(statement, str):
            refuse_long_sql(statement, "the statement", InvalidInputError)
        self._planning.error = None
        try:
            yield
        except MemWalError:
            raise
        except Exception as e:
            error, self._planning.error = self._planning.error, None
            if error is not None and type(error).__name__ in str(e):
                raise error from e
            raise

    def planning_failed(self, error: MemWalError) -> None:
        """Note ``error``, which a table function is about to raise to DataFusion."""
        self._planning.error = error

    def add(self, name: str, table: TableState, **options: Any) -> None:
        with self._lock:
            self._tables.pop(name, None)
            self._memwal[name] = (table, options)

    @property
    def table_names(self) -> list[str]:  # type: ignore[override]
        # DataFusion 55 reads this as an attribute and wants a sequence.
        with self._lock:
            known = set(self._memwal) | set(self._tables)
        found = self._directory.tables(self._name) if self._directory is not None else []
        return sorted(known | set(found))

    def table_exist(self, name: str) -> bool:
        with self._lock:
            if name in self._memwal or name in self._tables:
                return True
        return self._found(name) is not None

    def _found(self, name: str) -> tuple[TableState, dict[str, Any]] | None:
        """The registration of ``name``, registering a table of the namespace by that name
        the first time it is asked for."""
        with self._lock:
            entry = self._memwal.get(name)
        if entry is not None or self._directory is None or name in self._tables:
            return entry
        table = self._directory.open(self._name, name)
        if table is None:
            return None
        with self._lock:  # another thread may have opened it too: the first one stays
            return self._memwal.setdefault(name, (table, {}))

    def table(self, name: str) -> Table | None:
        entry = self._found(name)
        if entry is None:
            with self._lock:
                return self._tables.get(name)
        table, options = entry
        try:
            dataset = MemWalDataset(table, **options)
        except MemWalError as e:  # DataFusion would hand back only its text
            self.planning_failed(e)
            raise
        self.last_datasets[name] = dataset
        self.datasets.add(dataset)
        return Table(dataset)

    def remove(self, name: str) -> None:
        with self._lock:
            self._memwal.pop(name, None)

    def memwal_table(self, name: str) -> TableState | None:
        """The MemWAL table registered as ``name`` for writes, if one is (a pinned snapshot
        registered as ``name`` is read-only: :class:`~memwal_sql.errors.InvalidSnapshotError`)."""
        entry = self._found(name)
        if entry is not None and isinstance(entry[1].get("consistency"), PinnedSnapshot):
            raise InvalidSnapshotError(
                f"{name} is a pinned snapshot, which is read-only: write to the table itself"
            )
        return entry[0] if entry is not None else None

    def register_table(self, name: str, table: Any) -> None:
        with self._lock:
            self._memwal.pop(name, None)
            self._tables[name] = table

    def deregister_table(self, name: str, cascade: bool = True) -> None:
        with self._lock:
            self._memwal.pop(name, None)
            self._tables.pop(name, None)

    def owner_name(self) -> str | None:
        return None


class TableDirectory(Protocol):
    """Where a session finds tables nobody registered (``mw.connect(namespace=...)``): by
    schema (a namespace level; None for the session's default schema) and name."""

    def schemas(self) -> list[str]:
        """The schemas it holds besides the default one."""
        ...

    def tables(self, schema: str | None) -> list[str]:
        """The names of the tables in ``schema``."""
        ...

    def open(self, schema: str | None, name: str) -> TableState | None:
        """Table ``name`` of ``schema``, opened; None if there is none."""
        ...


class _Catalog(dfc.CatalogProvider):
    def __init__(self, schema: MemWalSchema, directory: TableDirectory | None = None) -> None:
        self._schema = schema
        self._directory = directory
        self._schemas: dict[str, MemWalSchema] = {}  # a namespace's, each kept once opened
        self._lock = threading.Lock()

    def schema_names(self) -> set[str]:
        found = self._directory.schemas() if self._directory is not None else []
        return {SCHEMA, *found}

    # datafusion types this as its own Schema, but its Rust side takes any SchemaProvider.
    def schema(self, name: str) -> MemWalSchema | None:  # type: ignore[override]
        if name == SCHEMA:
            return self._schema
        if self._directory is None:
            return None
        with self._lock:
            if name not in self._schemas:
                if name not in self._directory.schemas():
                    return None
                self._schemas[name] = MemWalSchema(self._directory, name)
            return self._schemas[name]

    def register_schema(self, name: str, schema: Any) -> None:
        raise ValueError("memwal-sql sessions have one schema; register tables instead")

    def deregister_schema(self, name: str, cascade: bool) -> None:
        raise ValueError("memwal-sql sessions have one schema")


# What an untrusted session's SQL may not do: define or drop tables (CREATE EXTERNAL TABLE
# reads any file the process can), write (COPY ... TO writes anywhere, a WAL entry included),
# or change the session (SET). Queries, EXPLAIN, SHOW and DESCRIBE remain.
SAFE_SQL = SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)
# What an untrusted session plans DML with that SAFE_SQL refused: it runs it on MemWAL tables.
_SAFE_SQL_DML = SQLOptions().with_allow_ddl(False).with_allow_dml(True).with_allow_statements(False)

#: Writes a DML statement's rows to a MemWAL table (see :class:`MemWalContext`): ``(table,
#: statement, rows)`` with ``statement`` one of ``INSERT``, ``UPDATE``, ``DELETE``; returns the
#: rows affected.
WriteRows = Callable[["TableState", str, DataFrame], int]
_REFUSED = re.compile(r"(DDL|DML|Statement) not supported: (\w+)")


class MemWalContext(SessionContext):
    """A DataFusion SessionContext that also resolves MemWAL tables (see :func:`connect`).

    Unless ``trusted``, :meth:`sql` runs queries (see :data:`SAFE_SQL`) and, given
    ``write_rows``, ``INSERT``, ``UPDATE`` and ``DELETE`` on MemWAL tables: the statement's
    rows are computed at once and handed to ``write_rows``, and the result is DataFusion's one
    ``count`` row."""

    def __init__(
        self,
        config: SessionConfig | None = None,
        *,
        trusted: bool = False,
        open_table: Callable[[str, dict[str, str] | None], TableState] | None = None,
        write_rows: WriteRows | None = None,
        directory: TableDirectory | None = None,
    ) -> None:
        self.trusted = trusted
        self._open_table = open_table
        self._write_rows = write_rows
        config = (
            (config or SessionConfig())
            .with_default_catalog_and_schema(CATALOG, SCHEMA)
            .with_create_default_catalog_and_schema(False)
            .with_information_schema(True)
        )
        super().__init__(config)
        self.memwal_schema = MemWalSchema(directory)
        self._catalog = _Catalog(self.memwal_schema, directory)
        self.register_catalog_provider(CATALOG, self._catalog)

    def register(
        self,
        name: str,
        table: TableState | PinnedSnapshot | str | os.PathLike[str],
        *,
        consistency: Consistency = "strong",
        system_columns: bool = False,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        """Register a MemWAL table (or its uri, or a pinned snapshot of it) under ``name``.

        Every query that names a table reads a fresh snapshot: with ``consistency="strong"``
        all acknowledged writes, with ``"eventual"`` the flushed generations only. A pinned
        snapshot (``tbl.snapshot()``) reads its state, read-only, in every query.
        ``system_columns=True`` adds ``_gen`` (-1 for the base table) and ``_rowaddr``.

        Example:
            ``ctx.register("t_then", tbl.snapshot()); ctx.sql("SELECT count(*) FROM t_then")``
        """
        read_at: ReadAt = consistency
        if isinstance(table, PinnedSnapshot):
            read_at = table
            table = table.table
        if isinstance(table, (str, os.PathLike)):
            table = os.fspath(table)
            if self._open_table is None:
                raise InvalidInputError(
                    f"this session cannot open {table!r} by its uri; register the table "
                    "object, or use mw.connect(), whose sessions open uris"
                )
            table = self._open_table(table, storage_options)
        self.memwal_schema.add(name, table, consistency=read_at, system_columns=system_columns)

    def sql(
        self, query: str, options: SQLOptions | None = None, *args: Any, **kwargs: Any
    ) -> DataFrame:
        """Like :meth:`SessionContext.sql`; a memwal-sql error while the query (or a
        DataFrame derived from it) runs is raised as itself, not as DataFusion's plain
        ``Exception``. Without ``options``, an untrusted session refuses every statement
        but a query (:class:`~memwal_sql.errors.StatementNotAllowedError`); any session
        refuses one of more than ``MAX_SQL_OPERATORS`` operators (``InvalidInputError``).
        A statement that does not parse or plan is a :class:`~memwal_sql.errors.SqlError`
        with its line and column."""
        if options is None and not self.trusted:
            options = SAFE_SQL
        try:
            with self.memwal_schema.planning(query):
                df = super().sql(query, options, *args, **kwargs)
                statement = df.logical_plan().to_variant()
        except MemWalError:
            raise
        except Exception as e:
            refused = _REFUSED.search(str(e)) if options is SAFE_SQL else None
            if refused is not None:
                kind, name = refused.groups()
                if kind == "DML" and name != "COPY" and self._write_rows is not None:
                    return self._write(query, self._dml_on_memwal(query, name))
                raise _not_allowed(name, self._write_rows is not None) from None
            typed = sql_error(e, query) if isinstance(query, str) else None
            if typed is None:
                raise
            raise typed from None
        if isinstance(statement, DmlStatement):  # a trusted session's
            target = self._memwal_target(statement.table_name())
            if target is not None and self._write_rows is not None:
                return self._write(query, (target, statement))
            if target is not None:  # DataFusion cannot write one: say why, not "not implemented"
                raise _not_allowed(_dml_name(statement), False)
        df.df = _Typed(df.df, self.memwal_schema)
        return df

    def _dml_on_memwal(self, query: str, name: str) -> tuple[TableState, DmlStatement]:
        """The MemWAL table and statement of ``query``, which :data:`SAFE_SQL` refused as
        DML named ``name``: planned again allowing DML, and refused unless its target is a
        MemWAL table (``COPY``, also DML to DataFusion, never gets here)."""
        with self.memwal_schema.planning(query):
            statement = super().sql(query, _SAFE_SQL_DML).logical_plan().to_variant()
        if isinstance(statement, DmlStatement):
            target = self._memwal_target(statement.table_name())
            if target is not None:
                return target, statement
        raise _not_allowed(name.split()[0], True)

    def _memwal_target(self, name: str) -> TableState | None:
        *schema, table = name.split(".")
        if schema and schema[0] == CATALOG:
            schema = schema[1:]
        if len(schema) > 1:
            return None
        found = self._catalog.schema(schema[0] if schema else SCHEMA)
        return found.memwal_table(table) if found is not None else None

    def _write(self, query: str, dml: tuple[TableState, DmlStatement]) -> DataFrame:
        table, statement = dml
        name = _dml_name(statement)
        if name not in _WRITES:
            raise StatementNotAllowedError(
                f"{_DML.get(name, name)} is not supported on a MemWAL table: use INSERT INTO "
                "(an upsert), UPDATE or DELETE FROM, or tbl.upsert / tbl.delete"
            )
        rows = self.create_dataframe_from_logical_plan(LogicalPlan(statement.input()))
        rows.df = _Typed(rows.df, self.memwal_schema)
        assert self._write_rows is not None
        try:
            count = self._write_rows(table, _WRITES[name], rows)
        except MemWalError:
            raise
        except Exception as e:  # DataFusion's, computing the rows (a cast that fails, ...)
            raise sql_error(e, query) or InvalidInputError(f"{_WRITES[name]} failed: {e}") from e
        return self.from_arrow(pa.table({"count": pa.array([count], pa.uint64())}))

    def table(self, name: str) -> DataFrame:
        with self.memwal_schema.planning(name):  # a MemWAL table's snapshot is taken here
            df = super().table(name)
        df.df = _Typed(df.df, self.memwal_schema)
        return df

    def last_plan(self, name: str) -> ScanPlan | LookupPlan | None:
        """The scan plan of the last query that read MemWAL table ``name``."""
        ds = self.memwal_schema.last_datasets.get(name)
        return ds.last_plan if ds is not None else None


# Statements that change rows, by DataFusion's names (its error text and its WriteOp).
_DML = {
    "Insert": "INSERT",
    "Append": "INSERT",
    "Overwrite": "INSERT OVERWRITE",
    "Replace": "REPLACE INTO",
    "Update": "UPDATE",
    "Delete": "DELETE",
    "MergeInto": "MERGE INTO",
    "Truncate": "TRUNCATE",
}
# ... those a MemWAL table runs: INSERT as an upsert.
_WRITES = {"Append": "INSERT", "Update": "UPDATE", "Delete": "DELETE"}


def _dml_name(statement: DmlStatement) -> str:
    try:
        return str(statement.op()).rpartition(".")[2]
    except NotImplementedError:  # datafusion-python 55 has no Python WriteOp for MERGE INTO
        return "MergeInto"


def _not_allowed(statement: str, writes: bool) -> StatementNotAllowedError:
    if statement in _DML:
        why = (
            "SQL writes only MemWAL tables (INSERT INTO as an upsert, UPDATE, DELETE FROM)"
            if writes
            else "this session is read-only (connect(read_only=True), memwal sql --read-only)"
        )
        return StatementNotAllowedError(
            f"{_DML[statement]} is not supported here: {why}. Write rows with tbl.upsert(rows) "
            "or `memwal ingest URI FILE`, delete with tbl.delete(keys), tbl.delete(filter=...) "
            "or `memwal delete URI --where ...`"
        )
    return StatementNotAllowedError(
        f"{statement} is not allowed in this session: a session of mw.connect() runs queries "
        "only (no DDL, COPY, INSERT or SET, nothing that reads or writes a path). "
        "mw.connect(trusted=True), or `memwal sql --trusted`, allows them"
    )


def read_failures(what: str) -> AbstractContextManager[None]:
    """Raise Lance's and Arrow's errors of reading a table's files as :class:`StorageError`."""
    return storage_failures(
        what,
        kinds=(OSError, ValueError),
        advice="A file the region manifests or the base table name may be missing or damaged",
    )


@contextmanager
def typed_errors(dataset: MemWalDataset | None) -> Iterator[None]:
    """Re-raise the memwal-sql error behind a DataFusion failure of a query of ``dataset``
    (DataFusion turns a Python error into a plain ``Exception`` holding only its text)."""
    try:
        yield
    except MemWalError:
        raise
    except Exception as e:
        if dataset is not None and dataset.error is not None:
            raise dataset.error from e
        raise


class _ExitGuard:
    """Keeps DataFusion's threads out of Python while the interpreter shuts down.

    A stream left partly read (``execute_stream()`` then exit) has DataFusion threads still
    pulling batches from Python generators. One that reaches for the GIL once the interpreter
    is finalizing is ended by a forced unwind through Rust frames, which aborts the process
    ("FATAL: exception not rethrown", exit 134): upstream behaviour of datafusion-python with
    any Python-backed dataset. At exit, before finalization, the open streams are dropped
    (which cancels their tasks) and the threads are given time to leave Python.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0  # generator steps running on DataFusion's threads
        self._used = False  # no scan ran: nothing to wait for at exit
        self.streams: weakref.WeakSet[_Typed] = weakref.WeakSet()

    def steps(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, with each step counted while it runs."""
        it = iter(batches)
        self._used = True
        while True:
            with self._lock:
                self._busy += 1
            try:
                batch = next(it, None)
            finally:
                with self._lock:
                    self._busy -= 1
            if batch is None:
                return
            yield batch

    def close_streams(self, timeout: float = 10.0) -> None:
        if not self._used:
            return
        for stream in list(self.streams):
            stream._inner = None  # the only reference: the Rust stream is dropped
        gc.collect()
        deadline = time.monotonic() + timeout
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.01)  # releases the GIL: the steps run to their end
        time.sleep(0.05)  # and their threads get back into Rust, where cancellation stops them


_EXIT = _ExitGuard()
atexit.register(_EXIT.close_streams)


class _Typed:
    """DataFusion's internal DataFrame or batch stream, with each call's failure re-raised as
    the memwal-sql error behind it (DataFusion keeps only its text). What the calls return
    (derived DataFrames, streams) is wrapped too."""

    __slots__ = ("__weakref__", "_inner", "_schema")

    def __init__(self, inner: Any, schema: MemWalSchema) -> None:
        self._inner = inner
        self._schema = schema

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(a._inner if isinstance(a, _Typed) else a for a in args)
            kwargs = {k: v._inner if isinstance(v, _Typed) else v for k, v in kwargs.items()}
            with self._typed():
                return self._wrap(attr(*args, **kwargs))

        return call

    def _wrap(self, out: Any) -> Any:
        kind = type(out).__name__
        if kind == "DataFrame":  # datafusion's internal class
            return _Typed(out, self._schema)
        if kind == "RecordBatchStream":
            return self._stream(out)
        if isinstance(out, list) and out and type(out[0]).__name__ == "RecordBatchStream":
            return [self._stream(s) for s in out]
        return out

    def _stream(self, stream: Any) -> _Typed:
        typed = _Typed(stream, self._schema)
        _EXIT.streams.add(typed)
        return typed

    @contextmanager
    def _typed(self) -> Iterator[None]:
        try:
            yield
        except MemWalError:
            raise
        except Exception as e:
            text = str(e)
            for dataset in list(self._schema.datasets):
                error = dataset.error
                if error is not None and type(error).__name__ in text:
                    raise error from e
            raise

    def __iter__(self) -> _Typed:
        return self

    def __next__(self) -> Any:
        with self._typed():
            return next(self._inner)

    def __aiter__(self) -> _Typed:
        return self

    async def __anext__(self) -> Any:
        with self._typed():
            return await self._inner.__anext__()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        with self._typed():
            return self._inner.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        with self._typed():
            return repr(self._inner)

    def _repr_html_(self) -> str:
        with self._typed():
            return str(self._inner._repr_html_())
