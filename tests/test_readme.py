"""The README's code blocks run as written, in order, in a fresh directory.

Every ``python`` block runs, each in a process of its own; ``bash`` blocks run too, except the
install block (``make ...``, which is how this test itself is run). Neither prints anything of
Lance's log on stderr. The S3 and Spark how-tos run against the test S3 server and the test
Spark session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import S3_BUCKET

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str, str]]:
    """(heading, language, code) of every fenced block, in order."""
    out, heading, pos = [], "", 0
    for m in _BLOCK.finditer(README):
        for h in re.findall(r"^#+ (.+)$", README[pos : m.start()], re.M):
            heading = h
        # Padded so a failure names the README's own line.
        code = "\n" * README.count("\n", 0, m.start(2)) + m.group(2)
        out.append((heading, m.group(1), code))
        pos = m.end()
    return out


SPECIAL = {"Use S3", "Use Spark", "Install"}


def run_python(code: str, where: Path) -> None:
    old = Path.cwd()
    os.chdir(where)
    try:
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    finally:
        os.chdir(old)


def run_bash(code: str, where: Path) -> None:
    env = _env(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    _run(["bash", "-euo", "pipefail", "-c", code], code, where, env)


def run_python_process(code: str, where: Path) -> None:
    """Like :func:`run_python`, in a process of its own, as a user runs the block."""
    _run([sys.executable, "-c", code], code, where, _env())


def _env(**extra: str) -> dict[str, str]:
    """This environment without LANCE_LOG: Lance's log as a user gets it by default."""
    return {**{k: v for k, v in os.environ.items() if k != "LANCE_LOG"}, **extra}


def _run(command: list[str], code: str, where: Path, env: dict[str, str]) -> None:
    done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    # Nothing from Lance's (Rust) log: the library keeps it at error unless LANCE_LOG is set.
    assert "lance" not in done.stderr.lower(), f"{code}\n--- stderr\n{done.stderr}"


def quickstart(where: Path) -> None:
    ((code,),) = [[c for h, lang, c in blocks() if h == "Quickstart" and lang == "python"]]
    run_python(code, where)


def test_the_readme_has_the_guides_sections_in_order():
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings[:5] == ["Install", "Quickstart", "Concepts", "How-tos", "Writer options"]
    for later in ("Command line", "Performance", "Limits"):
        assert later in headings
    assert "../" not in README and not re.search(r"\bissue \d", README, re.I)


@pytest.mark.slow
def test_every_python_and_shell_block_runs(tmp_path):
    ran = 0
    for heading, lang, code in blocks():
        if heading in SPECIAL:
            continue
        if lang == "python":
            run_python_process(code, tmp_path)
        elif lang == "bash":
            run_bash(code, tmp_path)
        else:
            continue
        ran += 1
    assert ran >= 8


@pytest.mark.s3
def test_the_s3_how_to_runs(tmp_path, s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server["aws_secret_access_key"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["aws_endpoint"])
    monkeypatch.setenv("MEMWAL_BUCKET", S3_BUCKET)
    (code,) = [c for h, lang, c in blocks() if h == "Use S3" and lang == "python"]
    run_python(code.replace("readme-events", f"readme-{tmp_path.name}"), tmp_path)


@pytest.mark.spark
@pytest.mark.slow
def test_the_spark_how_to_runs_under_the_venv_python_without_activation(tmp_path):
    """As a user runs it: ``.venv/bin/python`` with the venv not activated, so the ``python3``
    on PATH is another Python, without memwal_sql; the block's own Spark session is used."""
    quickstart(tmp_path)
    other = tmp_path / "other-bin"
    other.mkdir()
    (other / "python3").symlink_to(Path(sys.base_prefix) / "bin" / "python3")  # not the venv's
    venv_bin = str(Path(sys.executable).parent)
    path = [str(other)] + [d for d in os.environ["PATH"].split(os.pathsep) if d != venv_bin]
    drop = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH")
    env = {k: v for k, v in _env(PATH=os.pathsep.join(path)).items() if k not in drop}
    lacking = subprocess.run(
        ["python3", "-c", "import memwal_sql"], cwd=tmp_path, env=env, capture_output=True
    )
    assert lacking.returncode != 0, "the PATH's python3 must lack memwal_sql for this test"
    (code,) = [c for h, lang, c in blocks() if h == "Use Spark" and lang == "python"]
    _run([sys.executable, "-c", code], code, tmp_path, env)
