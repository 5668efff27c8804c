"""`verispec load-plan`: what `--model M --dtype D --runtime R` would load, and why, without
loading any weight."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from verispec.cli import app
from verispec.cli.runtime_options import DeterministicOption, DeviceOption, RuntimeOption
from verispec.models import DEFAULT_MODEL


@app.command("load-plan")
def load_plan(
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16 or q4.")] = "auto",
    runtime: RuntimeOption = "auto",
    deterministic: DeterministicOption = None,
    device: DeviceOption = "auto",
    trust_remote_code: Annotated[bool, typer.Option(help="Run config code shipped in a directory.")] = False,
    rows: Annotated[
        int,
        typer.Option(
            min=1,
            help="Rows a step is expected to score, which --dtype auto and --runtime auto weigh the costs at: 1 for "
            "plain decoding, k + 1 with k drafts, times the requests in flight (what generate, serve --max-slots and "
            "bench --concurrency assume: docs/runtime.md).",
        ),
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of lines.")] = False,
) -> None:
    """Print what the other commands would load for these options: the file, the architecture,
    the runtime and the weight format, each with why (`--dtype auto`'s choice on this machine at
    --rows rows per step, and the costs it weighed), and whether the weights are exact. Reads
    the config and the GGUF tensor table, no weights."""
    # Imported here: transformers takes seconds to import, and every command loads this module.
    from verispec.models.loading.load_plan import plan_load

    plan = plan_load(model, dtype, runtime, deterministic, device=device, trust_remote_code=trust_remote_code, rows=rows)
    print(json.dumps(plan.as_dict()) if as_json else plan.describe())
