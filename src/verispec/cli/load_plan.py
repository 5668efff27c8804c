"""`verispec load-plan`: what `--model M --dtype D --runtime R` would load, and why, without
loading any weight."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from verispec.cli import app
from verispec.cli.runtime_options import CacheTypeVOption, ConcurrencyOption, DeterministicOption, DeviceOption, RuntimeOption
from verispec.models import DEFAULT_MODEL
from verispec.proposers.trained import DEFAULT_PROPOSER_HELP
from verispec.registry import K_HELP, proposer_help
from verispec.runner import NO_PROPOSER, load_plan as planned, specs


@app.command("load-plan")
def load_plan(
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16 or q4.")] = "auto",
    runtime: RuntimeOption = "auto",
    deterministic: DeterministicOption = None,
    cache_type_v: CacheTypeVOption = None,
    device: DeviceOption = "auto",
    trust_remote_code: Annotated[bool, typer.Option(help="Run config code shipped in a directory.")] = False,
    proposer: Annotated[
        Optional[str],
        typer.Option(help=f"The proposer --dtype auto expects, as generate's. {proposer_help()} `none`: plain decoding.",
                     show_default=DEFAULT_PROPOSER_HELP),
    ] = None,
    k: Annotated[str, typer.Option("--k", help=K_HELP)] = "auto",
    concurrency: ConcurrencyOption = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of lines.")] = False,
) -> None:
    """Print what the other commands would load for these options: the file, the architecture,
    the runtime and the weight format, each with why (`--dtype auto`'s choice on this machine:
    each candidate's expected tokens/s for the proposer, k and concurrency given, at the k it
    would choose, and its one-row cost), and whether the weights are exact. Reads the config and
    the GGUF tensor table, no weights."""
    proposer_spec, k_spec = (None, 0) if proposer == NO_PROPOSER else specs(model, proposer, k)
    plan = planned(model, dtype, runtime, deterministic, device, proposer_spec, k_spec, concurrency,
                   trust_remote_code=trust_remote_code, cache_type_v=cache_type_v)
    print(json.dumps(plan.as_dict()) if as_json else plan.describe())
