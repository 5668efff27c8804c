"""`verispec demo`: the default model, plain against speculative decoding, on two prompts."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from verispec.cli import app
from verispec.cli.generate import timed_run, warm_up
from verispec.engine import Decoding
from verispec.models import DEFAULT_MODEL
from verispec.registry import K_HELP, build_policy, build_proposer, parse_k, proposer_help
from verispec.sampling import SamplingParams

ARTICLE = (
    "The city council voted on Tuesday to extend the riverside bike path by four kilometres, "
    "connecting the old harbour district to the university campus. The project will cost 12 "
    "million euros, two thirds of which come from a regional fund for low-carbon transport. "
    "Construction starts in March and should finish before the end of next year. Council member "
    "Ana Ruiz said the extension would cut car trips between the harbour and the campus, while "
    "shop owners on Quay Street asked for more parking during the works."
)

PROMPTS = {
    "summary (copy-heavy)": f"Summarize this article in three sentences, reusing its wording:\n\n{ARTICLE}",
    "open question": "Why do leaves change colour in autumn? Answer in a short paragraph.",
}


@app.command()
def demo(
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    proposer: Annotated[str, typer.Option(help=proposer_help())] = "lookup",
    k: Annotated[str, typer.Option("--k", help=K_HELP)] = "auto",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens")] = 96,
    dtype: str = "auto",
) -> None:
    """Greedy plain vs speculative decoding on a summary and an open question, side by side."""
    parse_k(k)
    console = Console(stderr=True)
    console.print(f"loading {model} ...")
    from verispec.models.load import load_model  # transformers: imported when needed

    loaded = load_model(model, dtype=dtype)
    greedy = SamplingParams(temperature=0)
    table = Table(title=f"{loaded.name} ({str(loaded.dtype).removeprefix('torch.')}), greedy, {max_new_tokens} new tokens")
    for column in ("prompt", "plain tok/s", f"{proposer} k={k} tok/s", "speedup", "tokens/round", "identical"):
        table.add_column(column, justify="left" if column == "prompt" else "right")
    for name, text in PROMPTS.items():
        prompt_ids = loaded.encode(text)
        drafter = build_proposer(proposer, loaded)
        policy = build_policy(k, loaded.lm, drafter, prompt_ids, greedy)
        options = dict(max_new_tokens=max_new_tokens, sampling=greedy, eos_token_id=loaded.eos_token_id)
        warm_up(loaded, prompt_ids)
        plain = timed_run(Decoding(loaded.lm, None, prompt_ids, k=0, **options), loaded, echo=False)
        spec = timed_run(Decoding(loaded.lm, drafter, prompt_ids, k=policy, **options), loaded, echo=False)
        table.add_row(
            name,
            f"{plain['tokens_per_s']:.1f}",
            f"{spec['tokens_per_s']:.1f}",
            f"{spec['tokens_per_s'] / plain['tokens_per_s']:.2f}x",
            f"{spec['stats'].mean_accepted:.2f}",
            "yes" if spec["tokens"] == plain["tokens"] else "NO",
        )
        console.print(f"[bold]{name}[/bold]: {loaded.decode(spec['tokens'])}\n")
    Console(file=sys.stdout).print(table)
