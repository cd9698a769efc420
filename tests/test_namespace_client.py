"""BatchCommitTables of MemWalDirectoryNamespace: each operation kind, races between processes,
and SIGKILL at each step; readers through the client see all of a batch or none of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import lance
import lance_namespace as ln
import pyarrow as pa
import pytest
from lance.namespace import DirectoryNamespace

from memwal_sql.errors import (
    InvalidBatchError,
    NamespaceConflictError,
    RetryableError,
    TableExistsError,
    TableNotFoundError,
)
from memwal_sql.namespace_client import MemWalDirectoryNamespace, StagedVersion

SCHEMA = pa.schema([("id", pa.int64())])
A, B = ["s", "a"], ["s", "b"]


def _batch(*ops: ln.CommitTableOperation) -> ln.BatchCommitTablesRequest:
    return ln.BatchCommitTablesRequest(operations=list(ops))


def _declare(table_id: list[str]) -> ln.CommitTableOperation:
    return ln.CommitTableOperation(declare_table=ln.DeclareTableRequest(id=table_id))


def _stage(ns: MemWalDirectoryNamespace, table_id: list[str], rows: int) -> StagedVersion:
    """Stage a version of ``table_id`` holding ids 0..rows-1."""
    location = DirectoryNamespace.describe_table(ns, ln.DescribeTableRequest(id=table_id)).location
    data = pa.table({"id": pa.array(range(rows), pa.int64())})
    fragments = lance.fragment.write_fragments(data, location, schema=SCHEMA)
    return ns.stage_version(table_id, lance.LanceOperation.Overwrite(SCHEMA, fragments))


def _rows(client: object, table_id: list[str]) -> int:
    return lance.dataset(namespace_client=client, table_id=table_id).count_rows()


def _manifest_version(root: Path) -> int:
    return lance.dataset(str(root / "__manifest")).version


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ns = MemWalDirectoryNamespace(str(tmp_path / "ns"))
    ns.create_namespace(ln.CreateNamespaceRequest(id=["s"]))
    ns.batch_commit_tables(_batch(_declare(A), _declare(B)))
    ns.batch_commit_tables(_batch(_stage(ns, A, 1).operation, _stage(ns, B, 1).operation))
    return tmp_path / "ns"


@pytest.fixture
def ns(root: Path) -> MemWalDirectoryNamespace:
    return MemWalDirectoryNamespace(str(root))


def test_staged_versions_are_invisible_until_the_batch_commits(
    ns: MemWalDirectoryNamespace, root: Path
) -> None:
    staged = [_stage(ns, A, 3), _stage(ns, B, 4)]
    lance_ns = DirectoryNamespace(root=str(root))
    for client in (ns, lance_ns):  # ours, Lance's own and (through it) a uri reader
        assert (_rows(client, A), _rows(client, B)) == (1, 1)
    response = ns.batch_commit_tables(_batch(*(s.operation for s in staged)))
    assert [r.create_table_version.version.version for r in response.results] == [2, 2]
    for client in (ns, lance_ns):
        assert (_rows(client, A), _rows(client, B)) == (3, 4)
    assert (ns.published_version(A), ns.published_version(B)) == (2, 2)
    assert not list(root.rglob("*.manifest-*"))  # promoted


def test_declare_and_first_version_in_one_batch(ns: MemWalDirectoryNamespace, root: Path) -> None:
    ns.batch_commit_tables(_batch(_declare(["s", "c"])))
    staged = _stage(ns, ["s", "c"], 5)
    ns.batch_commit_tables(_batch(_declare(["s", "d"]), staged.operation))
    tables = DirectoryNamespace(root=str(root)).list_tables(ln.ListTablesRequest(id=["s"])).tables
    assert sorted(tables) == ["a", "b", "c", "d"]
    assert _rows(ns, ["s", "c"]) == 5
    with pytest.raises(TableExistsError):
        ns.declare_table(ln.DeclareTableRequest(id=["s", "d"]))
    with pytest.raises(TableNotFoundError):
        ns.declare_table(ln.DeclareTableRequest(id=["nowhere", "d"]))


def test_a_failing_operation_commits_nothing(ns: MemWalDirectoryNamespace, root: Path) -> None:
    before = _manifest_version(root)
    dirs = sorted(p.name for p in root.iterdir())
    with pytest.raises(TableExistsError):
        ns.batch_commit_tables(
            _batch(_stage(ns, A, 7).operation, _declare(["s", "e"]), _declare(B))
        )
    assert _manifest_version(root) == before
    assert (ns.published_version(A), _rows(ns, A)) == (1, 1)
    assert sorted(p.name for p in root.iterdir()) == dirs  # the declare's directory went too


def test_a_version_staged_on_an_old_version_conflicts(ns: MemWalDirectoryNamespace) -> None:
    first, second = _stage(ns, A, 2), _stage(ns, A, 3)
    assert first.version == second.version == 2
    ns.batch_commit_tables(_batch(first.operation))
    with pytest.raises(NamespaceConflictError) as caught:
        ns.batch_commit_tables(_batch(second.operation, _stage(ns, B, 9).operation))
    assert isinstance(caught.value, RetryableError)
    assert (_rows(ns, A), _rows(ns, B)) == (2, 1)  # B's version was not published either
    ns.batch_commit_tables(_batch(_stage(ns, A, 3).operation))  # staged again: it applies
    assert (ns.published_version(A), _rows(ns, A)) == (3, 3)


def test_delete_table_versions(ns: MemWalDirectoryNamespace, root: Path) -> None:
    for rows in (2, 3):
        ns.batch_commit_tables(_batch(_stage(ns, A, rows).operation))
    delete = ln.BatchDeleteTableVersionsRequest(
        id=A, ranges=[{"start_version": 1, "end_version": 2}]
    )
    response = ns.batch_commit_tables(_batch(ln.CommitTableOperation(delete_table_versions=delete)))
    assert response.results[0].delete_table_versions.deleted_count == 2
    listed = ns.list_table_versions(ln.ListTableVersionsRequest(id=A)).versions
    assert [v.version for v in listed] == [3]
    lance_listed = DirectoryNamespace(root=str(root)).list_table_versions(
        ln.ListTableVersionsRequest(id=A)
    )
    assert [v.version for v in lance_listed.versions] == [3]  # the manifests are gone
    with pytest.raises(TableNotFoundError):
        ns.describe_table_version({"id": A, "version": 1})
    current = ln.BatchDeleteTableVersionsRequest(
        id=A, ranges=[{"start_version": 3, "end_version": 3}]
    )
    with pytest.raises(InvalidBatchError):
        ns.batch_commit_tables(_batch(ln.CommitTableOperation(delete_table_versions=current)))


def test_deregister_with_a_version_of_another_table(
    ns: MemWalDirectoryNamespace, root: Path
) -> None:
    location = ns.describe_table(ln.DescribeTableRequest(id=B)).location
    deregister = ln.CommitTableOperation(deregister_table=ln.DeregisterTableRequest(id=B))
    ns.batch_commit_tables(_batch(_stage(ns, A, 4).operation, deregister))
    assert ns.list_tables(ln.ListTablesRequest(id=["s"])).tables == ["a"]
    assert Path(location.removeprefix("file://")).is_dir()  # deregister keeps the data
    assert _rows(ns, A) == 4


def test_malformed_operations_are_refused(ns: MemWalDirectoryNamespace) -> None:
    staged = _stage(ns, A, 2)
    both = ln.CommitTableOperation(
        declare_table=ln.DeclareTableRequest(id=["s", "x"]),
        create_table_version=staged.operation.create_table_version,
    )
    branch = staged.operation.model_copy(deep=True)
    branch.create_table_version.branch = "dev"
    for op in (both, branch, ln.CommitTableOperation()):
        with pytest.raises(InvalidBatchError):
            ns.batch_commit_tables(_batch(op))
    with pytest.raises(InvalidBatchError):
        ns.batch_commit_tables(_batch())
    assert ns.published_version(A) == 1


def test_a_pinned_client_sees_one_manifest_version(ns: MemWalDirectoryNamespace) -> None:
    pinned = ns.pinned()
    ns.batch_commit_tables(_batch(_stage(ns, A, 5).operation, _stage(ns, B, 6).operation))
    assert (_rows(pinned, A), _rows(pinned, B)) == (1, 1)
    assert (_rows(ns, A), _rows(ns, B)) == (5, 6)
    with pytest.raises(InvalidBatchError):
        pinned.batch_commit_tables(_batch(_declare(["s", "z"])))


def test_lance_writes_through_the_client_publish(ns: MemWalDirectoryNamespace) -> None:
    lance.write_dataset(pa.table({"id": [7, 8]}), namespace_client=ns, table_id=A, mode="append")
    assert (ns.published_version(A), _rows(ns, A)) == (2, 3)
    merge = ns.staging_dataset(A).merge_insert("id").when_not_matched_insert_all()
    transaction, _ = merge.execute_uncommitted(pa.table({"id": [8, 9]}))
    staged = ns.stage_version(A, transaction)
    assert _rows(ns, A) == 3
    ns.batch_commit_tables(_batch(staged.operation))
    assert _rows(ns, A) == 4


def test_uri_commits_are_hidden_until_published(ns: MemWalDirectoryNamespace) -> None:
    location = ns.describe_table(ln.DescribeTableRequest(id=A)).location
    direct = lance.write_dataset(pa.table({"id": [5]}), location, mode="append")
    assert (direct.version, _rows(ns, A)) == (2, 1)
    ns.batch_commit_tables(_batch(_stage(ns, A, 6).operation))  # staged on version 2
    assert (ns.published_version(A), _rows(ns, A)) == (3, 6)


# A child process: stages versions of a and b, commits them in one batch, and SIGKILLs itself
# at the named point.
_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import lance, lance_namespace as ln, pyarrow as pa
    from memwal_sql import namespace_client as nc
    root, point, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ns = nc.MemWalDirectoryNamespace(root)
    schema = pa.schema([("id", pa.int64())])
    # Sees the promotions of the last batch done, so that only this batch's call _promote.
    ns.declare_table(ln.DeclareTableRequest(id=["s", "pre"]))
    staged = []
    for t in ("a", "b"):
        location = ns.describe_table(ln.DescribeTableRequest(id=["s", t])).location
        data = pa.table({"id": pa.array(range(rows), pa.int64())})
        frags = lance.fragment.write_fragments(data, location, schema=schema)
        staged.append(ns.stage_version(["s", t], lance.LanceOperation.Overwrite(schema, frags)))
    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)
    if point == "staged":
        die()
    promote, calls = nc.MemWalDirectoryNamespace._promote, []
    def promote_then_die(self, row):
        calls.append(row)
        if point == "committed" or len(calls) == 2:
            die()
        promote(self, row)
    nc.MemWalDirectoryNamespace._promote = promote_then_die
    declare = ln.CommitTableOperation(declare_table=ln.DeclareTableRequest(id=["s", "n"]))
    ns.batch_commit_tables(ln.BatchCommitTablesRequest(operations=[
        *(s.operation for s in staged), declare]))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["staged", "committed", "promoting"])
def test_sigkill_during_a_batch(root: Path, point: str) -> None:
    child = subprocess.run([sys.executable, "-c", _CHILD, str(root), point, "4"], check=False)
    assert child.returncode == -9
    ns = MemWalDirectoryNamespace(str(root))
    lance_ns = DirectoryNamespace(root=str(root))
    left = {"staged": 2, "committed": 2, "promoting": 1}[point]
    assert len(list(root.rglob("*.manifest-*"))) == left
    expected = (1, 1) if point == "staged" else (4, 4)  # all of the batch or none
    if point == "promoting":  # Lance's own readers see each table's HEAD move on its own
        assert (_rows(lance_ns, A), _rows(lance_ns, B)) == (4, 1)
        # The next operation finishes the promotion.
        ns.batch_commit_tables(_batch(_declare(["s", "next"])))
        assert (_rows(lance_ns, A), _rows(lance_ns, B)) == expected
    assert (_rows(ns, A), _rows(ns, B)) == expected  # a read finishes it too
    assert (_rows(lance_ns, A), _rows(lance_ns, B)) == expected
    tables = set(ns.list_tables(ln.ListTablesRequest(id=["s"])).tables) - {"next"}
    assert tables == ({"a", "b", "pre"} if point == "staged" else {"a", "b", "n", "pre"})
    cleaned = ns.cleanup_orphans(older_than=timedelta(0))
    assert not list(root.rglob("*.manifest-*"))
    if point == "staged":
        assert cleaned.staged_manifests == 2
        assert cleaned.declared_directories == 0  # the child died before reserving "n"
    ns.batch_commit_tables(_batch(_stage(ns, A, 9).operation))  # the table moves on
    assert _rows(lance_ns, A) == 9


def test_cleanup_removes_lost_declares_and_old_manifest_versions(
    ns: MemWalDirectoryNamespace, root: Path
) -> None:
    (root / "0badc0de_s$lost").mkdir()
    (root / "0badc0de_s$lost" / ".lance-reserved").touch()
    versions = _manifest_version(root)
    cleaned = ns.cleanup_orphans(older_than=timedelta(0))
    assert cleaned.declared_directories == 1 and not (root / "0badc0de_s$lost").exists()
    assert cleaned.manifest_versions == versions - 1
    assert (_rows(ns, A), _rows(ns, B)) == (1, 1)
    assert sorted(ns.list_tables(ln.ListTablesRequest(id=["s"])).tables) == ["a", "b"]


# Each child commits a batch per round that stages version (round + 2) of a and b.
_RACER = textwrap.dedent(
    """
    import json, sys
    import lance, lance_namespace as ln, pyarrow as pa
    from memwal_sql.errors import NamespaceConflictError
    from memwal_sql.namespace_client import MemWalDirectoryNamespace
    ns = MemWalDirectoryNamespace(sys.argv[1])
    schema = pa.schema([("id", pa.int64())])
    won = lost = 0
    for round in range(int(sys.argv[2])):
        staged = []
        for t in ("a", "b"):
            location = ns.describe_table(ln.DescribeTableRequest(id=["s", t])).location
            frags = lance.fragment.write_fragments(pa.table({"id": [round]}), location, schema=schema)
            staged.append(ns.stage_version(["s", t], lance.LanceOperation.Append(frags)))
        try:
            ns.batch_commit_tables(ln.BatchCommitTablesRequest(operations=[s.operation for s in staged]))
            won += 1
        except NamespaceConflictError:
            lost += 1
    print(json.dumps([won, lost]))
    """
)


@pytest.mark.slow
def test_concurrent_batches_from_two_processes(root: Path) -> None:
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(root), "6"], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outcomes = [json.loads(r.communicate()[0]) for r in racers]
    assert all(r.returncode == 0 for r in racers)
    won = sum(w for w, _ in outcomes)
    assert sum(w + lost for w, lost in outcomes) == 12
    ns = MemWalDirectoryNamespace(str(root))
    # Every winning batch published a version of both tables; no loser's version leaked.
    assert ns.published_version(A) == ns.published_version(B) == 1 + won
    assert _rows(ns, A) == _rows(ns, B) == 1 + won
    lance_ns = DirectoryNamespace(root=str(root))
    assert _rows(lance_ns, A) == _rows(lance_ns, B) == 1 + won
    ns.cleanup_orphans(older_than=timedelta(0))
    assert not list(root.rglob("*.manifest-*"))
    assert os.listdir(root)  # sanity: the root still holds the tables
