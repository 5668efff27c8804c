"""`verispec export-head DIR --format F --out OUT`: a trained head in the format another engine loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from verispec.cli import BadInput, app
from verispec.cli.paths import check_new_directory
from verispec.head_kind import HeadKind
from verispec.k_spec import K_BOUND

FORMATS = ("speculators", "vllm-medusa")


@app.command("export-head")
def export_head(
    head: Annotated[Path, typer.Argument(help="A head directory written by `verispec train --out`.")],
    out: Annotated[Path, typer.Option(help="A new directory to write the exported head into (never overwritten).")],
    format: Annotated[str, typer.Option("--format", help="speculators (an EAGLE-3 head, for vLLM's method eagle3) or vllm-medusa (a Medusa head, for vLLM's method medusa).")],
    model: Annotated[Optional[str], typer.Option(help="vllm-medusa: the target whose output rows the head drafts through (default: the model the head was trained for).")] = None,
    verifier: Annotated[Optional[str], typer.Option(help="speculators: the target's name or path recorded as the verifier (default: the model the head was trained for).")] = None,
    speculative_tokens: Annotated[Optional[int], typer.Option("--speculative-tokens", min=1, max=K_BOUND, help="speculators: the draft length the config proposes to vLLM.", show_default="3")] = None,
) -> None:
    """Export a head for vLLM: an EAGLE-3 head (`verispec train --head eagle3`) in speculators'
    format, which vLLM serves with speculative_config {"method": "eagle3", "model": OUT}, or a
    Medusa head in vLLM's Medusa format ({"method": "medusa", "model": OUT}). The head's weights
    are copied as they are; `--proposer eagle3:OUT` loads the EAGLE-3 export back and drafts
    the same tokens."""
    from verispec.heads.checkpoint import read_config
    from verispec.heads.export import write_speculators, write_vllm_medusa

    if format not in FORMATS:
        raise BadInput(f"--format must be {' or '.join(FORMATS)}, got {format!r}")
    if not head.is_dir():
        raise BadInput(f"{head} is not a directory; give a head directory written by `verispec train --out`")
    check_new_directory(out, "--out")
    # Each format's own options; one given to the other format would be silently ignored.
    foreign = {"speculators": ("--model", model), "vllm-medusa": ("--verifier", verifier)}[format]
    if foreign[1] is not None or (format == "vllm-medusa" and speculative_tokens is not None):
        option = foreign[0] if foreign[1] is not None else "--speculative-tokens"
        raise BadInput(f"{option} does not apply to --format {format}; drop it")
    config = read_config(head)
    if format == "speculators":
        written = write_speculators(head, out, verifier, 3 if speculative_tokens is None else speculative_tokens)
        method = "eagle3"
    else:
        output = None
        if config.kind == HeadKind.MEDUSA and not config.trained_output:
            from verispec.models.loading.load import load_model

            output = load_model(model or config.target.name, dtype="float32", device="cpu").lm.output_embeddings()
        written = write_vllm_medusa(head, out, output)
        method = "medusa"
    typer.echo(json.dumps({"out": str(written), "format": format,
                           "speculative_config": {"method": method, "model": str(Path(written).resolve())}}))
