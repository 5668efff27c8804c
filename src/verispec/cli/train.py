"""`verispec train`: self-distil an EAGLE-style or Medusa head for a model on this machine.

The options make a `verispec.train.config.TrainConfig`, which refuses a bad value before any
model loads; `verispec.train.run.run` runs its stages (data, features, fit, save) and this
command draws their progress and prints what was made. Data and checkpoints live in the work
directory (`--work`, default under the verispec cache), never in --out, so a head directory
holds only config.json and model.safetensors; a run that fitted nothing writes nothing there.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from verispec.cli import app
from verispec.models import DEFAULT_MODEL


@app.command()
def train(
    head: Annotated[str, typer.Option(help="eagle (one decoder layer, EAGLE-style), eagle3 (EAGLE-3's standard layer, which vLLM serves: `verispec export-head`) or medusa (K residual heads).")],
    out: Annotated[Path, typer.Option(help="Directory to write the head into (config.json, model.safetensors).")],
    minutes: Annotated[float, typer.Option(help="Wall-clock budget for the whole run (data, features, fitting).")],
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    seed: int = 0,
    data_minutes: Annotated[Optional[float], typer.Option("--data-minutes", help="Of --minutes, how long to grow the data (default: half; 0 uses the cached data as is).")] = None,
    data_conversations: Annotated[Optional[int], typer.Option("--data-conversations", help="Grow the data to exactly this many conversations (the round that reaches it is cut there), however long it takes: the same data for the same seed, count, model, dtype and software, whatever the machine's speed; --minutes then budgets the features and fitting after it. Instead of --data-minutes.")] = None,
    data_only: Annotated[bool, typer.Option("--data-only", help="Only grow the data (and cache its features), for --data-minutes or to --data-conversations.")] = False,
    work: Annotated[Optional[Path], typer.Option(help="Directory for the data, features and checkpoints (default: under the verispec cache).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue fitting from the work directory's checkpoint.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a head already in --out.")] = False,
    steps: Annotated[Optional[int], typer.Option(help="Stop fitting after this many steps (also bounded by --minutes).")] = None,
    vocab: Annotated[Optional[int], typer.Option(help="N, the head vocabulary: the N most frequent tokens of the data; refused where the model or the data holds fewer.", show_default="8192, or as many as the model and the data hold")] = None,
    taps: Annotated[str, typer.Option(help="eagle3 (low/mid/high layers fused) or final (the last hidden state); Medusa reads final.")] = "eagle3",
    unroll: Annotated[int, typer.Option(help="EAGLE: training-time-test steps; Medusa: the number of heads K.")] = 3,
    depth: Annotated[int, typer.Option(help="EAGLE: decoder layers (EAGLE's is one); with --init of a shallower head, the new layers start as the identity.")] = 1,
    lr: Annotated[float, typer.Option(help="AdamW learning rate after warm-up.")] = 1e-3,
    decay: Annotated[float, typer.Option(help="Share of --steps at the end over which the learning rate falls linearly to 0 (0: constant to the end); needs --steps.")] = 0.0,
    batch_tokens: Annotated[int, typer.Option("--batch-tokens", help="Padded tokens per batch.")] = 4096,
    max_sequences: Annotated[Optional[int], typer.Option("--max-sequences", help="Stop growing the data at this many sequences.")] = None,
    prompts: Annotated[str, typer.Option(help="magpie (instructions the target writes itself), openers (the same, each round's user turns started with one of a fixed list of opening words: more kinds of request), documents (local package texts under a task) or texts (local Python source and documentation as they are, nothing generated); each makes its own data directory.")] = "magpie",
    also: Annotated[Optional[list[Path]], typer.Option("--also", help="Also fit on this data (a work directory of `--data-only`, or its data/ directory), for the same model; repeatable.")] = None,
    threads: Annotated[int, typer.Option(help="torch threads.")] = 2,
    dtype: Annotated[str, typer.Option(help="The target's dtype for data and features: auto, float32, bfloat16.")] = "auto",
    score: Annotated[str, typer.Option(help="Positions fitted: answers (the target's answers) or turns (the user's turn too, e.g. quoted text); held-back scores are always on answers.")] = "answers",
    train_dtype: Annotated[str, typer.Option("--train-dtype", help="The head's matrix products while fitting: auto (bfloat16 autocast where the CPU has it natively), float32, bfloat16.")] = "auto",
    init: Annotated[Optional[Path], typer.Option("--init", help="Start fitting from the head in this directory (its weights and vocabulary) instead of fresh weights, e.g. to continue a head on more data; of --head's kind, --taps, --vocab and --unroll.")] = None,
) -> None:
    """Train a head that drafts for MODEL, by self-distillation, within --minutes."""
    from verispec.train.config import TrainConfig
    from verispec.train.run import run

    config = TrainConfig(
        head=head, out=out, minutes=minutes, model=model, seed=seed, data_minutes=data_minutes,
        data_conversations=data_conversations, data_only=data_only, work=work, resume=resume, force=force, steps=steps,
        vocab=vocab, taps=taps, unroll=unroll, depth=depth, lr=lr, decay=decay, batch_tokens=batch_tokens,
        max_sequences=max_sequences, prompts=prompts, also=tuple(also or ()), threads=threads, dtype=dtype, score=score,
        train_dtype=train_dtype, init=init,
        command="verispec train " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["train"] else sys.argv[1:]),
    )
    with Bars() as reporter:
        result = run(config, reporter)
    if result.out is None:
        print(f"data: {result.conversations} sequences, {result.tokens} tokens in {config.data_dir}")
        return
    shown = ("steps", "tokens_seen", "heldout_top1_by_step", "heldout_expected_tokens_per_round")
    print(json.dumps({"out": str(result.out), **{key: result.record[key] for key in shown}}))


class Bars:
    """The run's stages as progress bars on stderr (a `verispec.train.run.Reporter`)."""

    def __enter__(self) -> Bars:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"), transient=False,
        )
        self.progress.start()
        self.tasks: dict[str, int] = {}
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def start(self, stage: str, total: float, done: float = 0.0) -> None:
        self.tasks[stage] = self.progress.add_task(stage, total=total, completed=done, info="")

    def update(self, stage: str, done: float, info: str = "") -> None:
        self.progress.update(self.tasks[stage], completed=done, **({"info": info} if info else {}))

    def note(self, line: str) -> None:
        self.progress.console.print(line, highlight=False)
