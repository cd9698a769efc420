"""Where every benchmark's JSON goes: its results, with the machine and versions they ran on.

Example:
    ``write_results("benchmarks/results/bench_x.json", {"ratios": ratios})``
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from typing import Any


def machine() -> dict[str, Any]:
    """When, on which machine and with which versions a benchmark measured (docs/performance.md
    shows it beside the results)."""
    import datafusion
    import lance
    import pyarrow

    return {
        "measured_at": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "lance": lance.__version__,
        "datafusion": datafusion.__version__,
        "pyarrow": pyarrow.__version__,
    }


def write_results(path: str, results: dict[str, Any]) -> None:
    """Write ``results`` (with :func:`machine`) as JSON to ``path`` and say so."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine(), **results}, f, indent=2)
    print(f"\nwrote {path}")
