import os
import shutil

import pytest

from memwal_sql.errors import ObjectExistsError
from memwal_sql.storage import ObjectStore
from memwal_sql.storage.spare_files import SpareFiles

pytestmark = pytest.mark.skipif(not hasattr(os, "O_TMPFILE"), reason="needs O_TMPFILE (Linux)")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def kept(tmp_path):
    store = ObjectStore(str(tmp_path / "root"))
    store.keep_spare_files("wal")
    store._spares.wait_idle()
    return store


def spares_of(store: ObjectStore, prefix: str) -> list[int]:
    return store._spares._ready.get(os.path.join(store.uri, prefix), [])


def test_puts_take_prepared_files_and_the_thread_replaces_them(kept):
    assert len(spares_of(kept, "wal")) == 2
    ready = list(spares_of(kept, "wal"))
    kept.put_if_not_exists("wal/1.arrow", b"one")
    assert spares_of(kept, "wal")[0] == ready[1]  # the oldest spare was used
    kept._spares.wait_idle()
    assert len(spares_of(kept, "wal")) == 2
    for i in range(2, 7):
        kept.put_if_not_exists(f"wal/{i}.arrow", str(i).encode())
    assert [kept.get(f"wal/{i}.arrow") for i in range(1, 7)] == [b"one", b"2", b"3", b"4", b"5", b"6"]
    assert sorted(os.listdir(os.path.join(kept.uri, "wal"))) == sorted(f"{i}.arrow" for i in range(1, 7))


def test_a_lost_race_with_a_spare_keeps_the_winner_and_leaks_nothing(kept):
    kept.put_if_not_exists("wal/1.arrow", b"first")
    kept._spares.wait_idle()
    before = open_fds()
    with pytest.raises(ObjectExistsError):
        kept.put_if_not_exists("wal/1.arrow", b"second")
    kept._spares.wait_idle()
    assert kept.get("wal/1.arrow") == b"first"
    assert open_fds() == before  # the used spare was closed, a new one replaced it


def test_a_spare_outlives_its_directory(kept):
    shutil.rmtree(os.path.join(kept.uri, "wal"))
    kept.put_if_not_exists("wal/1.arrow", b"x")  # the link makes the directory again
    assert kept.get("wal/1.arrow") == b"x"


def test_release_closes_the_spares(kept):
    fds = list(spares_of(kept, "wal"))
    kept.release_spare_files("wal")
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
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
    assert len(spares_of(kept, "wal")) == 2  # the parent's are untouched
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
