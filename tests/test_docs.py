"""The API reference covers the public API: every name ``memwal_sql`` exports has a page.

``make docs`` (``mkdocs build --strict``) fails on a broken link or a page left out of the
navigation; this checks what it cannot: that a new export is not left out of the reference.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import memwal_sql

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"


def test_every_export_of_memwal_sql_is_in_the_reference():
    text = "\n".join(p.read_text() for p in REFERENCE.glob("*.md"))
    documented = set(re.findall(r"^::: ([\w.]+)", text, re.M))
    for name in memwal_sql.__all__:
        obj = getattr(memwal_sql, name)
        if isinstance(obj, types.ModuleType):
            assert obj.__name__ in documented, name
        else:
            assert any(path.endswith(f".{name}") for path in documented), name
    assert "memwal_sql.spark" in documented
