"""The options that choose the target's runtime, shared by generate, profile, bench and demo."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

RuntimeOption = Annotated[
    str,
    typer.Option(help="auto (the fast Llama runtime where it supports the model, else transformers), fast or hf."),
]
DeterministicOption = Annotated[
    Optional[bool],
    typer.Option(
        "--deterministic/--no-deterministic",
        help="Fast runtime: a row's logits do not depend on how many rows are scored with it, so greedy "
        "speculative output is plain greedy output bit for bit (same weights, same target) "
        "[default: on with the fast runtime; it costs a one-token forward nothing].",
        show_default=False,
    ),
]
