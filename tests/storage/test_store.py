import os
import threading
import time
import uuid

import pyarrow as pa
import pytest

from memwal_sql.errors import ObjectExistsError, ObjectNotFoundError, StorageError
from memwal_sql.storage import ObjectStore


@pytest.fixture(
    params=["local", "local-nondurable", "memory", pytest.param("s3", marks=pytest.mark.s3)]
)
def store(request, tmp_path):
    if request.param == "local":
        return ObjectStore(str(tmp_path / "root"))
    if request.param == "local-nondurable":
        return ObjectStore(f"file://{tmp_path}/root", durable=False)
    if request.param == "memory":
        return ObjectStore(f"memory://{tmp_path.name}")
    return ObjectStore(f"s3://memwal/{tmp_path.name}", request.getfixturevalue("s3_server"))


def test_put_if_not_exists_has_one_winner(store):
    store.put_if_not_exists("a/x", b"1")
    with pytest.raises(ObjectExistsError):
        store.put_if_not_exists("a/x", b"2")
    assert store.get("a/x") == b"1"


def test_racing_creates_have_exactly_one_winner(store):
    wins, losses = [], []

    def attempt(i):
        try:
            store.put_if_not_exists("race/k", str(i).encode())
            wins.append(i)
        except ObjectExistsError:
            losses.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 7
    assert store.get("race/k") == str(wins[0]).encode()


def test_get_exists_list_delete(store):
    for name in ["d/3", "d/1", "d/sub/2", "e/1"]:
        store.put(name, name.encode())
    assert store.exists("d/1") and not store.exists("d/9")
    assert [m.path for m in store.list("d/")] == ["d/1", "d/3", "d/sub/2"]
    assert store.list_dirs("d") == ["sub"]
    store.delete("d/1")
    store.delete("d/1")  # deleting a missing object is not an error
    with pytest.raises(ObjectNotFoundError):
        store.get("d/1")
    assert store.delete_prefix("d/") == 2
    assert store.list("d/") == []


def test_a_local_get_is_a_plain_read_not_obstores(tmp_path, monkeypatch):
    # obstore's get costs 3-5x a plain read per object on local disk (a cold read replays a
    # WAL tail of many small entries): local gets do not go through it.
    import memwal_sql.storage.store as store_module

    local = ObjectStore(str(tmp_path))
    local.put("d/a", b"bytes of a")

    def refuse(*args, **kwargs):
        raise AssertionError("obstore's get was called for a local object")

    monkeypatch.setattr(store_module.obs, "get", refuse)
    assert local.get("d/a") == b"bytes of a"
    with pytest.raises(ObjectNotFoundError, match="does not exist"):
        local.get("d/missing")
    memory = ObjectStore("memory://plain-read")  # other stores still use obstore
    with pytest.raises(AssertionError):
        memory.get("d/a")


def test_get_many_and_list_names(store):
    # What a claim reads its WAL tail with: many objects at once, missing ones as None; and
    # the names in one directory, without its sub-directories or local puts' temporary files.
    for name in ["d/3", "d/1", "d/sub/2"]:
        store.put_if_not_exists(name, name.encode())
    paths = [f"d/{i}" for i in range(1, 40)]
    assert store.get_many(paths) == [b"d/1", None, b"d/3"] + [None] * 36
    assert sorted(store.list_names("d")) == ["1", "3"]
    assert store.list_names("nothing") == []


def test_a_put_without_sync_is_there_until_synced(tmp_path, monkeypatch):
    # A claim's sentinels: visible to every process at once, fsynced later with what they
    # fence (sync_objects), not one device flush each.
    store = ObjectStore(str(tmp_path))
    store.put_if_not_exists("w/0", b"")  # the directory, durable
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    store.put_if_not_exists("w/1", b"x", checksummed=True, sync=False)
    assert synced == [] and store.get("w/1") == b"x"
    with pytest.raises(ObjectExistsError):
        store.put_if_not_exists("w/1", b"y", sync=False)
    store.sync_objects(["w/1"])
    assert len(synced) == 2  # the object, then its directory
    assert sorted(os.listdir(tmp_path / "w")) == ["0", "1"]  # no temporary file left


def test_put_overwrites(store):
    store.put("h", b"1")
    store.put("h", b"2")
    assert store.get("h") == b"2"


@pytest.mark.parametrize("spares", [False, True])
def test_durable_local_create_leaves_no_temp_files(tmp_path, spares):
    store = ObjectStore(str(tmp_path))
    if spares:
        store.keep_spare_files("w")
        store._spares.wait_idle()  # the put takes a spare
    store.put_if_not_exists("w/a", b"x")
    with pytest.raises(ObjectExistsError):
        store.put_if_not_exists("w/a", b"y")
    assert not_spares(store, tmp_path / "w") == ["a"]
    assert os.stat(tmp_path / "w" / "a").st_nlink == 1


@pytest.mark.parametrize("spares", [False, True])
def test_a_put_that_fails_midway_leaves_nothing(tmp_path, monkeypatch, spares):
    import memwal_sql.storage.store as store_module

    store = ObjectStore(str(tmp_path))
    if spares:
        store.keep_spare_files("w")
        store._spares.wait_idle()  # the put takes a spare

    def fail(src, dst):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store_module, "_rename_no_replace", fail)
    with pytest.raises(StorageError, match="Input/output error"):
        store.put_if_not_exists("w/a", b"x")
    assert not_spares(store, tmp_path / "w") == []


def not_spares(store: ObjectStore, directory) -> list[str]:
    """The names in ``directory``, without the spare files a store keeps there."""
    if store._spares:
        store._spares.wait_idle()  # a batch being made is not listed as held yet
    return sorted(
        n
        for n in os.listdir(directory)
        if not (store._spares and store._spares.holds(f"{directory}/{n}"))
    )


def test_remove_temp_files_takes_only_old_leftovers(tmp_path):
    store = ObjectStore(str(tmp_path))
    (tmp_path / "w").mkdir()
    for name in (".a.1.tmp", ".b.2.tmp", "c.arrow", ".d"):
        (tmp_path / "w" / name).write_bytes(b"x")
    old = time.time() - 3600
    for name in (".a.1.tmp", "c.arrow", ".d"):
        os.utime(tmp_path / "w" / name, (old, old))
    assert store.remove_temp_files("w") == 1  # .b.2.tmp may belong to a put in progress
    assert sorted(os.listdir(tmp_path / "w")) == [".b.2.tmp", ".d", "c.arrow"]
    assert store.remove_temp_files("missing") == 0


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(StorageError, match="unsupported uri scheme"):
        ObjectStore("ftp://x/y")


def test_list_hides_the_temp_files_of_local_puts(tmp_path):
    store = ObjectStore(str(tmp_path))
    store.put_if_not_exists("w/a", b"x")
    (tmp_path / "w" / ".b.0123.tmp").write_bytes(b"partial")  # a put in progress, or crashed
    (tmp_path / "w" / ".keep").write_bytes(b"")
    assert [m.path for m in store.list("w/")] == ["w/.keep", "w/a"]


def test_a_transient_error_is_a_storage_error(tmp_path, monkeypatch):
    import errno

    import memwal_sql.storage.store as store_module

    def too_many(directory, stem):
        raise OSError(errno.EMFILE, "Too many open files")

    store = ObjectStore(str(tmp_path))
    monkeypatch.setattr(store_module, "create_temp_file", too_many)
    with pytest.raises(StorageError, match="Too many open files"):
        store.put_if_not_exists("w/a", b"x")
    monkeypatch.undo()
    store.put_if_not_exists("w/a", b"x")
    assert store.get("w/a") == b"x"


@pytest.mark.parametrize("temp_file", ["spare", "new"])
def test_a_durable_local_put_syncs_the_file_then_its_new_name(tmp_path, monkeypatch, temp_file):
    # A put acknowledged before a power loss must survive it: the data is fsynced before the
    # name exists (a name never becomes durable before its data), then the directory is fsynced
    # once it holds the name.
    import stat

    import memwal_sql.storage.store as store_module

    store = ObjectStore(str(tmp_path))
    if temp_file == "spare":
        store.keep_spare_files("w")
        store._spares.wait_idle()
    dst = tmp_path / "w" / "a"
    synced = []  # (inode, is a directory, the final name existed)
    real_fsync = store_module.os.fsync

    def recording_fsync(fd):
        st = os.fstat(fd)
        synced.append((st.st_ino, stat.S_ISDIR(st.st_mode), dst.exists()))
        real_fsync(fd)

    monkeypatch.setattr(store_module.os, "fsync", recording_fsync)
    store.put_if_not_exists("w/a", b"payload")
    monkeypatch.undo()
    assert dst.read_bytes() == b"payload"
    file_ino, dir_ino = os.stat(dst).st_ino, os.stat(tmp_path / "w").st_ino
    assert (file_ino, False, False) in synced
    assert (dir_ino, True, True) in synced


@pytest.mark.parametrize("temp_file", ["spare", "new"])
def test_a_checksummed_put_renames_then_syncs_the_file_once(tmp_path, monkeypatch, temp_file):
    # Where the fsync of a newly named file writes the name too, a checksummed put (a WAL entry)
    # costs one device flush: the complete file is renamed into place, then fsynced; the
    # directory is not fsynced separately.
    import stat

    import memwal_sql.storage.store as store_module

    monkeypatch.setattr(store_module, "_file_sync_writes_new_name", lambda d: True)
    store = ObjectStore(str(tmp_path))
    if temp_file == "spare":
        store.keep_spare_files("w")
        store._spares.wait_idle()
    else:
        (tmp_path / "w").mkdir()
    dst = tmp_path / "w" / "a"
    synced = []  # (inode, is a directory, the final name existed, its content then)
    real_fsync = store_module.os.fsync

    def recording_fsync(fd):
        st = os.fstat(fd)
        synced.append(
            (
                st.st_ino,
                stat.S_ISDIR(st.st_mode),
                dst.exists(),
                dst.read_bytes() if dst.exists() else None,
            )
        )
        real_fsync(fd)

    started = []  # write-back started before the rename, for the whole data
    real_start = store_module._start_writeback
    monkeypatch.setattr(
        store_module,
        "_start_writeback",
        lambda fd: (started.append((dst.exists(), os.fstat(fd).st_size)), real_start(fd)),
    )
    monkeypatch.setattr(store_module.os, "fsync", recording_fsync)
    store.put_if_not_exists("w/a", b"payload", checksummed=True)
    with pytest.raises(ObjectExistsError):
        store.put_if_not_exists("w/a", b"other", checksummed=True)
    monkeypatch.undo()
    assert synced == [(os.stat(dst).st_ino, False, True, b"payload")]
    assert started[0] == (False, len(b"payload"))
    assert dst.read_bytes() == b"payload" and not_spares(store, tmp_path / "w") == ["a"]


def test_a_checksummed_put_elsewhere_syncs_the_file_then_the_directory(tmp_path, monkeypatch):
    import stat

    import memwal_sql.storage.store as store_module

    monkeypatch.setattr(store_module, "_file_sync_writes_new_name", lambda d: False)
    store = ObjectStore(str(tmp_path))
    dst = tmp_path / "w" / "a"
    synced = []
    real_fsync = store_module.os.fsync

    def recording_fsync(fd):
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), dst.exists()))
        real_fsync(fd)

    monkeypatch.setattr(store_module.os, "fsync", recording_fsync)
    store.put_if_not_exists("w/a", b"payload", checksummed=True)
    monkeypatch.undo()
    assert synced[-2:] == [(False, False), (True, True)]


@pytest.mark.parametrize("later_fsyncs", ["succeed", "fail"])
def test_a_failed_sync_of_a_checksummed_put_rewrites_it(tmp_path, monkeypatch, later_fsyncs):
    # The object already has its name when its fsync fails, and Linux reports a failed
    # write-back once: a later fsync (a claiming writer's) would succeed over lost data. So it
    # is written again, durable before it takes the name. It is never removed (a new writer
    # may have read it and appended after it). The put is not acknowledged either way.
    import errno

    import memwal_sql.storage.store as store_module
    from memwal_sql.errors import SyncFailedError

    monkeypatch.setattr(store_module, "_file_sync_writes_new_name", lambda d: True)
    store = ObjectStore(str(tmp_path))
    store.put_if_not_exists("w/0", b"first", checksummed=True)
    real, failed = os.fsync, []

    def fails(fd):
        if not failed or later_fsyncs == "fail":
            failed.append(os.fstat(fd).st_ino)
            raise OSError(errno.EIO, "Input/output error")
        return real(fd)

    monkeypatch.setattr(store_module.os, "fsync", fails)
    with pytest.raises(SyncFailedError, match="Input/output error"):
        store.put_if_not_exists("w/a", b"payload", checksummed=True)
    monkeypatch.undo()
    assert store.get("w/a") == b"payload"
    rewritten = os.stat(tmp_path / "w" / "a").st_ino != failed[0]
    assert rewritten == (later_fsyncs == "succeed")  # a new, synced copy if the disk allows
    assert not_spares(store, tmp_path / "w") == ["0", "a"]


def mount_type(path) -> str:
    """The file-system type of the mount holding ``path``, from /proc/self/mountinfo."""
    best, kind = "", ""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ")
            point = left.split()[4]
            if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(
                best
            ):
                best, kind = point, right.split()[0]
    return kind


@pytest.mark.skipif(not os.path.exists("/proc/self/mountinfo"), reason="Linux only")
def test_only_ext4_xfs_and_btrfs_put_in_one_flush(tmp_path):
    from memwal_sql.storage.store import _file_sync_writes_new_name

    for path in (tmp_path, "/proc", "/dev/shm" if os.path.isdir("/dev/shm") else "/proc"):
        assert _file_sync_writes_new_name(str(path)) == (
            mount_type(path) in {"ext4", "xfs", "btrfs"}
        )


def test_sync_objects_fsyncs_each_object_and_its_directory(tmp_path, monkeypatch):
    import memwal_sql.storage.store as store_module

    store = ObjectStore(str(tmp_path))
    for name in ("w/1", "w/2", "v/3"):
        store.put(name, b"x")  # an ordinary put: not synced
    synced = []
    real = store_module._fsync_path
    monkeypatch.setattr(store_module, "_fsync_path", lambda p: (synced.append(p), real(p)))
    store.sync_objects(["w/1", "v/3"])
    root = store.uri
    assert synced[:2] == [f"{root}/w/1", f"{root}/v/3"]
    assert sorted(synced[2:]) == [f"{root}/v", f"{root}/w"]
    synced.clear()
    ObjectStore(f"memory://{tmp_path.name}").sync_objects(["w/1"])
    assert synced == []


def test_written_before_boot(tmp_path):
    from memwal_sql.storage.store import _boot_time

    store = ObjectStore(str(tmp_path))
    store.put("old", b"x")
    store.put("new", b"x")
    before = _boot_time() - 60
    assert before > 0
    os.utime(tmp_path / "old", (before, before))
    assert store.written_before_boot("old") and not store.written_before_boot("new")
    memory = ObjectStore(f"memory://{tmp_path.name}")
    memory.put("old", b"x")
    assert not memory.written_before_boot("old")  # object stores never tear a put


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_move(tmp_path, kind):
    store = ObjectStore(str(tmp_path) if kind == "local" else f"memory://mv-{tmp_path.name}")
    store.put("a/x", b"1")
    store.put("b/y", b"2")
    store.move("a/x", "c/x")
    assert store.get("c/x") == b"1" and not store.exists("a/x")
    with pytest.raises(ObjectExistsError):
        store.move("c/x", "b/y")
    assert store.get("c/x") == b"1" and store.get("b/y") == b"2"
    with pytest.raises(ObjectNotFoundError):
        store.move("a/x", "d/x")


@pytest.fixture
def silent_endpoint():
    """An S3 endpoint that accepts connections and never answers."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield {
        "aws_access_key_id": "k",
        "aws_secret_access_key": "s",
        "aws_region": "us-east-1",
        "aws_endpoint": f"http://127.0.0.1:{server.getsockname()[1]}",
        "allow_http": "true",
    }
    server.close()
    for c in held:
        c.close()


@pytest.mark.slow
def test_an_endpoint_that_never_answers_is_a_typed_error_within_30_seconds(silent_endpoint):
    import time

    import memwal_sql as mw
    from memwal_sql.errors import StorageError

    for call in (
        lambda: mw.open_table("s3://bucket/t", silent_endpoint),
        lambda: ObjectStore("s3://bucket/t", silent_endpoint).get("x"),
        # A claim's WAL replay: the requests in flight fail, the rest are not sent.
        lambda: ObjectStore("s3://bucket/t", silent_endpoint).get_many(
            [f"w/{i}" for i in range(500)]
        ),
    ):
        t0 = time.monotonic()
        with pytest.raises(StorageError):
            call()
        assert time.monotonic() - t0 < 30


def test_a_call_into_a_store_that_stopped_answering_is_left_behind(silent_endpoint):
    """A call (standing in for Lance's I/O, which retries for minutes) is given up on once
    the store does not answer a probe within its timeout."""
    from memwal_sql.errors import StorageUnavailableError

    store = ObjectStore("s3://bucket/t", {**silent_endpoint, "timeout": "1s"})
    stop = threading.Event()
    try:
        with pytest.raises(StorageUnavailableError, match="did not answer a request within 1 s"):
            store.while_answering(lambda: stop.wait(60), "a hung call")
    finally:
        stop.set()  # the call left behind ends


@pytest.mark.s3
def test_a_long_call_into_a_store_that_answers_runs_to_its_end(s3_server):
    store = ObjectStore(f"s3://memwal/{uuid.uuid4().hex}", {**s3_server, "timeout": "1s"})
    assert store.while_answering(lambda: time.sleep(2.5) or "done", "a long call") == "done"
    with pytest.raises(KeyError):  # the call's own error, as it raised it
        store.while_answering(lambda: {}["missing"], "a failing call")
    assert list(store.steps_while_answering(iter([1, 2, 3]), "a read")) == [1, 2, 3]


def test_storage_failures_type_lance_io_errors_and_leave_other_value_errors():
    from memwal_sql.errors import StorageUnavailableError
    from memwal_sql.storage import storage_failures

    unanswered = ValueError(
        "LanceError(IO): Generic S3 error: Error performing GET http://h/b/k in 10s - "
        "HTTP error: error sending request, rust/lance-io/src/object_store.rs:1:1"
    )
    with pytest.raises(StorageUnavailableError, match="did not answer"), storage_failures("a"):
        raise unanswered
    with pytest.raises(StorageError, match="a failed") as failed, storage_failures("a"):
        raise ValueError("LanceError(IO): Generic S3 error: 500 Internal Server Error")
    assert not isinstance(failed.value, StorageUnavailableError)
    with pytest.raises(ValueError, match="bad filter") as other, storage_failures("a read"):
        raise ValueError("bad filter")
    assert not isinstance(other.value, StorageError)


def test_default_timeouts_fill_in_what_storage_options_leave_out():
    from memwal_sql.storage.store import DEFAULT_TIMEOUTS, with_default_timeouts

    assert with_default_timeouts("/local/path", None) == {}
    opts = with_default_timeouts("s3://b/t", {"timeout": "120s", "aws_region": "x"})
    assert opts == {**DEFAULT_TIMEOUTS, "timeout": "120s", "aws_region": "x"}


@pytest.mark.s3
def test_unknown_credentials_are_an_authentication_error(s3_server):
    import memwal_sql as mw
    from memwal_sql.errors import AuthenticationError

    uri = f"s3://memwal/{uuid.uuid4().hex}/t"
    mw.create_table(
        uri,
        pa.schema([pa.field("id", pa.int64(), False)]),
        primary_key="id",
        storage_options=s3_server,
    )
    for wrong in ({"aws_access_key_id": "nobody"}, {"aws_secret_access_key": "wrong"}):
        with pytest.raises(AuthenticationError, match="credentials"):
            mw.open_table(uri, {**s3_server, **wrong})


@pytest.mark.s3
def test_a_missing_bucket_is_a_storage_error_that_says_so(s3_server):
    import memwal_sql as mw

    uri = "s3://no-such-bucket/t"
    for call in (
        lambda: mw.create_table(uri, {"id": [1]}, primary_key="id", storage_options=s3_server),
        lambda: mw.create_table(
            uri, pa.schema([("id", pa.int64())]), primary_key="id", storage_options=s3_server
        ),
        lambda: mw.open_table(uri, s3_server),
    ):
        with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist") as e:
            call()
        assert "aws s3 mb s3://no-such-bucket" in str(e.value)
