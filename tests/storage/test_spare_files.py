import os
import shutil
import threading
import time

import pytest

from memwal_sql.errors import ObjectExistsError
from memwal_sql.storage import ObjectStore
from memwal_sql.storage.spare_files import SpareFiles


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def kept(tmp_path):
    store = ObjectStore(str(tmp_path / "root"))
    store.keep_spare_files("wal")
    store._spares.wait_idle()
    return store


def spares_of(store: ObjectStore, prefix: str) -> list[str]:
    return store._spares._ready.get(os.path.join(store.uri, prefix), [])


def names_in(store: ObjectStore, prefix: str) -> list[str]:
    return sorted(os.listdir(os.path.join(store.uri, prefix)))


def test_puts_take_prepared_files_and_the_thread_replaces_them_in_batches(kept):
    full = kept._spares.per_directory
    ready = list(spares_of(kept, "wal"))
    assert len(ready) == full
    kept.put_if_not_exists("wal/1.arrow", b"one")
    kept._spares.wait_idle()
    assert spares_of(kept, "wal") == ready[1:]  # the oldest spare was used; no refill for one
    for i in range(2, full // 2 + 1):
        kept.put_if_not_exists(f"wal/{i}.arrow", str(i).encode())
    kept._spares.wait_idle()  # down to half: refilled in one batch
    assert len(spares_of(kept, "wal")) == full
    assert spares_of(kept, "wal")[: full // 2] == ready[full // 2 :]
    written = [f"{i}.arrow" for i in range(1, full // 2 + 1)]
    assert [kept.get(f"wal/{n}") for n in written] == [b"one"] + [
        str(i).encode() for i in range(2, full // 2 + 1)
    ]
    spare_names = [os.path.basename(p) for p in spares_of(kept, "wal")]
    assert names_in(kept, "wal") == sorted(written + spare_names)
    assert [m.path for m in kept.list("wal/")] == sorted(f"wal/{n}" for n in written)


def test_the_refill_thread_never_fsyncs(kept, monkeypatch):
    # Spares need no fsync (a put's own fsync writes its file's new name), and Linux reports a
    # failed write-back to one fsync only, which must be a put's: the thread never takes it.
    import memwal_sql.storage.store as store_module

    synced = []  # made by the refill thread
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(threading.current_thread() is not threading.main_thread())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    puts = kept._spares.per_directory // 2
    for i in range(puts):
        kept.put_if_not_exists(f"wal/{i}.arrow", b"x")
    kept._spares.wait_idle()
    assert len(spares_of(kept, "wal")) == kept._spares.per_directory  # it did refill
    assert synced and not any(synced)
    assert store_module.os.fsync is recording_fsync  # the store's fsyncs were recorded too


def test_a_failed_refill_is_tried_again_at_the_next_put(kept, monkeypatch):
    from memwal_sql.storage import spare_files

    real = spare_files.create_temp_file
    monkeypatch.setattr(
        spare_files,
        "create_temp_file",
        lambda d, stem: (_ for _ in ()).throw(OSError(28, "No space left")),
    )
    for i in range(kept._spares.per_directory + 1):  # every spare used; the refill fails
        kept.put_if_not_exists(f"wal/{i}.arrow", b"x")
    kept._spares.wait_idle()
    assert spares_of(kept, "wal") == []
    monkeypatch.setattr(spare_files, "create_temp_file", real)
    kept.put_if_not_exists("wal/next.arrow", b"x")  # no spare, but it wakes the refill
    kept._spares.wait_idle()
    assert full_but_the_put_that_waited(kept)


def full_but_the_put_that_waited(store) -> bool:
    """The directory refilled. The put that woke the refill either found the batch already
    under way, waited for it and took a spare of it, or found none and wrote its own file: a
    thread-timing race (one CI run took the first way), both right."""
    n = len(spares_of(store, "wal"))
    return store._spares.per_directory - 1 <= n <= store._spares.per_directory


def test_a_refill_that_dies_hangs_nothing(kept, monkeypatch):
    from memwal_sql.storage import spare_files

    real = spare_files._create
    monkeypatch.setattr(spare_files, "_create", lambda d, n: (_ for _ in ()).throw(MemoryError()))
    for i in range(kept._spares.per_directory + 1):
        kept.put_if_not_exists(f"wal/{i}.arrow", b"x")  # would wait for the dead batch
    monkeypatch.setattr(spare_files, "_create", real)
    assert [m.path for m in kept.list("wal/")] == sorted(
        f"wal/{i}.arrow" for i in range(kept._spares.per_directory + 1)
    )
    kept.put_if_not_exists("wal/next.arrow", b"x")  # the thread lives on and refills
    kept._spares.wait_idle()
    assert full_but_the_put_that_waited(kept)
    kept.release_spare_files("wal")


def test_removing_spares_is_best_effort(kept, monkeypatch):
    from memwal_sql.storage import spare_files

    def read_only(path):
        raise OSError(30, "Read-only file system", path)

    monkeypatch.setattr(spare_files.os, "unlink", read_only)
    kept.release_spare_files("wal")  # a closing writer does not fail on its spares
    monkeypatch.undo()
    old = time.time() - 2 * spare_files.SPARE_MAX_AGE
    for name in os.listdir(os.path.join(kept.uri, "wal")):
        os.utime(os.path.join(kept.uri, "wal", name), (old, old))
    assert kept.remove_temp_files("wal") == kept._spares.per_directory  # removed later


def test_another_handle_cleaning_up_keeps_an_idle_writer_spares(kept, tmp_path):
    old = time.time() - 3600  # idle for an hour: older than a crashed put's leftovers
    for path in spares_of(kept, "wal"):
        os.utime(path, (old, old))
    assert ObjectStore(str(tmp_path / "root")).remove_temp_files("wal") == 0
    assert all(os.path.exists(p) for p in spares_of(kept, "wal"))


def test_a_spare_removed_by_someone_else_still_makes_the_put(kept):
    for path in spares_of(kept, "wal"):
        os.unlink(path)  # e.g. another process's clean-up of old temporary files
    kept.put_if_not_exists("wal/1.arrow", b"x")
    assert kept.get("wal/1.arrow") == b"x"
    kept._spares.wait_idle()
    assert [m.path for m in kept.list("wal/")] == ["wal/1.arrow"]


def test_the_clean_up_of_old_temporary_files_keeps_this_process_spares(kept):
    old = time.time() - 3600
    leftover = os.path.join(kept.uri, "wal", ".crashed.0123.tmp")
    open(leftover, "wb").close()
    for path in [leftover, *spares_of(kept, "wal")]:
        os.utime(path, (old, old))
    assert kept.remove_temp_files("wal") == 1
    assert all(os.path.exists(p) for p in spares_of(kept, "wal"))


def test_a_lost_race_with_a_spare_keeps_the_winner_and_leaks_nothing(kept):
    kept.put_if_not_exists("wal/1.arrow", b"first")
    kept._spares.wait_idle()
    before = open_fds()
    with pytest.raises(ObjectExistsError):
        kept.put_if_not_exists("wal/1.arrow", b"second")
    kept._spares.wait_idle()
    assert kept.get("wal/1.arrow") == b"first"
    assert open_fds() == before
    assert [m.path for m in kept.list("wal/")] == ["wal/1.arrow"]
    assert len(os.listdir(os.path.join(kept.uri, "wal"))) == 1 + len(spares_of(kept, "wal"))


def test_a_spare_outlives_its_directory(kept):
    shutil.rmtree(os.path.join(kept.uri, "wal"))
    kept.put_if_not_exists("wal/1.arrow", b"x")  # the put makes the directory again
    assert kept.get("wal/1.arrow") == b"x"


def test_release_removes_the_spares(kept):
    kept.release_spare_files("wal")
    assert names_in(kept, "wal") == []
    kept.put_if_not_exists("wal/1.arrow", b"x")  # works without spares
    assert kept.get("wal/1.arrow") == b"x"


def test_directories_not_kept_get_no_spares(kept):
    kept.put_if_not_exists("manifest/1.binpb", b"m")
    kept._spares.wait_idle()
    assert spares_of(kept, "manifest") == []


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
def test_a_forked_child_never_uses_its_parents_spares(kept):
    directory = os.path.join(kept.uri, "wal")
    pid = os.fork()
    if pid == 0:  # the child: the parent's spares are gone, puts still work
        ok = kept._spares.take(directory) is None
        kept.put_if_not_exists("wal/child.arrow", b"c")
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(spares_of(kept, "wal")) == kept._spares.per_directory  # the parent's are untouched
    assert all(os.path.exists(p) for p in spares_of(kept, "wal"))
    kept.put_if_not_exists("wal/parent.arrow", b"p")
    assert kept.get("wal/child.arrow") == b"c" and kept.get("wal/parent.arrow") == b"p"


def test_spare_limit_per_directory_and_directories(tmp_path):
    spares = SpareFiles(per_directory=1, max_dirs=2)
    dirs = [tmp_path / str(i) for i in range(3)]
    for d in dirs:
        d.mkdir()
        spares.keep(str(d))
    spares.wait_idle()
    assert [len(spares._ready.get(str(d), [])) for d in dirs] == [1, 1, 0]
    spares.close()
    assert spares.take(str(dirs[0])) is None
    assert [os.listdir(d) for d in dirs] == [[], [], []]  # closing removes the spares


def test_a_store_collected_in_the_spare_thread_does_not_hang_it(tmp_path):
    # A store in a reference cycle is freed by whichever thread runs the cycle collector; when
    # that is the spare-file thread, holding its lock, the store's finalizer closes the spares
    # on the same thread: the lock must be re-entrant.
    # The collector stays off from the store's creation: a collection before the test wants one
    # would move the store to an older generation, which a full test run may not collect for
    # many seconds (Python collects the oldest only when it has grown by a quarter).
    import gc

    threshold = gc.get_threshold()
    gc.disable()
    try:
        store = ObjectStore(str(tmp_path / "root"))
        store.cycle = store
        store.keep_spare_files("w")
        spares = store._spares
        spares.wait_idle()
        directory = os.path.join(store.uri, "w")
        del store
        while not spares._lacks(spares._ready[directory]):
            spares.take(directory)  # the last take wakes the spare thread
        gc.set_threshold(1)
        gc.enable()
        deadline = time.monotonic() + 5
        while not spares._closed and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gc.set_threshold(*threshold)
        gc.enable()
    assert spares._closed
    assert spares._mutex.acquire(timeout=2)
    spares._mutex.release()
