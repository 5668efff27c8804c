"""The options that choose the target's runtime, shared by generate, profile, bench and demo."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

RuntimeOption = Annotated[
    str,
    typer.Option(
        help="auto (the fast Llama runtime where it supports the model, else transformers), fast, hf, or "
        "llamacpp (a GGUF file decoded by llama.cpp itself: its arithmetic, a different target from float32; "
        "needs llama-cpp-python)."
    ),
]
DeterministicOption = Annotated[
    Optional[bool],
    typer.Option(
        "--deterministic/--no-deterministic",
        help="Fast and llama.cpp runtimes: a row's logits do not depend on how many rows are scored with it, so greedy "
        "speculative output is plain greedy output bit for bit (same weights, same target) "
        "[default: on with the fast and llama.cpp runtimes; it costs the fast runtime's one-token forward "
        "nothing, and llama.cpp's a padding row].",
        show_default=False,
    ),
]
