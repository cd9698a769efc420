"""The layers hold: no import circle, no import up a layer, the facade only at the top.

`make lint` runs the import-linter contract in pyproject.toml; these tests check what it does not
(circles inside one layer) and that the contract would catch a deliberate upward import.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memwal_sql", "planner", "exec_nodes")
FRONTENDS = ("memwal_sql.cli", "memwal_sql.spark")


def _graph() -> grimp.ImportGraph:
    # Every import counts: module level, in functions and under TYPE_CHECKING.
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_circle_finder_finds_one() -> None:
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert _circles(graph) == [["p.a", "p.b", "p.c"]]


def test_only_frontends_import_the_facade() -> None:
    importers = _graph().find_modules_that_directly_import("memwal_sql")
    assert sorted(m for m in importers if not m.startswith(FRONTENDS)) == []


@pytest.mark.slow
def test_contract_refuses_an_upward_import(tmp_path: Path) -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    for name in (*PACKAGES, "pyproject.toml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, tmp_path / name)
    kept = subprocess.run([lint, "--no-cache"], cwd=tmp_path, capture_output=True, text=True)
    assert kept.returncode == 0, kept.stdout
    bloom = tmp_path / "memwal_sql" / "formats" / "bloom.py"
    bloom.write_text(
        bloom.read_text() + "\n\ndef _up() -> None:\n    import planner.scan  # noqa\n"
    )
    broken = subprocess.run([lint, "--no-cache"], cwd=tmp_path, capture_output=True, text=True)
    assert broken.returncode == 1
    assert "memwal_sql.formats.bloom -> planner.scan" in broken.stdout


def _layers() -> list[list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [[m.strip() for m in layer.replace(":", "|").split("|")] for layer in contract["layers"]]


def test_every_module_has_a_layer() -> None:
    homes = [m for layer in _layers() for m in layer]
    facade = {"memwal_sql"}  # the package's __init__: lazy re-exports, imported by frontends only
    homeless = sorted(
        m
        for m in _graph().modules
        if m not in facade and not any(m == h or m.startswith(h + ".") for h in homes)
    )
    assert homeless == []
