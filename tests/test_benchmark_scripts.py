"""The documented benchmark scripts (benchmarks/*.py) stay importable: a module they use that is
renamed or removed fails here, not when a user runs a long benchmark."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_a_benchmark_script_imports(script: Path):
    spec = importlib.util.spec_from_file_location(f"benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # runs its imports; main() is guarded by __name__
    assert callable(getattr(module, "main", None))
