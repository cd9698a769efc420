"""A Lance directory namespace whose ``batch_commit_tables`` commits several tables at once.

:class:`MemWalDirectoryNamespace` is a :class:`lance.namespace.DirectoryNamespace` (so Lance
reads and writes through it as through its own) that implements the namespace spec's
``BatchCommitTables`` the way the RFC (``spec/004``) describes, over what pylance 14 offers:

1. **Stage.** Each table's new version is written as a manifest Lance does not read yet:
   ``_versions/<name>.manifest-<uuid>`` (:meth:`MemWalDirectoryNamespace.stage_version`).
2. **Commit.** One ``Overwrite`` of the ``__manifest`` dataset, conditional on the version the
   batch validated against, records every table's new version in its ``table`` row's
   ``metadata`` (``memwal.version``, ``memwal.manifest_path``). This is the atomic point; a
   batch that loses the race re-reads ``__manifest`` and validates again (bounded retries).
3. **Promote.** Each staged manifest is renamed (copied, on an object store) to its final
   name if that does not exist. ``__manifest`` is the truth: a promotion a crash interrupted
   is finished by the next batch or by a read through this client.

Readers through this client (``lance.dataset(namespace_client=ns, table_id=...)``) open the
version ``__manifest`` records for a table, so they see every table of a batch advance
together. Lance 14 keeps no table versions in ``__manifest`` and refuses to write one that holds
rows of another type, hence the ``metadata`` keys. docs/namespace.md has the design.

Example:
    >>> import tempfile, lance, pyarrow as pa
    >>> ns = MemWalDirectoryNamespace(tempfile.mkdtemp())
    >>> _ = ns.declare_table(ln.DeclareTableRequest(id=["t"]))
    >>> staged = ns.stage_version(["t"], lance.LanceOperation.Overwrite(
    ...     pa.schema([("id", pa.int64())]), []))
    >>> _ = ns.batch_commit_tables(ln.BatchCommitTablesRequest(operations=[staged.operation]))
    >>> ns.published_version(["t"])
    1
"""

from __future__ import annotations

import copy
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlparse

import lance
import lance_namespace as ln
import pyarrow as pa
import pyarrow.compute as pc
from lance.namespace import DirectoryNamespace
from lance_namespace import LanceNamespace
from lance_namespace.errors import NamespaceAlreadyExistsError

from memwal_sql.compat.lance import is_commit_conflict, is_not_found
from memwal_sql.errors import (
    CorruptTableError,
    InvalidBatchError,
    MemWalError,
    NamespaceConflictError,
    ObjectExistsError,
    SnapshotExpiredError,
    StorageError,
    TableExistsError,
    TableNotFoundError,
)
from memwal_sql.storage import ObjectStore

MANIFEST_DIR = "__manifest"
VERSION_KEY = "memwal.version"
"""``metadata`` key of a ``table`` row: the table version readers through the namespace open."""
MANIFEST_KEY = "memwal.manifest_path"
"""The final manifest of that version, relative to the namespace root."""
STAGED_KEY = "memwal.staged_path"
"""The staged manifest to promote to ``MANIFEST_KEY``; dropped once a later commit saw it done."""
DELETED_KEY = "memwal.deleted_versions"
"""Versions a ``DeleteTableVersions`` removed (``"3-5,9-9"``): hidden from readers at once,
their manifests deleted after the commit (and by :meth:`MemWalDirectoryNamespace.cleanup_orphans`
if a crash came first)."""
WRITER_FLAGS_KEY = "lance.namespace.manifest.writer_feature_flags"
_RESERVED = ".lance-reserved"
_V2_MAX = 2**64 - 1
_MEMWAL_KEYS = (VERSION_KEY, MANIFEST_KEY, STAGED_KEY, DELETED_KEY)
T = TypeVar("T")


@dataclass(frozen=True)
class StagedVersion:
    """A table version written but not yet visible: put :attr:`operation` in a batch.

    Example:
        >>> staged = StagedVersion(("t",), 2, "root/t/_versions/x.manifest-u", "V2")
        >>> staged.operation.create_table_version.version
        2
    """

    table_id: tuple[str, ...]
    version: int
    manifest_path: str
    """As Lance names it: relative to the object store's root."""
    naming_scheme: str

    @property
    def operation(self) -> ln.CommitTableOperation:
        """The ``CreateTableVersion`` operation that publishes this version in a batch."""
        return ln.CommitTableOperation(
            create_table_version=ln.CreateTableVersionRequest(
                id=list(self.table_id),
                version=self.version,
                manifest_path=self.manifest_path,
                naming_scheme=self.naming_scheme,
            )
        )


@dataclass
class OrphanCleanup:
    """What :meth:`MemWalDirectoryNamespace.cleanup_orphans` removed."""

    staged_manifests: int = 0
    deleted_version_manifests: int = 0
    declared_directories: int = 0
    manifest_versions: int = 0


@dataclass
class _Snapshot:
    """``__manifest`` at one version (0: it does not exist yet) and the batch's changes."""

    version: int
    rows: pa.Table | None
    schema: pa.Schema | None
    changed: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    def row(self, object_id: str) -> dict[str, Any] | None:
        if object_id in self.changed:
            return self.changed[object_id]
        if self.rows is None or self.rows.num_rows == 0:
            return None
        hit = self.rows.filter(pc.equal(self.rows["object_id"], object_id))
        return hit.to_pylist()[0] if hit.num_rows else None

    def rows_with(self, key: str) -> list[dict[str, Any]]:
        """The ``table`` rows whose metadata holds ``key`` (one vectorised filter)."""
        if self.rows is None or self.rows.num_rows == 0:
            return []
        meta = pc.fill_null(self.rows["metadata"], "")
        hit = self.rows.filter(pc.match_substring(meta, f'"{key}"'))
        return [r for r in hit.to_pylist() if r["object_id"] not in self.changed]

    def table(self) -> pa.Table:
        """All rows with the changes applied."""
        assert self.rows is not None and self.schema is not None
        kept = self.rows.filter(
            pc.invert(pc.is_in(self.rows["object_id"], pa.array(list(self.changed), pa.string())))
        )
        new = [r for r in self.changed.values() if r is not None]
        return pa.concat_tables([kept, pa.Table.from_pylist(new, schema=self.schema)])


def _in_thread(call: Callable[[], T]) -> T:
    """``call()`` on a new Python thread. Lance calls this client back from its own threads,
    where a Lance scan or commit aborts the interpreter (``PyEval_SaveThread`` without a
    thread state); on a thread Python started they work."""
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:  # re-raised in the caller's thread
            failed.append(e)

    thread = threading.Thread(target=run, name="memwal-namespace")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


def _one(response: ln.BatchCommitTablesResponse, kind: str, index: int = 0) -> Any:
    """The ``kind`` result of operation ``index`` of a batch."""
    result = getattr(response.results[index], kind)
    assert result is not None, kind
    return result


def _meta(row: Mapping[str, Any] | None) -> dict[str, str]:
    return json.loads(row["metadata"]) if row and row.get("metadata") else {}


def _with_meta(row: Mapping[str, Any], meta: Mapping[str, str]) -> dict[str, Any]:
    return {**row, "metadata": json.dumps(dict(meta), sort_keys=True) if meta else None}


def _object_id(table_id: Sequence[str]) -> str:
    if not table_id or any(not part or "$" in part for part in table_id):
        raise InvalidBatchError(
            f"table id {list(table_id)!r} is not a list of non-empty names without '$'"
        )
    return "$".join(table_id)


def _request(request: Any) -> dict[str, Any]:
    """A request as a dict: Lance passes dicts (with ``model_dump``), callers pydantic models."""
    if request is None:
        return {}
    if hasattr(request, "model_dump") and not isinstance(request, dict):
        return dict(request.model_dump())
    return dict(request)


def _final_name(version: int, naming_scheme: str) -> str:
    return f"{version}.manifest" if naming_scheme == "V1" else f"{_V2_MAX - version:020d}.manifest"


def _version_of(name: str) -> int | None:
    """The version a ``_versions/`` file name holds; None for staged and other files."""
    stem, _, ext = name.partition(".")
    if ext != "manifest" or not stem.isdigit():
        return None
    n = int(stem)
    return _V2_MAX - n if len(stem) == 20 and n > 2**63 else n


def _parse_ranges(text: str) -> list[tuple[int, int]]:
    return [
        (int(a), int(b)) for a, _, b in (part.partition("-") for part in text.split(",") if part)
    ]


def _format_ranges(ranges: Iterable[tuple[int, int]]) -> str:
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return ",".join(f"{a}-{b}" for a, b in merged)


def _in_ranges(version: int, ranges: Sequence[tuple[int, int]]) -> bool:
    return any(a <= version <= b for a, b in ranges)


class MemWalDirectoryNamespace(DirectoryNamespace):
    """A directory namespace with atomic multi-table commits and readers pinned to them.

    ``root``: a local directory or ``s3://`` prefix; Lance's own ``DirectoryNamespace`` on the
    same root keeps working (it lists, opens, declares and drops tables). ``commit_retries``:
    how many times a batch that lost the ``__manifest`` race validates again.

    Example:
        >>> import tempfile
        >>> ns = MemWalDirectoryNamespace(tempfile.mkdtemp())
        >>> _ = ns.batch_commit_tables(ln.BatchCommitTablesRequest(operations=[
        ...     ln.CommitTableOperation(declare_table=ln.DeclareTableRequest(id=["a"])),
        ...     ln.CommitTableOperation(declare_table=ln.DeclareTableRequest(id=["b"]))]))
        >>> sorted(ns.list_tables(ln.ListTablesRequest(id=[])).tables)
        ['a', 'b']
    """

    def __init__(
        self,
        root: str,
        storage_options: Mapping[str, str] | None = None,
        *,
        commit_retries: int = 10,
        **properties: str,
    ) -> None:
        options = dict(storage_options or {})
        super().__init__(root=root, **{f"storage.{k}": v for k, v in options.items()}, **properties)
        self._store = ObjectStore(root, options)
        self._storage_options = options or None
        self._root_uri = self._store.uri
        # Lance names manifests by their path in the object store: the root's key prefix.
        self._store_prefix = urlparse(self._root_uri).path.strip("/")
        self._manifest_uri = self._store.uri_for(MANIFEST_DIR)
        self._retries = commit_retries
        self._pinned: int | None = None

    # -- reading __manifest ----------------------------------------------------------------

    def pinned(self, manifest_version: int | None = None) -> MemWalDirectoryNamespace:
        """A read-only client that answers from ``__manifest`` at ``manifest_version`` (the
        current one by default): readers through it see one state of every table.

        Example:
            >>> import tempfile
            >>> ns = MemWalDirectoryNamespace(tempfile.mkdtemp())
            >>> ns.pinned().manifest_version
            0
        """
        pinned = copy.copy(self)
        pinned._pinned = self._read().version if manifest_version is None else manifest_version
        return pinned

    @property
    def manifest_version(self) -> int:
        """The ``__manifest`` version this client reads (0: none yet)."""
        return self._pinned if self._pinned is not None else self._read().version

    def _read(self) -> _Snapshot:
        try:
            ds = lance.dataset(
                self._manifest_uri, version=self._pinned, storage_options=self._storage_options
            )
        except (ValueError, OSError) as e:
            if not is_not_found(e):
                raise StorageError(f"reading {self._manifest_uri} failed: {e}") from e
            if self._pinned:
                raise SnapshotExpiredError(
                    f"__manifest version {self._pinned} of {self._root_uri} is gone (cleaned up "
                    "by cleanup_orphans); pin a newer one with ns.pinned()"
                ) from e
            return _Snapshot(0, None, None)
        return _Snapshot(ds.version, _in_thread(ds.to_table), ds.schema)

    def _read_for_write(self) -> tuple[_Snapshot, lance.LanceDataset]:
        if self._pinned is not None:
            raise InvalidBatchError("a pinned namespace client is read-only; commit through ns")
        snap = self._read()
        if snap.version == 0:
            # Lance creates __manifest with its exact schema at its first mutation: let it.
            try:
                super().create_namespace(ln.CreateNamespaceRequest(id=[], mode="exist_ok"))
            except NamespaceAlreadyExistsError:
                pass
            snap = self._read()
        ds = lance.dataset(
            self._manifest_uri, version=snap.version, storage_options=self._storage_options
        )
        flags = (ds.metadata or {}).get(WRITER_FLAGS_KEY, "0")
        if flags not in ("", "0"):
            raise StorageError(
                f"{self._manifest_uri} needs writer features {flags} this Lance lacks; "
                "write to it with the Lance release that set them"
            )
        return snap, ds

    def _location(self, row: Mapping[str, Any]) -> str:
        location = str(row.get("location") or "")
        parsed = urlparse(location)
        if parsed.scheme or location.startswith("/"):
            path = parsed.path.strip("/")
            if not path.startswith(self._store_prefix):
                raise InvalidBatchError(f"table {row['object_id']} lies outside {self._root_uri}")
            location = path[len(self._store_prefix) :]
        return location.strip("/")

    def _lance_path(self, relative: str) -> str:
        return f"{self._store_prefix}/{relative}" if self._store_prefix else relative

    def _relative(self, lance_path: str) -> str:
        parsed = urlparse(lance_path)
        path = (parsed.path if parsed.scheme else lance_path).strip("/")
        if not path.startswith(self._store_prefix):
            raise InvalidBatchError(f"manifest {lance_path} lies outside {self._root_uri}")
        return path[len(self._store_prefix) :].strip("/")

    # -- versions on disk, promotion -------------------------------------------------------

    def _disk_versions(self, location: str) -> dict[int, tuple[str, int, float]]:
        """Version -> (name, size, modified) of the final manifests in ``_versions/``."""
        out: dict[int, tuple[str, int, float]] = {}
        for meta in self._store.list(f"{location}/_versions/"):
            name = meta.path.rsplit("/", 1)[-1]
            version = _version_of(name)
            if version is not None:
                out[version] = (name, meta.size, meta.last_modified)
        return out

    def _promote(self, row: Mapping[str, Any]) -> None:
        """Move the row's staged manifest to its final name unless it is there (idempotent)."""
        meta = _meta(row)
        staged, final = meta.get(STAGED_KEY), meta.get(MANIFEST_KEY)
        if not staged or not final or self._store.exists(final):
            return
        try:
            self._store.move(staged, final)
        except ObjectExistsError:  # another promoter won; the bytes must be ours
            if self._store.get(final) != self._store.get(staged):
                raise CorruptTableError(
                    f"version {meta[VERSION_KEY]} of {row['object_id']} was committed by a "
                    "writer that bypassed the namespace; restore it from the staged manifest "
                    f"{staged}"
                ) from None
            self._store.delete(staged)
        except FileNotFoundError:
            if not self._store.exists(final):
                raise CorruptTableError(
                    f"the published version {meta[VERSION_KEY]} of {row['object_id']} has "
                    f"neither its staged manifest {staged} nor {final}; it was deleted by hand"
                ) from None

    def _delete_versions(self, row: Mapping[str, Any]) -> int:
        ranges = _parse_ranges(_meta(row).get(DELETED_KEY, ""))
        location = self._location(row)
        doomed = [
            n for v, (n, _, _) in self._disk_versions(location).items() if _in_ranges(v, ranges)
        ]
        for name in doomed:
            self._store.delete(f"{location}/_versions/{name}")
        return len(doomed)

    # -- reads through the client ----------------------------------------------------------

    def describe_table(self, request: ln.DescribeTableRequest) -> ln.DescribeTableResponse:
        """Lance's answer, with ``managed_versioning`` on: Lance then asks this client which
        version to open."""
        response = super().describe_table(request)
        response.managed_versioning = True
        return response

    def published_version(self, table_id: Sequence[str]) -> int | None:
        """The version of ``table_id`` that ``__manifest`` records; None if none is.

        Example:
            >>> import tempfile
            >>> MemWalDirectoryNamespace(tempfile.mkdtemp()).published_version(["t"]) is None
            True
        """
        meta = _meta(self._read().row(_object_id(table_id)))
        return int(meta[VERSION_KEY]) if VERSION_KEY in meta else None

    def _visible_versions(self, table_id: Sequence[str]) -> list[ln.TableVersion] | None:
        """The versions a reader through the namespace may open, ascending; None when the
        table has no published version (readers then see its ``_versions/`` as Lance does)."""
        row = self._read().row(_object_id(table_id))
        meta = _meta(row)
        if row is None or VERSION_KEY not in meta:
            return None
        self._promote(row)  # a read finishes an interrupted promotion
        published = int(meta[VERSION_KEY])
        deleted = _parse_ranges(meta.get(DELETED_KEY, ""))
        location = self._location(row)
        return [
            ln.TableVersion(
                version=v,
                manifest_path=self._lance_path(f"{location}/_versions/{name}"),
                manifest_size=size,
                timestamp_millis=int(modified * 1000),
            )
            for v, (name, size, modified) in sorted(self._disk_versions(location).items())
            if v <= published and not _in_ranges(v, deleted)
        ]

    def list_table_versions(self, request: Any) -> ln.ListTableVersionsResponse:
        """The published version and those before it (Lance asks for the newest one first)."""
        r = _request(request)
        versions = self._visible_versions(r["id"])
        if versions is None:
            return super().list_table_versions(ln.ListTableVersionsRequest(**r))
        if r.get("descending"):
            versions.reverse()
        if r.get("limit"):
            versions = versions[: r["limit"]]
        return ln.ListTableVersionsResponse(versions=versions)

    def describe_table_version(self, request: Any) -> dict[str, Any]:  # type: ignore[override]
        """One version at most the published one (the published one if none is named)."""
        r = _request(request)
        versions = self._visible_versions(r["id"])
        if versions is None:
            return super().describe_table_version(r)
        wanted = r.get("version")
        hit = [v for v in versions if v.version == wanted] if wanted is not None else versions[-1:]
        if not hit:
            raise TableNotFoundError(
                f"table {r['id']} has no version {wanted} in the namespace (published: "
                f"{versions[-1].version if versions else None}); open a listed one"
            )
        return {"version": hit[0].model_dump()}

    # -- the single-table operations, as batches of one ------------------------------------

    def declare_table(self, request: ln.DeclareTableRequest) -> ln.DeclareTableResponse:
        """Declare a table (one ``__manifest`` commit, as a batch of one)."""
        return _one(self._commit([ln.CommitTableOperation(declare_table=request)]), "declare_table")

    def deregister_table(self, request: ln.DeregisterTableRequest) -> ln.DeregisterTableResponse:
        """Remove a table's row; its directory stays (as Lance does)."""
        batch = self._commit([ln.CommitTableOperation(deregister_table=request)])
        return _one(batch, "deregister_table")

    # Lance passes and expects dicts for the version calls (so does DirectoryNamespace).
    def create_table_version(self, request: Any) -> dict[str, Any]:  # type: ignore[override]
        """Publish one staged version (what Lance calls for a commit through this client)."""
        op = ln.CommitTableOperation(
            create_table_version=ln.CreateTableVersionRequest(**_request(request))
        )
        return _one(self._commit([op]), "create_table_version").model_dump()

    def batch_create_table_versions(self, request: Any) -> ln.BatchCreateTableVersionsResponse:
        """Publish staged versions of several tables atomically."""
        entries = _request(request).get("entries") or []
        response = self._commit(
            [
                ln.CommitTableOperation(
                    create_table_version=ln.CreateTableVersionRequest(**_request(e))
                )
                for e in entries
            ]
        )
        return ln.BatchCreateTableVersionsResponse(
            transaction_id=response.transaction_id,
            versions=[
                _one(response, "create_table_version", i).version
                for i in range(len(response.results))
            ],
        )

    def batch_delete_table_versions(self, request: Any) -> dict[str, Any]:  # type: ignore[override]
        """Delete version ranges of one table (never its published version)."""
        op = ln.CommitTableOperation(
            delete_table_versions=ln.BatchDeleteTableVersionsRequest(**_request(request))
        )
        return _one(self._commit([op]), "delete_table_versions").model_dump()

    # -- BatchCommitTables -----------------------------------------------------------------

    def batch_commit_tables(self, request: Any) -> ln.BatchCommitTablesResponse:
        """Apply every operation of ``request`` or none: stage, one ``__manifest`` commit,
        promote.

        Operations apply in order against one ``__manifest`` version; a ``CreateTableVersion``
        of version N needs the table's newest version to be N-1 (the staged manifest was built
        on it). Raises :class:`NamespaceConflictError` (retryable: stage again) when a table
        moved or the race was lost ``commit_retries`` times, :class:`TableExistsError` and
        :class:`TableNotFoundError` for declares and the rest, :class:`InvalidBatchError` for a
        batch that can never apply.

        Example:
            >>> import tempfile
            >>> ns = MemWalDirectoryNamespace(tempfile.mkdtemp())
            >>> r = ns.batch_commit_tables(ln.BatchCommitTablesRequest(operations=[
            ...     ln.CommitTableOperation(declare_table=ln.DeclareTableRequest(id=["a"]))]))
            >>> r.results[0].declare_table.managed_versioning
            True
        """
        ops = _request(request).get("operations")
        if not ops:
            raise InvalidBatchError("a batch needs at least one operation")
        return self._commit([ln.CommitTableOperation(**_request(op)) for op in ops])

    def _commit(self, ops: list[ln.CommitTableOperation]) -> ln.BatchCommitTablesResponse:
        declared = {
            i: self._reserve(op.declare_table) for i, op in enumerate(ops) if op.declare_table
        }
        try:
            snap, results = _in_thread(lambda: self._commit_batch(ops, declared))
        except MemWalError:  # nothing committed: the declares' own directories go (a crash
            for location in declared.values():  # leaves them to cleanup_orphans)
                if not location.endswith(".lance"):  # <name>.lance may be a winner's
                    self._store.delete_prefix(location)
            raise
        for op in ops:  # promote; delete the manifests of deleted versions
            request = op.create_table_version or op.delete_table_versions
            row = snap.changed.get(_object_id(request.id or [])) if request else None
            if row is not None:
                self._promote(row) if op.create_table_version else self._delete_versions(row)
        return ln.BatchCommitTablesResponse(transaction_id=uuid.uuid4().hex, results=results)

    def _commit_batch(
        self, ops: list[ln.CommitTableOperation], declared: Mapping[int, str]
    ) -> tuple[_Snapshot, list[ln.CommitTableResult]]:
        """Validate against one ``__manifest`` version and commit it; again on a lost race."""
        for attempt in range(self._retries + 1):
            snap, ds = self._read_for_write()
            for pending in snap.rows_with(STAGED_KEY):
                # Finish interrupted promotions (validation counts versions on disk); once this
                # commit records them done, nobody has to check them again.
                self._promote(pending)
                snap.changed[pending["object_id"]] = _with_meta(
                    pending, {k: v for k, v in _meta(pending).items() if k != STAGED_KEY}
                )
            results = [self._apply(op, snap, declared.get(i)) for i, op in enumerate(ops)]
            fragments = lance.fragment.write_fragments(
                snap.table(),
                self._manifest_uri,
                schema=ds.schema,
                storage_options=self._storage_options,
            )
            try:
                lance.LanceDataset.commit(
                    self._manifest_uri,
                    lance.LanceOperation.Overwrite(ds.schema, fragments),
                    read_version=snap.version,
                    storage_options=self._storage_options,
                    max_retries=0,
                )
            except (OSError, ValueError, RuntimeError) as e:
                if not is_commit_conflict(e):
                    raise StorageError(f"committing {self._manifest_uri} failed: {e}") from e
                time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
                continue
            return snap, results
        raise NamespaceConflictError(
            f"the batch lost the race for {self._manifest_uri} {self._retries + 1} times; "
            "other writers commit to the namespace faster: run it again"
        )

    def _reserve(self, request: ln.DeclareTableRequest) -> str:
        """Create the declared table's directory before the commit (as Lance does); a declare
        that loses leaves it for :meth:`cleanup_orphans`."""
        object_id = _object_id(request.id or [])
        location = (
            self._location({"object_id": object_id, "location": request.location})
            if request.location
            # Lance 14's layout: root-level tables at <name>.lance, others in a random directory.
            else f"{object_id}.lance"
            if len(request.id or []) == 1
            else f"{random.getrandbits(32):08x}_{object_id}"
        )
        if "/" in location or location in ("", ".", "..", MANIFEST_DIR):
            raise InvalidBatchError(
                f"declare location {request.location!r} is not a directory name"
            )
        self._store.put(f"{location}/{_RESERVED}", b"")
        return location

    def _apply(
        self, op: ln.CommitTableOperation, snap: _Snapshot, location: str | None
    ) -> ln.CommitTableResult:
        kinds = [k for k in ln.CommitTableResult.model_fields if getattr(op, k, None) is not None]
        if len(kinds) != 1:
            raise InvalidBatchError(
                f"an operation sets exactly one of its four fields, not {kinds}"
            )
        request = getattr(op, kinds[0])
        if getattr(request, "branch", None):
            raise InvalidBatchError("branches are not supported: commit to the main branch")
        table_id = list(request.id or [])
        object_id = _object_id(table_id)
        row = snap.row(object_id)
        if kinds[0] == "declare_table":
            assert location is not None
            declared = self._declare(snap, table_id, row, location, request.properties)
            return ln.CommitTableResult(declare_table=declared)
        if row is None or row["object_type"] != "table":
            raise TableNotFoundError(f"no table {table_id} in {self._root_uri}; declare it first")
        if kinds[0] == "deregister_table":
            snap.changed[object_id] = None
            return ln.CommitTableResult(
                deregister_table=ln.DeregisterTableResponse(
                    id=table_id,
                    location=self._store.uri_for(self._location(row)),
                    properties={k: v for k, v in _meta(row).items() if k not in _MEMWAL_KEYS}
                    or None,
                )
            )
        if kinds[0] == "create_table_version":
            version = self._create_version(snap, row, request)
            return ln.CommitTableResult(
                create_table_version=ln.CreateTableVersionResponse(version=version)
            )
        count = self._mark_deleted(snap, row, request)
        return ln.CommitTableResult(
            delete_table_versions=ln.BatchDeleteTableVersionsResponse(deleted_count=count)
        )

    def _declare(
        self,
        snap: _Snapshot,
        table_id: list[str],
        row: Mapping[str, Any] | None,
        location: str,
        properties: Mapping[str, str] | None,
    ) -> ln.DeclareTableResponse:
        object_id = _object_id(table_id)
        if row is not None:
            raise TableExistsError(f"{table_id} already exists in {self._root_uri}; open it")
        parent = "$".join(table_id[:-1])
        if parent and (snap.row(parent) or {}).get("object_type") != "namespace":
            raise TableNotFoundError(
                f"namespace {table_id[:-1]} does not exist in {self._root_uri}; create it first"
            )
        properties = {str(k): str(v) for k, v in (properties or {}).items()}
        if set(properties) & set(_MEMWAL_KEYS):
            # Lance keeps properties as the row's metadata, where the published version lives.
            raise InvalidBatchError(f"table properties may not set {sorted(_MEMWAL_KEYS)}")
        snap.changed[object_id] = {
            "object_id": object_id,
            "object_type": "table",
            "location": location,
            "metadata": json.dumps(properties, sort_keys=True) if properties else None,
            "base_objects": None,
        }
        return ln.DeclareTableResponse(
            location=self._store.uri_for(location),
            properties=properties or None,
            managed_versioning=True,
            storage_options=self._storage_options,
        )

    def _create_version(
        self, snap: _Snapshot, row: Mapping[str, Any], request: ln.CreateTableVersionRequest
    ) -> ln.TableVersion:
        meta, location = _meta(row), self._location(row)
        version, scheme = int(request.version), request.naming_scheme or "V2"
        staged = self._relative(request.manifest_path)
        final = f"{location}/_versions/{_final_name(version, scheme)}"
        newest = max(self._disk_versions(location), default=0)
        if staged == final:  # publishing a version already committed by uri
            if not self._store.exists(final):
                raise InvalidBatchError(f"{final} does not exist; stage the version first")
            if version < int(meta.get(VERSION_KEY, 0)):
                raise NamespaceConflictError(
                    f"{row['object_id']} publishes version {meta[VERSION_KEY]} already, newer "
                    f"than {version}; publish a newer one"
                )
            new_meta = {**meta, VERSION_KEY: str(version), MANIFEST_KEY: final}
            new_meta.pop(STAGED_KEY, None)
        else:
            if not staged.startswith(f"{location}/"):
                raise InvalidBatchError(f"staged manifest {staged} is not in {location}")
            if not self._store.exists(staged):
                raise InvalidBatchError(f"staged manifest {staged} does not exist; stage again")
            # The RFC's expected_current_version: Lance built version N on version N-1, so the
            # newest version (on disk, or published earlier in this batch) must still be N-1.
            newest = max(newest, int(meta.get(VERSION_KEY, 0)))
            if newest != version - 1:
                raise NamespaceConflictError(
                    f"version {version} of {row['object_id']} was staged on version "
                    f"{version - 1}, but the table is at version {newest} now; stage it again"
                )
            new_meta = {**meta, VERSION_KEY: str(version), MANIFEST_KEY: final, STAGED_KEY: staged}
        snap.changed[row["object_id"]] = _with_meta(row, new_meta)
        return ln.TableVersion(version=version, manifest_path=self._lance_path(final))

    def _mark_deleted(
        self, snap: _Snapshot, row: Mapping[str, Any], request: ln.BatchDeleteTableVersionsRequest
    ) -> int:
        meta = _meta(row)
        ranges = [(int(r.start_version), int(r.end_version)) for r in request.ranges or []]
        if any(a > b or a < 0 for a, b in ranges):
            raise InvalidBatchError(f"version ranges {ranges} are not start <= end")
        current = (
            int(meta[VERSION_KEY])
            if VERSION_KEY in meta
            else max(self._disk_versions(self._location(row)), default=0)
        )
        if _in_ranges(current, ranges):
            raise InvalidBatchError(
                f"version {current} of {row['object_id']} is the one readers open; "
                "publish a newer one before deleting it"
            )
        on_disk = self._disk_versions(self._location(row))
        count = sum(1 for v in on_disk if _in_ranges(v, ranges))
        old = _parse_ranges(meta.get(DELETED_KEY, ""))
        meta[DELETED_KEY] = _format_ranges([*old, *ranges])
        snap.changed[row["object_id"]] = _with_meta(row, meta)
        return count

    # -- staging ---------------------------------------------------------------------------

    def staging_dataset(self, table_id: Sequence[str]) -> lance.LanceDataset:
        """The table at its newest version, to build an uncommitted change on (for example
        ``ds.merge_insert(...).execute_uncommitted(data)``) and pass to :meth:`stage_version`.

        Example:
            >>> import tempfile
            >>> ns = MemWalDirectoryNamespace(tempfile.mkdtemp())
            >>> _ = ns.declare_table(ln.DeclareTableRequest(id=["t"]))
            >>> ns.staging_dataset(["t"])
            Traceback (most recent call last):
            memwal_sql.errors.TableNotFoundError: table ['t'] has no version yet; stage its first with stage_version
        """
        location, newest = self._staging_target(table_id)
        if not newest:
            raise TableNotFoundError(
                f"table {list(table_id)} has no version yet; stage its first with stage_version"
            )
        return lance.dataset(
            self._store.uri_for(location), version=newest, storage_options=self._storage_options
        )

    def _staging_target(self, table_id: Sequence[str]) -> tuple[str, int]:
        row = self._read().row(_object_id(table_id))
        if row is None or row["object_type"] != "table":
            raise TableNotFoundError(f"no table {list(table_id)} in {self._root_uri}; declare it")
        self._promote(row)
        location = self._location(row)
        return location, max(self._disk_versions(location), default=0)

    def stage_version(
        self,
        table_id: Sequence[str],
        operation: lance.LanceOperation.BaseOperation | lance.Transaction,
        *,
        read_version: int | None = None,
    ) -> StagedVersion:
        """Write the table's next version for ``operation`` (a Lance operation, or the
        transaction of an ``execute_uncommitted``) without making it visible to anyone.

        Put the result's :attr:`StagedVersion.operation` in a :meth:`batch_commit_tables`
        with those of other tables: they become visible together. ``read_version``: the
        version the operation was built on (default: the newest; a transaction has its own).

        Example:
            >>> import tempfile, pyarrow as pa
            >>> ns = MemWalDirectoryNamespace(tempfile.mkdtemp())
            >>> _ = ns.declare_table(ln.DeclareTableRequest(id=["t"]))
            >>> s = ns.stage_version(["t"], lance.LanceOperation.Overwrite(
            ...     pa.schema([("id", pa.int64())]), []))
            >>> s.version, ns.published_version(["t"]) is None
            (1, True)
        """
        location, newest = self._staging_target(table_id)
        stager = _Stager(self, list(table_id), location)
        if read_version is None and not isinstance(operation, lance.Transaction):
            read_version = newest or None
        lance.LanceDataset.commit(
            self._store.uri_for(location),
            operation,
            read_version=read_version,
            storage_options=self._storage_options,
            namespace_client=stager,
            table_id=list(table_id),
            namespace_client_managed_versioning=True,
        )
        if stager.staged is None:
            raise StorageError(f"Lance staged no manifest for {list(table_id)}; check pylance")
        return stager.staged

    # -- orphans ---------------------------------------------------------------------------

    def cleanup_orphans(self, older_than: timedelta = timedelta(hours=1)) -> OrphanCleanup:
        """Remove what failed or finished batches leave, once older than ``older_than`` (so a
        batch in flight, and readers pinned to a recent ``__manifest``, are safe):

        - staged manifests no committed row will promote, and manifests of deleted versions;
        - directories of declares that lost their race (holding only ``.lance-reserved``);
        - ``__manifest`` versions but the newest (Lance never removes them).

        The data files a lost staged version wrote are left to the table's own cleanup
        (``cleanup_old_versions``, or MemWAL maintenance), which removes unreferenced files.

        Example:
            >>> import tempfile
            >>> MemWalDirectoryNamespace(tempfile.mkdtemp()).cleanup_orphans()
            OrphanCleanup(staged_manifests=0, deleted_version_manifests=0, declared_directories=0, manifest_versions=0)
        """
        out = OrphanCleanup()
        snap = self._read()
        if snap.rows is None:
            return out
        cutoff = time.time() - older_than.total_seconds()
        tables = [r for r in snap.rows.to_pylist() if r["object_type"] == "table"]
        locations = {self._location(r) for r in tables}
        for row in tables:
            self._promote(row)
            out.deleted_version_manifests += self._delete_versions(row)
            location = self._location(row)
            keep = _meta(row).get(STAGED_KEY)
            for meta in self._store.list(f"{location}/_versions/"):
                name = meta.path.rsplit("/", 1)[-1]
                if ".manifest-" in name and meta.path != keep and meta.last_modified < cutoff:
                    self._store.delete(meta.path)
                    out.staged_manifests += 1
        for name in self._store.list_dirs(""):
            if name == MANIFEST_DIR or name in locations:
                continue
            objects = self._store.list(f"{name}/")
            if [m.path for m in objects] == [f"{name}/{_RESERVED}"] and objects[
                0
            ].last_modified < cutoff:
                self._store.delete_prefix(name)
                out.declared_directories += 1
        manifest = lance.dataset(self._manifest_uri, storage_options=self._storage_options)
        stats = manifest.cleanup_old_versions(older_than=older_than)
        out.manifest_versions = stats.old_versions
        return out


class _Stager(LanceNamespace):
    """What a staged commit talks to: the table's newest version on disk, and a
    ``create_table_version`` that only records where Lance wrote the manifest."""

    def __init__(self, ns: MemWalDirectoryNamespace, table_id: list[str], location: str) -> None:
        self._ns, self._id, self._location = ns, table_id, location
        self.staged: StagedVersion | None = None

    def namespace_id(self) -> str:
        return f"memwal-stager({self._ns.namespace_id()})"

    def describe_table(self, request: Any) -> ln.DescribeTableResponse:
        return ln.DescribeTableResponse(
            location=self._ns._store.uri_for(self._location),
            storage_options=self._ns._storage_options,
            managed_versioning=True,
        )

    def _versions(self) -> list[ln.TableVersion]:
        return [
            ln.TableVersion(
                version=v,
                manifest_path=self._ns._lance_path(f"{self._location}/_versions/{name}"),
                manifest_size=size,
            )
            for v, (name, size, _) in sorted(self._ns._disk_versions(self._location).items())
        ]

    def list_table_versions(self, request: Any) -> ln.ListTableVersionsResponse:
        r = _request(request)
        versions = self._versions()
        if r.get("descending"):
            versions.reverse()
        return ln.ListTableVersionsResponse(versions=versions[: r.get("limit") or None])

    def describe_table_version(self, request: Any) -> dict[str, Any]:  # type: ignore[override]
        wanted = _request(request).get("version")
        hit = [v for v in self._versions() if wanted is None or v.version == wanted][-1:]
        if not hit:
            raise TableNotFoundError(f"table {self._id} has no version {wanted}")
        return {"version": hit[0].model_dump()}

    def create_table_version(self, request: Any) -> dict[str, Any]:  # type: ignore[override]
        r = _request(request)
        self.staged = StagedVersion(
            tuple(self._id), int(r["version"]), r["manifest_path"], r.get("naming_scheme") or "V2"
        )
        return {"version": {"version": r["version"], "manifest_path": r["manifest_path"]}}
