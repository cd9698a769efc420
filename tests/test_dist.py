"""The package as a user installs it: ``make dist``'s wheel, in a fresh venv, away from the clone.

The venv has no system site-packages and gets its dependencies from the same index and pip cache
as the project's own .venv, so it downloads nothing the project's install did not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import memwal_sql
from tests.test_readme import blocks

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memwal_sql", "planner", "exec_nodes")


def _run(command: list[str | Path], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    assert done.returncode == 0, f"{command}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel built from it, as ``make dist`` builds them."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", out, ROOT])
    return out


def test_the_wheel_holds_every_module_typing_file_and_the_console_script(dist):
    (wheel,) = dist.glob("memwal_sql-*.whl")
    assert wheel.name == f"memwal_sql-{memwal_sql.__version__}-py3-none-any.whl"
    assert len(list(dist.glob(f"memwal_sql-{memwal_sql.__version__}.tar.gz"))) == 1
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {
        p.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for p in (ROOT / package).rglob("*")
        if p.suffix in (".py", ".pyi") or p.name == "py.typed"
    }
    assert {"memwal_sql/py.typed", "memwal_sql/_proto/memwal_pb2.py"} <= source
    assert source - names == set()
    entry_points = zipfile.ZipFile(wheel).read(
        f"memwal_sql-{memwal_sql.__version__}.dist-info/entry_points.txt"
    )
    assert "memwal = memwal_sql.cli:main" in entry_points.decode()
    # The README's install lines name the wheel this version builds.
    assert f"./dist/{wheel.name}" in (ROOT / "README.md").read_text()


def test_the_wheel_installs_into_a_fresh_venv_and_runs_the_quickstart(dist, tmp_path):
    (wheel,) = dist.glob("*.whl")
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    _run([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", wheel])
    # Nothing of the clone or of the project's .venv is reachable: not on PATH, not on
    # PYTHONPATH, not the working directory.
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "LANCE_LOG", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join(
        [str(venv / "bin")]
        + [d for d in env["PATH"].split(os.pathsep) if d != str(Path(sys.executable).parent)]
    )

    where = _run(
        [python, "-c", "import memwal_sql, planner, exec_nodes; print(memwal_sql.__file__)"],
        cwd=work,
        env=env,
    )
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    version = _run([venv / "bin" / "memwal", "--version"], cwd=work, env=env)
    assert version.stdout.split() == ["memwal", memwal_sql.__version__]

    ((quickstart,),) = [[c for h, lang, c in blocks() if h == "Quickstart" and lang == "python"]]
    for _ in range(2):  # exist_ok: the Quickstart runs twice
        done = _run([python, "-c", quickstart], cwd=work, env=env)
        assert "lance" not in done.stderr.lower(), done.stderr
    assert (work / "data" / "events").is_dir()
