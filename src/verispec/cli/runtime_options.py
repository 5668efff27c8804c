"""The options that choose the target and its runtime, shared by generate, profile, bench, demo, serve and load-plan."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

RuntimeOption = Annotated[
    str,
    typer.Option(
        help="auto (on a CPU the fast Llama runtime, on CUDA the static one, where it supports the model; else "
        "transformers), fast (CPU), static (fixed shapes over a static cache, CUDA graphs on CUDA; eager on a CPU), "
        "hf, or llamacpp (a GGUF file decoded by llama.cpp itself: its arithmetic, a different target from float32; "
        "needs llama-cpp-python)."
    ),
]
DeterministicOption = Annotated[
    Optional[bool],
    typer.Option(
        "--deterministic/--no-deterministic",
        help="Fast, static and llama.cpp runtimes: a row's logits do not depend on how many rows are scored with it, so greedy "
        "speculative output is plain greedy output bit for bit (same weights, same target) "
        "[default: on with the fast, static and llama.cpp runtimes; it costs the fast runtime's one-token forward "
        "nothing, llama.cpp's a padding row, and the static runtime's every forward its full row bucket; off, the "
        "static runtime takes the smallest shape that holds a step and may part from plain decoding at near ties].",
        show_default=False,
    ),
]
CacheTypeVOption = Annotated[
    Optional[str],
    typer.Option(
        "--cache-type-v",
        help="llama.cpp runtime: the value cache's type, f16 (llama.cpp's default) or q8_0 (values rounded to 8-bit "
        "blocks: another target, on which a row's logits never depend on a forward's size, so deterministic decoding "
        "needs no padding row and greedy output equals llama.cpp's own on the same settings) [default: f16].",
        show_default=False,
    ),
]
DeviceOption = Annotated[
    str,
    typer.Option(
        help="Where the model runs: auto (CUDA where torch sees a device, else the CPU), cpu, cuda or cuda:N. On "
        "CUDA, --runtime auto takes the static runtime and --dtype auto bfloat16 (float16 without it).",
    ),
]
ConcurrencyOption = Annotated[
    int,
    typer.Option(
        "--concurrency",
        min=1,
        help="Requests in flight --dtype auto and --runtime auto expect a step to decode [default: 1, as generate "
        "and demo expect, so every command loads the same target for the same model, proposer and k; a busy "
        "server may weigh more: q4 costs nearly in proportion to the rows a batch scores].",
        show_default=False,
    ),
]
