"""The public API is typed: no public function returns ``Any``, and no module reaches into the
region writer's private methods (routed writes use its public ones).

Read from the source (``ast``), so annotations under ``TYPE_CHECKING`` count as written.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memwal_sql", "planner", "exec_nodes")


def modules() -> Iterator[tuple[Path, ast.Module]]:
    """Every public module of the packages (generated protobuf code aside)."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).parts
            if any(p.startswith("_") and p != "__init__.py" for p in parts):
                continue
            yield path, ast.parse(path.read_text(), str(path))


def is_any(annotation: ast.expr | None) -> bool:
    """Whether a return annotation is ``Any`` (or ``Any`` in a union, as ``Any | None``)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return is_any(ast.parse(annotation.value, mode="eval").body)
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any"
    if isinstance(annotation, ast.BinOp):
        return is_any(annotation.left) or is_any(annotation.right)
    return False


def public_functions(
    body: list[ast.stmt], prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in body:
        if getattr(node, "name", "_").startswith("_"):
            continue
        if isinstance(node, ast.ClassDef):
            yield from public_functions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node


def test_the_checks_see_what_they_look_for():
    sample = ast.parse(
        "def a() -> Any: ...\n"
        "def b() -> 'Any | None': ...\n"
        "def _c() -> Any: ...\n"
        "class D:\n    def e(self) -> typing.Any: ...\n    def f(self) -> dict[str, Any]: ...\n"
    )
    flagged = [name for name, f in public_functions(sample.body) if is_any(f.returns)]
    assert flagged == ["a", "b", "D.e"]


def test_no_public_function_returns_any():
    found = [
        f"{path.relative_to(ROOT)}:{f.lineno} {name}"
        for path, tree in modules()
        for name, f in public_functions(tree.body)
        if is_any(f.returns)
    ]
    assert not found, "public functions returning Any (give them a type):\n" + "\n".join(found)


def writer_private_methods() -> set[str]:
    path = ROOT / "memwal_sql" / "writer" / "region_writer.py"
    (cls,) = [
        n
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "RegionWriter"
    ]
    return {
        n.name
        for n in cls.body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("_") and not n.name.endswith("__")
    }


def test_no_module_uses_a_private_method_of_the_region_writer():
    private = writer_private_methods()
    assert "_check_open" in private  # the check sees the writer's private methods
    found = []
    for path, tree in modules():
        if path.name == "region_writer.py":
            continue
        for node in ast.walk(tree):
            # Calls and references alike (a bound method handed to a thread pool).
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not found, "calls of RegionWriter's private methods:\n" + "\n".join(found)
