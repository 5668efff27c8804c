"""`verispec demo`: the default model, plain against speculative decoding, on two prompts."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from verispec.cli import app
from verispec.cli.runtime_options import DeterministicOption, DeviceOption, RuntimeOption
from verispec import runner
from verispec.identity import explain, verdict
from verispec.models import DEFAULT_MODEL
from verispec.proposers.trained import DEFAULT_PROPOSER_HELP
from verispec.registry import K_HELP, proposer_help
from verispec.request import Request
from verispec.runner import specs

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
    proposer: Annotated[
        Optional[str], typer.Option(help=proposer_help(), show_default=DEFAULT_PROPOSER_HELP)
    ] = None,
    k: Annotated[str, typer.Option("--k", help=K_HELP)] = "auto",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 96,
    dtype: str = "auto",
    runtime: RuntimeOption = "auto",
    deterministic: DeterministicOption = None,
    device: DeviceOption = "auto",
) -> None:
    """Greedy plain vs speculative decoding on a summary and an open question, side by side."""
    proposer_spec, k_spec = specs(model, proposer, k)
    from verispec.models.loading.load import build  # transformers: imported when needed

    plan = runner.load_plan(model, dtype, runtime, deterministic, device, proposer_spec, k_spec)  # refused before "loading"
    console = Console(stderr=True)
    console.print(f"loading {model} ...")
    loaded = build(plan)
    rows: list[DemoRow] = []
    for name, text in PROMPTS.items():
        request = Request(tuple(loaded.encode(text)), max_new_tokens, eos_token_ids=loaded.eos_token_ids, seed=0,
                          proposer=proposer_spec, k=k_spec)
        done = runner.run(loaded, request, compare=True)
        rows.append(DemoRow(name, done.plain.tokens_per_s, done.speculative.tokens_per_s,
                            done.speculative.stats.mean_accepted, done.mismatch))
        console.print(f"[bold]{name}[/bold]: {escape(loaded.decode(done.speculative.tokens))}\n")
    title = f"{loaded.name} ({loaded.dtype_name}), greedy, {max_new_tokens} new tokens, {proposer_spec} k={k}"
    out = Console(file=sys.stdout)
    out.print(demo_table(rows, title))
    for row in rows:
        if row.mismatch is not None:
            out.print(f"{row.prompt}: {explain(row.mismatch)}.", highlight=False)
            out.print(f"  {row.mismatch['diagnosis']}", highlight=False, style="dim")


@dataclass(frozen=True)
class DemoRow:
    """One prompt of the demo; mismatch: `identity.diagnose`'s record, None when identical."""

    prompt: str
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    tokens_per_round: float
    mismatch: dict | None


def demo_table(rows: list[DemoRow], title: str) -> Table:
    """The side-by-side table; 70 columns wide, so it fits an 80-column terminal."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in ("prompt", "plain tok/s", "spec tok/s", "speedup", "tok/round", "identical"):
        table.add_column(column, justify="left" if column == "prompt" else "right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.prompt,
            f"{row.plain_tokens_per_s:.1f}",
            f"{row.spec_tokens_per_s:.1f}",
            f"{row.spec_tokens_per_s / row.plain_tokens_per_s:.2f}x",
            f"{row.tokens_per_round:.2f}",
            verdict(row.mismatch),
        )
    return table
