"""Many tables: MemWAL tables in a Lance directory namespace.

A namespace is a directory (local or on an object store) that Lance's ``DirectoryNamespace``
manages: a ``__manifest`` Lance dataset at its root lists child namespaces and tables, and each
table lives in a directory of its own beside it. A table created here is declared in the
namespace, then created at the location the namespace gave it as a normal MemWAL table, so every
feature works on it and Lance's own ``DirectoryNamespace`` lists and reads it.

Table ids are lists of names (``["sales", "orders"]``) or dotted strings (``"sales.orders"``):
every name but the last is a namespace, created when a table is first created in it.

Example:
    >>> import memwal_sql as mw, pyarrow as pa, tempfile
    >>> ns = mw.namespace(tempfile.mkdtemp())
    >>> orders = ns.create_table("sales.orders", pa.table({"id": [1]}), primary_key="id")
    >>> ns.list_tables("sales")
    ['orders']
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import lance_namespace as ln
from lance_namespace.errors import (
    NamespaceAlreadyExistsError,
    NamespaceNotFoundError,
)
from lance_namespace.errors import (
    TableNotFoundError as LanceTableNotFoundError,
)

from memwal_sql.errors import InvalidInputError, TableNotFoundError
from memwal_sql.namespace_client import MemWalDirectoryNamespace
from memwal_sql.table import MemWalTable, create_table, open_table

TableId = str | Sequence[str]


def table_id(name: TableId) -> list[str]:
    """``name`` as a namespace id: a list of names (``"sales.orders"`` -> ``["sales", "orders"]``).

    Example:
        >>> table_id("sales.orders"), table_id(["a", "b"])
        (['sales', 'orders'], ['a', 'b'])
    """
    parts = name.split(".") if isinstance(name, str) else list(name)
    if not parts or not all(isinstance(p, str) and p and "$" not in p for p in parts):
        raise InvalidInputError(
            f"a table id is names joined by '.' (or a list of names), none empty or holding "
            f"'$': not {name!r}"
        )
    return parts


class Namespace:
    """MemWAL tables in a Lance directory namespace at ``root`` (see the module docstring).

    Example:
        ``ns = mw.namespace("s3://bucket/warehouse", storage_options={...})``
    """

    def __init__(
        self, root: str | os.PathLike[str], storage_options: Mapping[str, str] | None = None
    ) -> None:
        self.root = os.fspath(root)
        self.storage_options = dict(storage_options or {})
        #: The namespace's Lance client: a ``DirectoryNamespace`` with atomic multi-table
        #: commits (``client.batch_commit_tables``, docs/namespace.md), which Lance's own
        #: readers and writers take as ``namespace_client=``.
        self.client = MemWalDirectoryNamespace(self.root, self.storage_options)
        self._lock = threading.Lock()  # namespaces created by this object's calls

    def __repr__(self) -> str:
        return f"Namespace({self.root!r})"

    def create_table(self, name: TableId, data_or_schema: Any, **options: Any) -> MemWalTable:
        """Create the MemWAL table ``name`` (its namespaces too, if new): the arguments of
        :func:`~memwal_sql.create_table` but the uri. A table of that name is a
        :class:`~memwal_sql.errors.TableExistsError`.

        Example:
            ``ns.create_table("sales.orders", schema, primary_key="id",
            region_spec=mw.RegionSpec.bucket("id", 8))``
        """
        tid = table_id(name)
        self._create_namespaces(tid[:-1])
        # A table of that name: the client's TableExistsError.
        declared = self.client.declare_table(ln.DeclareTableRequest(id=tid))
        try:
            return create_table(
                str(declared.location), data_or_schema, storage_options=self._options(), **options
            )
        except BaseException:
            self.client.drop_table(ln.DropTableRequest(id=tid))  # no table half made
            raise

    def open_table(self, name: TableId, **options: Any) -> MemWalTable:
        """Open the MemWAL table ``name``: the keyword arguments of
        :func:`~memwal_sql.open_table`.

        Example:
            ``orders = ns.open_table("sales.orders")``
        """
        return open_table(self.location(name), self._options(), **options)

    def location(self, name: TableId) -> str:
        """The uri of table ``name``'s directory (:class:`~memwal_sql.errors.TableNotFoundError`
        if the namespace has no such table).

        Example:
            ``mw.open_table(ns.location("sales.orders"))``
        """
        tid = table_id(name)
        try:
            described = self.client.describe_table(ln.DescribeTableRequest(id=tid))
        except (LanceTableNotFoundError, NamespaceNotFoundError) as e:
            raise TableNotFoundError(
                f"no table {'.'.join(tid)} in {self.root}; its tables are {self.table_names()}"
            ) from e
        return str(described.location)

    def list_tables(self, namespace: TableId = ()) -> list[str]:
        """The names of the tables directly in ``namespace`` (the root by default), sorted.

        Example:
            ``ns.list_tables("sales")  # ['lineitem', 'orders']``
        """
        nid = [] if namespace in ((), [], "") else table_id(namespace)
        try:
            found = self.client.list_tables(ln.ListTablesRequest(id=nid, include_declared=False))
        except NamespaceNotFoundError:
            return []
        return sorted(found.tables)

    def list_namespaces(self, namespace: TableId = ()) -> list[str]:
        """The names of the namespaces directly in ``namespace`` (the root by default), sorted.

        Example:
            ``ns.list_namespaces()  # ['sales']``
        """
        nid = [] if namespace in ((), [], "") else table_id(namespace)
        try:
            found = self.client.list_namespaces(ln.ListNamespacesRequest(id=nid))
        except NamespaceNotFoundError:
            return []
        return sorted(found.namespaces)

    def table_names(self) -> list[str]:
        """Every table in the namespace, as dotted ids, sorted.

        Example:
            ``ns.table_names()  # ['sales.lineitem', 'sales.orders']``
        """
        out = [".".join(t) for t in self._all([])]
        return sorted(out)

    def _all(self, nid: list[str]) -> list[list[str]]:
        tables = [[*nid, t] for t in self.list_tables(nid)]
        for child in self.list_namespaces(nid):
            tables += self._all([*nid, child])
        return tables

    def drop_table(self, name: TableId) -> None:
        """Remove table ``name`` and delete its directory, its MemWAL included. Close every
        writer of it first: a writer still writing would write into a directory being deleted.

        Example:
            ``ns.drop_table("sales.orders")``
        """
        tid = table_id(name)
        try:
            self.client.drop_table(ln.DropTableRequest(id=tid))
        except (LanceTableNotFoundError, NamespaceNotFoundError) as e:
            raise TableNotFoundError(f"no table {'.'.join(tid)} in {self.root}") from e

    def sql_tables(self, default_schema: str | None = None) -> NamespaceTables:
        """The namespace as a SQL session sees it (``mw.connect(namespace=ns)``): each child
        namespace a schema, ``default_schema``'s tables (the root's, if None) unqualified.

        Example:
            ``mw.connect(namespace=ns, default_schema="sales")``
        """
        return NamespaceTables(self, default_schema)

    def _create_namespaces(self, nid: list[str]) -> None:
        with self._lock:
            for depth in range(1, len(nid) + 1):
                try:
                    self.client.create_namespace(ln.CreateNamespaceRequest(id=nid[:depth]))
                except NamespaceAlreadyExistsError:
                    continue

    def _options(self) -> dict[str, str] | None:
        return dict(self.storage_options) or None


class NamespaceTables:
    """A namespace's tables by SQL schema and name (the session's ``TableDirectory``): a
    schema is a namespace at the root; the default schema is ``default_schema`` (the root's
    own tables if None). A table is opened once per session, when a query first names it."""

    def __init__(self, ns: Namespace, default_schema: str | None) -> None:
        self.ns = ns
        self.default_schema = default_schema

    def _path(self, schema: str | None) -> list[str]:
        name = schema if schema is not None else self.default_schema
        return [] if name is None else [name]

    def schemas(self) -> list[str]:
        return self.ns.list_namespaces()

    def tables(self, schema: str | None) -> list[str]:
        return self.ns.list_tables(self._path(schema))

    def open(self, schema: str | None, name: str) -> MemWalTable | None:
        try:
            return self.ns.open_table([*self._path(schema), name])
        except TableNotFoundError:
            return None


def namespace(
    root: str | os.PathLike[str], storage_options: Mapping[str, str] | None = None
) -> Namespace:
    """The directory namespace at ``root`` (created at its first table): MemWAL tables by id,
    and SQL over all of them (``mw.connect(namespace=ns)``).

    Example:
        ``ns = mw.namespace("./warehouse"); ns.create_table("sales.orders", rows, primary_key="id")``
    """
    return Namespace(root, storage_options)
