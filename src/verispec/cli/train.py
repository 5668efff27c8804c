"""`verispec train`: self-distil an EAGLE-style or Medusa head for a model on this machine.

Stages, each resumable: (1) data: instructions (`--prompts`: magpie, those the target writes
itself; openers, the same started with opening words of many kinds of request; documents,
local package texts under a task) and the target's own answers, or raw
local texts (texts: Python source and documentation, nothing generated), grown to exactly
`--data-conversations` (a function of the seed and the count, not of the machine's speed) or for
`--data-minutes` (`verispec.train.data`); (2) features: the target's hidden states over the
data, computed once and cached beside it; (3) fitting for the rest of `--minutes`
(`verispec.train.loop`) on that data and each `--also` directory's, from fresh weights or from
the head `--init` names, checkpointed; (4) the head
directory in --out, which `--proposer eagle:DIR` / `medusa:DIR` loads, its config recording
how it was made.

Data and checkpoints live in the work directory (`--work`, default under the verispec cache),
never in --out, so a head directory holds only config.json and model.safetensors.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from verispec.cli import app
from verispec.models import DEFAULT_MODEL

HEAD_KINDS = ("eagle", "eagle3", "medusa")
PROMPT_SOURCES = ("magpie", "openers", "documents", "texts")


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
    vocab: Annotated[int, typer.Option(help="N, the head vocabulary: the N most frequent tokens of the data.")] = 8192,
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
    started = time.monotonic()
    if head not in HEAD_KINDS:
        raise ValueError(f"--head must be eagle, eagle3 or medusa, got {head!r}")
    if taps not in ("eagle3", "final"):
        raise ValueError(f"--taps must be eagle3 or final, got {taps!r}")
    if head == "eagle3" and taps != "eagle3":
        raise ValueError("an eagle3 head reads the low, middle and high layers, as vLLM feeds it; drop --taps final")
    if not minutes > 0:
        raise ValueError(f"--minutes must be > 0, got {minutes}")
    if data_conversations is not None:
        if data_conversations < 1:
            raise ValueError(f"--data-conversations must be >= 1, got {data_conversations}")
        if data_minutes is not None:
            raise ValueError("--data-conversations bounds the data stage by count, --data-minutes by the clock; give one of them")
        if max_sequences is not None:
            raise ValueError("--data-conversations sets the data's size exactly, --max-sequences at least; give one of them")
        data_minutes = 0.0
    data_minutes = minutes / 2 if data_minutes is None else data_minutes
    if prompts not in PROMPT_SOURCES:
        raise ValueError(f"--prompts must be {', '.join(PROMPT_SOURCES)}, got {prompts!r}")
    if also and data_only:
        raise ValueError("--also adds data to the fitting, which --data-only skips; drop one of them")
    if not 0 <= data_minutes <= minutes:
        raise ValueError(f"--data-minutes must lie in [0, --minutes = {minutes}], got {data_minutes}")
    for name, value in (("--vocab", vocab), ("--unroll", unroll), ("--depth", depth), ("--batch-tokens", batch_tokens), ("--threads", threads)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if depth != 1 and head != "eagle":
        raise ValueError(f"--depth stacks an EAGLE head's decoder layers; a {head} head has one or none, drop --depth")
    if train_dtype not in ("auto", "float32", "bfloat16"):
        raise ValueError(f"--train-dtype must be auto, float32 or bfloat16, got {train_dtype!r}")
    if score not in ("answers", "turns"):
        raise ValueError(f"--score must be answers or turns, got {score!r}")
    if steps is not None and steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if not 0 <= decay <= 1:
        raise ValueError(f"--decay must lie in [0, 1], got {decay}")
    if decay > 0 and steps is None:
        raise ValueError("--decay plans the learning rate over --steps, which is missing; give --steps N (--minutes still bounds the run)")
    if not data_only and (out / "config.json").exists() and not force:
        raise ValueError(f"{out} already holds a head (config.json); pass --force to overwrite it or choose another --out")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    if init is not None and data_only:
        raise ValueError("--init starts the fitting from a head, which --data-only skips; drop one of them")

    import torch

    from verispec.machine import native_bf16
    from verispec.models.load import load_model
    from verispec.models.parts import cache_root
    from verispec.train.data import (
        DataCache, InstructionRecipe, ResponseRecipe, cached_features, concatenate_features, data_recipe, grow, load_features,
    )
    from verispec.train.documents import DocumentRecipe, Documents
    from verispec.train.texts import TextRecipe, Texts
    from verispec.train.loop import TrainSettings, TrainingData, build_head, choose_vocab, evaluate, expected_tokens, fit, vocab_coverage
    from verispec.heads import load_weights, save_head
    from verispec.train.prompts import OPENERS, end_of_turn_ids, user_turn_prefix

    torch.set_num_threads(threads)
    suffix = "" if prompts == "magpie" else f"-{prompts}"
    work = work or cache_root() / "train" / f"{Path(str(model)).name}-seed{seed}{suffix}"
    cache = DataCache(work / "data")
    extra = [_also_cache(path, str(model), cache) for path in also or []]
    if len({other.root.resolve() for other in extra}) < len(extra):
        raise ValueError("--also names one data directory twice, which would count its sequences twice; give each once")
    if prompts == "documents":
        instructions = Documents(DocumentRecipe())
        print(f"documents: {len(instructions.passages)} passages, {instructions.rounds} rounds of instructions", file=sys.stderr)
    elif prompts == "texts":
        instructions = Texts(TextRecipe())
        print(f"texts: {len(instructions.passages)} passages, {instructions.rounds} rounds", file=sys.stderr)
    elif prompts == "openers":
        instructions = InstructionRecipe(openers=OPENERS)
    else:
        instructions = InstructionRecipe()
    responses = ResponseRecipe()
    recipe = data_recipe(str(model), seed, instructions, responses)
    held = len(cache.conversations())
    if data_conversations is not None and held > data_conversations:
        raise ValueError(
            f"{cache.root} already holds {held} conversations, more than --data-conversations {data_conversations}; "
            "give its count or another --work"
        )
    cache.check_recipe(recipe)
    checkpoint = work / f"{head}-checkpoint.pt"
    if resume and not checkpoint.is_file():
        raise ValueError(f"--resume: no checkpoint at {checkpoint}; run without --resume to start")

    if dtype == "auto":  # the data's features in a float dtype, never load_model's auto q4
        dtype = "bfloat16" if native_bf16() else "float32"
    loaded = load_model(model, dtype=dtype, device="cpu")  # training runs on the CPU
    if score == "turns" and loaded.tokenizer.chat_template is None:
        raise ValueError(f"--score turns finds the user's turn through the chat template, which {model} lacks; use --score answers")
    transformers = loaded.transformers_model().requires_grad_(False)  # it writes the data and its features
    deadline = started + minutes * 60
    with _bar() as bar:
        data_start = time.monotonic()
        if data_conversations is None:
            task = bar.add_task("data", total=data_minutes * 60, info="")

            def grown(n: int, t: int) -> None:
                bar.update(task, completed=time.monotonic() - data_start, info=f"{n} sequences, {t} answer tokens")
        else:
            task = bar.add_task("data", total=data_conversations, completed=held, info="")

            def grown(n: int, t: int) -> None:
                bar.update(task, completed=n, info=f"{n} sequences, {t} answer tokens")
        conversations = grow(
            cache, transformers, loaded.tokenizer, loaded.eos_token_ids, seed, data_start + data_minutes * 60,
            instructions, responses, max_sequences, progress=grown, conversations=data_conversations,
        )
        bar.update(task, completed=data_minutes * 60 if data_conversations is None else len(conversations))
    if data_conversations is not None:
        if len(conversations) < data_conversations:
            raise ValueError(f"--prompts {prompts} ran out of passages at {len(conversations)} conversations, fewer than --data-conversations {data_conversations}")
        deadline = time.monotonic() + minutes * 60  # the count took what it took; --minutes budgets the rest
    if not conversations:
        raise ValueError(f"no training data in {cache.root}; give --data-minutes > 0 to make some")
    print(f"features of {len(conversations)} sequences ...", file=sys.stderr)
    stored, stored_taps = load_features(cache, transformers, conversations)
    if data_only:
        print(f"data: {len(conversations)} sequences, {int(stored['tokens'].numel())} tokens in {cache.root}")
        return
    sources = [_data_record(recipe, conversations, stored)]
    parts = [stored]
    splits = [(len(conversations), seed)]  # (sequences, data seed) per directory, each holding back its own share
    for other in extra:
        other_conversations = other.conversations()
        cached = cached_features(other, len(other_conversations))
        if cached is None:
            raise ValueError(_no_features(other))
        other_stored, other_taps = cached
        if list(other_taps) != list(stored_taps):
            raise ValueError(f"--also {other.root} holds features of the taps {list(other_taps)}, this run's data {list(stored_taps)}; recompute them with `verispec train --data-only`")
        parts.append(other_stored)
        other_recipe = other.recipe()
        splits.append((len(other_conversations), other_recipe["seed"]))
        sources.append({"directory": str(other.root), **_data_record(other_recipe, other_conversations, other_stored)})
    if extra:
        stored = concatenate_features(parts)
        del parts, other_stored, cached  # the parts' tensors: the union holds a copy of each

    bf16 = train_dtype == "bfloat16" or (train_dtype == "auto" and native_bf16())
    settings = TrainSettings(
        kind=head, seed=seed, taps=taps, vocab_size=vocab, unroll=unroll, depth=depth, lr=lr, batch_tokens=batch_tokens, bf16=bf16, score=score,
        steps=steps if decay > 0 else None, decay=decay, init=None if init is None else str(init.resolve()),
    )
    target = loaded.lm
    if init is None:
        start = None
        d2t = choose_vocab(stored["tokens"], vocab, end_of_turn_ids(loaded.tokenizer, loaded.eos_token_ids))
    else:
        start, init_record, init_depth = _init_state(init, settings, str(model), target.num_layers)
        d2t = start["d2t"]
    turn_start = len(user_turn_prefix(loaded.tokenizer)) if score == "turns" else 0
    data = TrainingData(stored, stored_taps, settings.head_taps(target.num_layers), settings, turn_start, splits)
    trained = build_head(head, settings, target, loaded.config, str(model), d2t)
    if start is not None:
        load_weights(trained, start, init, depth=init_depth)
    rows = target.output_embeddings()[d2t].detach().float()  # [N, H]
    before = evaluate(trained, data, rows, settings)  # untrained, or the --init head
    with _bar() as bar:
        task = bar.add_task("fit", total=max(deadline - time.monotonic(), 0.0), info="")
        fit_start = time.monotonic()

        def report(progress, accuracy) -> None:
            agreement = "/".join(f"{a:.2f}" for a in accuracy)
            bar.update(task, completed=time.monotonic() - fit_start,
                       info=f"step {progress.step}, {progress.tokens_seen} tokens, draft accuracy by step {agreement}")

        progress = fit(trained, data, rows, settings, deadline, checkpoint, resume, max_steps=steps, report=report)
    accuracy = evaluate(trained, data, rows, settings)
    top_covered, mass_covered = vocab_coverage(data, rows, d2t)
    record = {
        "command": "verispec train " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["train"] else sys.argv[1:]),
        "data": {
            **sources[0],
            **({"also": sources[1:], "total_sequences": len(data.lengths), "total_tokens": int(stored["tokens"].numel())} if extra else {}),
            "heldout_sequences": len(data.heldout),
        },
        "settings": settings.as_dict(),
        **({"init": init_record} if init else {}),
        "minutes": minutes,
        "fit_seconds": round(progress.seconds, 1),
        "steps": progress.step,
        "kept_step": progress.kept_step,
        "tokens_seen": progress.tokens_seen,
        "heldout_top1_by_step": [round(a, 4) for a in accuracy],
        "heldout_evaluations": progress.evaluations,
        ("heldout_top1_by_step_init" if init else "heldout_top1_by_step_untrained"): [round(a, 4) for a in before],
        "heldout_expected_tokens_per_round": round(expected_tokens(accuracy), 3),
        "heldout_target_top1_in_vocab": round(top_covered, 4),
        "heldout_p_mass_in_vocab": round(mass_covered, 4),
    }
    trained.config.training.update(record)
    save_head(trained, out)
    print(json.dumps({"out": str(out), **{k: record[k] for k in ("steps", "tokens_seen", "heldout_top1_by_step", "heldout_expected_tokens_per_round")}}))


def _also_cache(path: Path, model: str, own: "DataCache") -> "DataCache":
    """The data directory an `--also` PATH names (PATH itself or PATH/data), checked: features
    cached, made for `model`, and not this run's own data."""
    from verispec.train.data import DataCache

    if not path.is_dir():
        raise ValueError(f"--also {path}: no such directory; give a work directory made by `verispec train --data-only --work W`")
    cache = next((DataCache(p) for p in (path, path / "data") if (p / "recipe.json").is_file()), None)
    if cache is None:
        raise ValueError(f"--also {path}: no recipe.json in it or in its data/; give a work directory made by `verispec train --data-only --work W`")
    if cache.root.resolve() == own.root.resolve():
        raise ValueError(f"--also {path} is this run's own data directory; give another one")
    made_for = cache.recipe().get("model")
    if made_for != model:
        raise ValueError(f"--also {path} holds data of the model {made_for!r}, not {model!r}; give data made for the same --model")
    if not cache.features_path.is_file():
        raise ValueError(_no_features(cache))
    return cache


def _init_state(directory: Path, settings: "TrainSettings", model: str, num_layers: int) -> tuple[dict, dict, int]:
    """The saved state of the `--init` head (d2t included), what the new head records of it and
    its depth, after checking that it is a head this run could have made: same model, kind,
    taps, N and K, and no more decoder layers than --depth."""
    from verispec.heads import read_config, read_weights

    config = read_config(directory)
    wanted = {
        "kind (--head)": (config.kind, settings.kind),
        "model (--model)": (config.target.name, model),
        "taps (--taps)": (list(config.feature_layers), list(settings.head_taps(num_layers))),
        "vocabulary N (--vocab)": (config.vocab_size, settings.vocab_size),
        **({"heads K (--unroll)": (config.heads, settings.unroll)} if config.kind == "medusa" else {}),
    }
    wrong = [f"{name} {have} where this run has {want}" for name, (have, want) in wanted.items() if have != want]
    if config.depth > settings.depth:
        wrong.append(f"depth (--depth) {config.depth} where this run has {settings.depth}, fewer")
    if wrong:
        raise ValueError(f"--init {directory} holds a head of another {'; '.join(wrong)}; give the settings it was trained with")
    made = config.training
    return read_weights(directory), {
        "directory": str(directory), **{key: made[key] for key in ("command", "steps", "tokens_seen", "fit_seconds", "init") if key in made},
    }, config.depth


def _no_features(cache: "DataCache") -> str:
    return f"--also {cache.root} has no features for its sequences; run `verispec train --data-only` on it with its settings first"


def _data_record(recipe: dict, conversations: list, stored: dict) -> dict:
    """What the head's config records of one data directory: its recipe and size."""
    return {
        **recipe,
        "sequences": len(conversations),
        "tokens": int(stored["tokens"].numel()),
        "answer_tokens": sum(len(c.answer_ids) for c in conversations),
    }


def _bar():
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"), transient=False,
    )
