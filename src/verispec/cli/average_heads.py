"""`verispec average-heads HEAD HEAD... --out DIR`: the weighted mean of trained heads."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from verispec.cli import BadInput, app
from verispec.cli.paths import FORCE_HELP, check_not_an_input, check_output_directory


@app.command("average-heads")
def average_heads_command(
    heads: Annotated[list[Path], typer.Argument(help="Two or more head directories (of `verispec train --out`).")],
    out: Annotated[Path, typer.Option(help="Directory to write the averaged head into (config.json, model.safetensors).")],
    weights: Annotated[Optional[str], typer.Option(help="Comma-separated weights, one per head, positive, summing to 1 (default: equal).")] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
) -> None:
    """Average the weights of heads of one architecture and vocabulary, such as a head and the
    head `verispec train --init` continued from it (weight-space ensembling). The result loads
    as `--proposer eagle:DIR` (or medusa:DIR); its config records each head, its weight and
    how it was trained."""
    from verispec.heads.average import average_heads
    from verispec.heads.checkpoint import CONFIG, WEIGHTS, write_head

    for head in heads:
        if not head.is_dir():
            raise BadInput(f"{head} is not a directory; give head directories written by `verispec train --out`")
    check_not_an_input(out, "--out", heads)
    parsed = None
    if weights is not None:
        try:
            parsed = [float(part) for part in weights.split(",")]
        except ValueError:
            raise BadInput(f"--weights takes numbers joined by commas (e.g. 0.5,0.5), got {weights!r}") from None
    config, state = average_heads(heads, parsed)
    check_output_directory(out, "--out", (CONFIG, WEIGHTS), force)
    command = shlex.join(["verispec", "average-heads", *map(str, heads), "--out", str(out),
                          *(["--weights", weights] if weights is not None else [])])
    write_head(replace(config, training={"command": command, **config.training}), state, out)
    typer.echo(json.dumps({"out": str(out), "heads": [str(h) for h in heads],
                           "weights": [entry["weight"] for entry in config.training["averaged"]]}))
