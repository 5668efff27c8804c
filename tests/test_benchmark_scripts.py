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


def test_the_gpu_check_runs_its_smoke_mode_on_the_cpu(tmp_path: Path) -> None:
    """`benchmarks/gpu_check.py` with SMOKE=1: every part on tiny shapes on the CPU, so a run on a
    GPU machine does not spend its minutes on a broken script."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "SMOKE": "1", "PYTHONPATH": str(root / "src")}
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_check.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    shape = json.loads((tmp_path / "gpu_check.json").read_text())["shapes"]["tiny"]
    assert not [part for part in shape.values() if isinstance(part, dict) and ("error" in part or "skipped" in part)]
    assert set(shape["forward"]["v"]) == {"1", "2", "5"} and shape["plain_tok_s"] > 0 and shape["hf_generate_tok_s"] > 0
    assert all(row["identical"] for row in shape["oracle"]) and len(shape["oracle"]) == 4
    assert all(level["batch_equal_alone"] and level["oracle_identical"] for level in shape["scheduler"].values())
    assert shape["head"]["identical"] and shape["head"]["device"] == "cpu"
