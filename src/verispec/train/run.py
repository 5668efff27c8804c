"""One training run of a head, in named stages, callable from Python as `verispec train` runs it:

    config = TrainConfig(head="eagle", out=Path("heads/e"), minutes=30)   # every value checked
    result = run(config)                                                # data, features, fit, save
    result.out, result.record["steps"]

1. `data`: the target's own conversations grown in the work directory for the data budget or
   to exactly `data_conversations` (`verispec.train.data`: instructions from `prompts`, the
   target's answers), or raw local texts.
2. `features`: the target's hidden states over the data, computed once and cached beside it,
   joined with each `also` directory's.
3. `fit`: the head fitted for the rest of `minutes` (`verispec.train.loop.fit`) from fresh
   weights or the `init` head, checkpointed in the work directory.
4. `save`: the head directory in `out`, its config recording how it was made.

A run that fitted no step writes nothing to `out` and raises `NothingFitted`, saying why (the
data took the budget) and what to do. Each stage reports progress through a `Reporter` (the
command draws bars; by default nothing is shown).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from verispec.train.config import VOCAB, TrainConfig, init_config, no_features

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.train.data import Conversation, DataCache
    from verispec.train.loop import Head, Progress, TrainSettings


class NothingFitted(ValueError):
    """The run ended before its first fitting step; nothing was written to `out`."""


class Reporter(Protocol):
    """Where a run's stages report: `start(stage, total, done)`, then `update(stage, done, info)`
    (done and total in seconds, or in conversations for a data stage bounded by count), and
    `note(line)` for a line between stages."""

    def start(self, stage: str, total: float, done: float = 0.0) -> None: ...

    def update(self, stage: str, done: float, info: str = "") -> None: ...

    def note(self, line: str) -> None: ...


class Quiet:
    """A `Reporter` that shows nothing."""

    def start(self, stage: str, total: float, done: float = 0.0) -> None:
        pass

    def update(self, stage: str, done: float, info: str = "") -> None:
        pass

    def note(self, line: str) -> None:
        pass


@dataclass
class Grown:
    """The data stage's outcome: the work directory's data, its recipe, its conversations and
    the deadline the rest of the run keeps."""

    cache: DataCache
    recipe: dict
    conversations: list[Conversation]
    deadline: float


@dataclass
class Features:
    """The data a head is fitted on: every directory's features joined, their taps, what the
    head's config records of each directory, and (sequences, data seed) per directory, each
    holding back its own share."""

    stored: dict[str, torch.Tensor]
    taps: tuple
    sources: list[dict]
    splits: list[tuple[int, int]]


@dataclass
class Fitted:
    head: Head
    progress: Progress
    record: dict = field(default_factory=dict)


@dataclass
class Result:
    """What a run made: `out` (None for `data_only`), the conversations in the work directory and
    what the head's config records (`record`: steps, held-back accuracy, ...; empty for data only)."""

    out: Path | None
    conversations: int
    tokens: int
    record: dict = field(default_factory=dict)


def run(config: TrainConfig, reporter: Reporter | None = None) -> Result:
    """The whole run: load the target, check what needs it, then the four stages."""
    reporter = reporter or Quiet()
    started = time.monotonic()
    torch.set_num_threads(config.threads)
    loaded = load_target(config)
    grown = data(config, loaded, reporter, started)
    reporter.note(f"features of {len(grown.conversations)} sequences ...")
    joined = features(config, loaded, grown)
    tokens = int(joined.stored["tokens"].numel())
    if config.data_only:
        return Result(None, len(grown.conversations), tokens)
    fitted = fit(config, loaded, joined, grown.deadline, reporter)
    save(config, fitted)
    return Result(config.out, len(grown.conversations), tokens, fitted.record)


def load_target(config: TrainConfig) -> LoadedModel:
    """The target in a float dtype (its features are the data's), checked against what needs
    it: the vocabulary (from the config, before any weight is read), the chat template of
    `score = "turns"`."""
    from verispec.machine import native_bf16
    from verispec.models.loading.load import build
    from verispec.models.loading.load_plan import model_config, plan_load

    dtype = config.dtype if config.dtype != "auto" else ("bfloat16" if native_bf16() else "float32")
    plan = plan_load(config.model, dtype, device="cpu")  # training runs on the CPU
    vocab = int(model_config(plan.source).vocab_size)
    if config.vocab is not None and config.vocab > vocab and not config.data_only:
        raise ValueError(f"--vocab {config.vocab} exceeds {config.model}'s vocabulary of {vocab} tokens; give --vocab {vocab} or less")
    loaded = build(plan)
    if config.score == "turns" and loaded.tokenizer.chat_template is None:
        raise ValueError(f"--score turns finds the user's turn through the chat template, which {config.model} lacks; use --score answers")
    return loaded


def data(config: TrainConfig, loaded: LoadedModel, reporter: Reporter, started: float) -> Grown:
    """Stage 1: the conversations in the work directory, grown for the data budget or to the
    count; and the deadline the rest of the run keeps (the count took what it took: `minutes`
    then budgets the features and fitting)."""
    from verispec.train.data import DataCache, InstructionRecipe, ResponseRecipe, data_recipe, grow
    from verispec.train.documents import DocumentRecipe, Documents
    from verispec.train.prompts import OPENERS
    from verispec.train.texts import TextRecipe, Texts

    cache = DataCache(config.data_dir)
    if config.prompts == "documents":
        instructions = Documents(DocumentRecipe())
        reporter.note(f"documents: {len(instructions.passages)} passages, {instructions.rounds} rounds of instructions")
    elif config.prompts == "texts":
        instructions = Texts(TextRecipe())
        reporter.note(f"texts: {len(instructions.passages)} passages, {instructions.rounds} rounds")
    else:
        instructions = InstructionRecipe(openers=OPENERS) if config.prompts == "openers" else InstructionRecipe()
    recipe = data_recipe(str(config.model), config.seed, instructions, ResponseRecipe())
    held = len(cache.conversations())
    count = config.data_conversations
    if count is not None and held > count:
        raise ValueError(f"{cache.root} already holds {held} conversations, more than --data-conversations {count}; give its count or another --work")
    cache.check_recipe(recipe)
    transformers = loaded.transformers_model().requires_grad_(False)  # it writes the data and its features
    budget = config.data_budget_minutes * 60
    data_start = time.monotonic()
    reporter.start("data", budget if count is None else count, 0 if count is None else held)

    def grown(n: int, t: int) -> None:
        reporter.update("data", time.monotonic() - data_start if count is None else n, f"{n} sequences, {t} answer tokens")

    conversations = grow(
        cache, transformers, loaded.tokenizer, loaded.eos_token_ids, config.seed, data_start + budget, instructions,
        ResponseRecipe(), config.max_sequences, progress=grown, conversations=count,
    )
    reporter.update("data", budget if count is None else len(conversations))
    deadline = started + config.minutes * 60
    if count is not None:
        if len(conversations) < count:
            raise ValueError(f"--prompts {config.prompts} ran out of passages at {len(conversations)} conversations, fewer than --data-conversations {count}")
        deadline = time.monotonic() + config.minutes * 60
    if not conversations:
        raise ValueError(f"no training data in {cache.root}; give --data-minutes > 0 to make some")
    return Grown(cache, recipe, conversations, deadline)


def features(config: TrainConfig, loaded: LoadedModel, grown: Grown) -> Features:
    """Stage 2: the features of this run's data (computed once, cached beside it), joined with
    each `also` directory's."""
    from verispec.train.data import cached_features, concatenate_features, load_features

    stored, taps = load_features(grown.cache, loaded.transformers_model(), grown.conversations)
    sources = [data_record(grown.recipe, grown.conversations, stored)]
    parts, splits = [stored], [(len(grown.conversations), config.seed)]
    for other in config.also_data():
        other_conversations = other.conversations()
        other_stored, other_taps = cached_features(other, len(other_conversations)) or (None, None)
        if other_stored is None:
            raise ValueError(no_features(other))
        if list(other_taps) != list(taps):
            raise ValueError(f"--also {other.root} holds features of the taps {list(other_taps)}, this run's data {list(taps)}; recompute them with `verispec train --data-only`")
        parts.append(other_stored)
        other_recipe = other.recipe()
        splits.append((len(other_conversations), other_recipe["seed"]))
        sources.append({"directory": str(other.root), **data_record(other_recipe, other_conversations, other_stored)})
    return Features(concatenate_features(parts) if len(parts) > 1 else stored, taps, sources, splits)


def fit(config: TrainConfig, loaded: LoadedModel, data: Features, deadline: float, reporter: Reporter) -> Fitted:
    """Stage 3: the head fitted until `deadline` (or `steps`), from fresh weights or `init`'s;
    refuses a vocabulary the data cannot fill and a run left no time to fit a step."""
    from verispec.heads import load_weights, read_weights
    from verispec.machine import native_bf16
    from verispec.train.loop import (
        TrainingData, TrainSettings, build_head, choose_vocab, evaluate, expected_tokens, vocab_coverage,
    )
    from verispec.train.loop import fit as fit_head
    from verispec.train.prompts import end_of_turn_ids, user_turn_prefix

    settings = TrainSettings(
        kind=config.head, seed=config.seed, taps=config.taps, vocab_size=VOCAB if config.vocab is None else config.vocab, unroll=config.unroll, depth=config.depth,
        lr=config.lr, batch_tokens=config.batch_tokens, score=config.score,
        bf16=config.train_dtype == "bfloat16" or (config.train_dtype == "auto" and native_bf16()),
        steps=config.steps if config.decay > 0 else None, decay=config.decay,
        init=None if config.init is None else str(config.init.resolve()),
    )
    target = loaded.lm
    start = init_depth = None
    if config.init is None:
        wanted = VOCAB if config.vocab is None else config.vocab
        d2t = choose_vocab(data.stored["tokens"], wanted, end_of_turn_ids(loaded.tokenizer, loaded.eos_token_ids))
        if config.vocab is not None and d2t.numel() < config.vocab:
            raise ValueError(
                f"the data holds {d2t.numel()} distinct tokens, fewer than --vocab {config.vocab}; give --vocab {d2t.numel()} "
                "or less, or grow more data (--data-minutes, --data-conversations)"
            )
    else:
        start, init_depth = read_weights(config.init), init_config(config.init).depth
        d2t = start["d2t"]
    turn_start = len(user_turn_prefix(loaded.tokenizer)) if config.score == "turns" else 0
    training = TrainingData(data.stored, data.taps, settings.head_taps(target.num_layers), settings, turn_start, data.splits)
    head = build_head(config.head, settings, target, loaded.config, str(config.model), d2t)
    if start is not None:
        load_weights(head, start, config.init, depth=init_depth)
    rows = target.output_embeddings()[d2t].detach().float()  # [N, H]
    before = evaluate(head, training, rows, settings)  # untrained, or the init head
    fit_start = time.monotonic()
    reporter.start("fit", max(deadline - fit_start, 0.0))

    def report(progress: Progress, accuracy: list[float]) -> None:
        agreement = "/".join(f"{a:.2f}" for a in accuracy)
        reporter.update("fit", time.monotonic() - fit_start, f"step {progress.step}, {progress.tokens_seen} tokens, draft accuracy by step {agreement}")

    progress = fit_head(head, training, rows, settings, deadline, config.checkpoint, config.resume, max_steps=config.steps, report=report)
    if progress.step == 0:
        spent = (fit_start - (deadline - config.minutes * 60)) / 60
        raise NothingFitted(
            f"no time was left to fit a step: data and features took {spent:.1f} of --minutes {config.minutes:g}; nothing was "
            f"written to {config.out}. Give more --minutes or fewer --data-minutes (the data stays in {config.work_dir} for the next run)"
        )
    accuracy = evaluate(head, training, rows, settings)
    top_covered, mass_covered = vocab_coverage(training, rows, d2t)
    record = {
        "command": config.command,
        "data": {
            **data.sources[0],
            **({"also": data.sources[1:], "total_sequences": len(training.lengths), "total_tokens": int(data.stored["tokens"].numel())}
               if len(data.sources) > 1 else {}),
            "heldout_sequences": len(training.heldout),
        },
        "settings": settings.as_dict(),
        **({"init": init_record(config.init)} if config.init else {}),
        "minutes": config.minutes,
        "fit_seconds": round(progress.seconds, 1),
        "steps": progress.step,
        "kept_step": progress.kept_step,
        "tokens_seen": progress.tokens_seen,
        "heldout_top1_by_step": [round(a, 4) for a in accuracy],
        "heldout_evaluations": progress.evaluations,
        ("heldout_top1_by_step_init" if config.init else "heldout_top1_by_step_untrained"): [round(a, 4) for a in before],
        "heldout_expected_tokens_per_round": round(expected_tokens(accuracy), 3),
        "heldout_target_top1_in_vocab": round(top_covered, 4),
        "heldout_p_mass_in_vocab": round(mass_covered, 4),
    }
    return Fitted(head, progress, record)


def save(config: TrainConfig, fitted: Fitted) -> Path:
    """Stage 4: the head directory in `out`, its config recording how it was made."""
    from verispec.heads import save_head

    fitted.head.config.training.update(fitted.record)
    save_head(fitted.head, config.out)
    return config.out


def init_record(directory: Path) -> dict:
    """What a head started from `directory` records of it."""
    made = init_config(directory).training
    return {"directory": str(directory), **{key: made[key] for key in ("command", "steps", "tokens_seen", "fit_seconds", "init") if key in made}}


def data_record(recipe: dict, conversations: list, stored: dict) -> dict:
    """What the head's config records of one data directory: its recipe and size."""
    return {
        **recipe,
        "sequences": len(conversations),
        "tokens": int(stored["tokens"].numel()),
        "answer_tokens": sum(len(c.answer_ids) for c in conversations),
    }

