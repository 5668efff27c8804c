"""`verispec demo`: the default model, plain against speculative decoding, on two prompts.

The speedup is reported twice: against plain decoding in the format loaded, and against the
fastest plain decoding measured among the formats `--dtype auto` weighs for the model
(`runner.plain_alternatives`), so a format chosen for speculative decoding is not credited
with a slower baseline than another format would decode at."""

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
from verispec.cli.runtime_options import CacheTypeVOption, DeterministicOption, DeviceOption, RuntimeOption
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
    cache_type_v: CacheTypeVOption = None,
    device: DeviceOption = "auto",
) -> None:
    """Greedy plain vs speculative decoding on a summary and an open question, side by side."""
    proposer_spec, k_spec = specs(model, proposer, k)
    from verispec.models.loading.load import build  # transformers: imported when needed

    plan = runner.load_plan(model, dtype, runtime, deterministic, device, proposer_spec, k_spec,
                            cache_type_v=cache_type_v)  # refused before "loading"
    alternatives = runner.plain_alternatives(model, runtime, deterministic, device, plan)
    console = Console(stderr=True)
    console.print(f"loading {model} ...")
    loaded = build(plan)
    others = [build(other) for other in alternatives]  # plain decoding in each other format weighed
    rows: list[DemoRow] = []
    for name, text in PROMPTS.items():
        request = Request(tuple(loaded.encode(text)), max_new_tokens, eos_token_ids=loaded.eos_token_ids, seed=0,
                          proposer=proposer_spec, k=k_spec)
        done = runner.run(loaded, request, compare=True)
        plains = {f"{loaded.dtype_name} ({loaded.runtime})": done.plain.tokens_per_s}
        for other in others:
            plain = Request(tuple(other.encode(text)), max_new_tokens, eos_token_ids=other.eos_token_ids, seed=0)
            plains[f"{other.dtype_name} ({other.runtime})"] = runner.run(other, plain).speculative.tokens_per_s
        fastest = max(plains, key=plains.__getitem__)
        rows.append(DemoRow(name, done.plain.tokens_per_s, done.speculative.tokens_per_s,
                            done.speculative.stats.mean_accepted, done.mismatch, plains[fastest], fastest))
        console.print(f"[bold]{name}[/bold]: {escape(loaded.decode(done.speculative.tokens))}\n")
    title = f"{loaded.name} ({loaded.dtype_name}), greedy, {max_new_tokens} new tokens, {proposer_spec} k={k}; tok/s"
    out = Console(file=sys.stdout)
    out.print(demo_table(rows, title))
    for row in rows:
        out.print(f"{row.prompt}: fastest plain {row.fastest_plain}, {row.fastest_plain_tokens_per_s:.1f} tok/s",
                  highlight=False, style="dim")
    for row in rows:
        if row.mismatch is not None:
            out.print(f"{row.prompt}: {explain(row.mismatch)}.", highlight=False)
            out.print(f"  {row.mismatch['diagnosis']}", highlight=False, style="dim")


@dataclass(frozen=True)
class DemoRow:
    """One prompt of the demo; mismatch: `identity.diagnose`'s record, None when identical;
    fastest_plain: the format (and runtime) whose plain decoding was the fastest measured,
    the loaded one's included, and its tokens/s."""

    prompt: str
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    tokens_per_round: float
    mismatch: dict | None
    fastest_plain_tokens_per_s: float
    fastest_plain: str


def demo_table(rows: list[DemoRow], title: str) -> Table:
    """The side-by-side table; under 80 columns wide, so it fits an 80-column terminal. speedup:
    over plain decoding in the same format; x fastest: over the fastest plain format measured;
    plain and spec in tokens/s."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for column in ("prompt", "plain", "spec", "speedup", "x fastest", "tok/round", "identical"):
        table.add_column(column, justify="left" if column == "prompt" else "right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.prompt,
            f"{row.plain_tokens_per_s:.1f}",
            f"{row.spec_tokens_per_s:.1f}",
            f"{row.spec_tokens_per_s / row.plain_tokens_per_s:.2f}x",
            f"{row.spec_tokens_per_s / row.fastest_plain_tokens_per_s:.2f}x",
            f"{row.tokens_per_round:.2f}",
            verdict(row.mismatch),
        )
    return table
