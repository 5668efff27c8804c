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


def test_the_gpu_check_prints_a_failed_capture_and_runs_every_later_shape_eagerly(tmp_path: Path, capsys) -> None:
    """A capture that fails (simulated: the runtime's graphs raise) is printed and recorded, its
    runtimes run eagerly, and a later shape does not try to capture at all."""
    from test_hf_adapter import tiny_llama

    from verispec.models.runtimes.cuda_graphs import ShapeGraphs
    from verispec.models.runtimes.static_llama import StaticLlama

    spec = importlib.util.spec_from_file_location("benchmark_gpu_check", SCRIPTS[0].parent / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)

    class Failing(ShapeGraphs):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    def runtime():
        lm = StaticLlama.from_hf(tiny_llama(0), rows=2, context=16)
        lm.model.use_graphs, lm.model.graphs = True, Failing()  # what a CUDA device would run, failing
        return lm

    check = gpu_check.Check(tmp_path, budget=60)
    first, later = {}, {}
    lm = runtime()
    gpu_check.graphs_or_eager(check, "8b", first, lm)
    assert "not permitted" in first["graph_error"]["error"] and first["graphs"] is False
    assert not lm.model.use_graphs and lm.extend([3, 4]).shape == (2, 64)  # eager now
    assert "graph capture FAILED" in capsys.readouterr().out
    untried = runtime()
    gpu_check.graphs_or_eager(check, "135m", later, untried)
    assert later["graph_error"]["error"] == "not tried: capturing failed on 8b" and not untried.model.use_graphs
