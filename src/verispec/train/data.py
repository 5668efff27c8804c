"""Training data for a head: the target's own conversations, grown in rounds, and the
target's features over them, cached on disk.

A round samples a batch of instructions from the empty user turn (`prompts`), keeps the new
ones, and has the target answer each, greedily or by sampling at temperature 1 (every
`sampled_one_in`-th instruction), in batched `generate` calls. Rounds are appended to
`sequences.jsonl` as they finish, so an interrupted run keeps what it made and a later run
continues with the next round. Round r draws its randomness from the torch seed
`seed * 1_000_003 + r`, so the data is a function of the seed and the number of rounds.

Features (`features.safetensors`) are computed once over every sequence, in the target's dtype,
and stored as bfloat16:
- `features` [N, F, H]: per token, the hidden states the head reads, in `FEATURE_NAMES`
  order: the final normalised hidden state (what the target's output layer reads; its
  logits are `lm_head(features[:, 0])`) and the outputs of a low, a middle and a high layer
  (EAGLE-3's fused features, Li et al. 2503.01840);
- `tokens` [N] int32, `starts` [S + 1] int64 (sequence s is tokens[starts[s]:starts[s + 1]]),
  `answer_starts` [S] int64 (where the target's response begins in each sequence).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from verispec.train.prompts import InstructionRecipe, end_of_turn_ids, fold, sample_instructions

FEATURE_NAMES = ("last", "low", "mid", "high")


@dataclass(frozen=True)
class ResponseRecipe:
    """How the target answers the instructions."""

    max_new_tokens: int = 192
    sampled_one_in: int = 3  # every third instruction is answered by sampling at temperature 1
    batch: int = 64

    def as_dict(self) -> dict:
        return {
            "answers": "the target's own, greedy and sampled at temperature 1 (top-k/top-p off)",
            **asdict(self),
        }


@dataclass(frozen=True)
class Conversation:
    """One training sequence: the chat-formatted instruction and the target's answer."""

    round: int
    instruction: str
    sampled: bool
    prompt_ids: list[int]
    answer_ids: list[int]  # ends with the end-of-turn token unless cut at max_new_tokens


def feature_layers(num_hidden_layers: int) -> dict[str, int]:
    """Decoder layers (1-based outputs, as in `hidden_states`) read as low/mid/high features,
    EAGLE-3's choice: the third layer, the middle one and the fourth from the top."""
    n = num_hidden_layers
    return {"low": min(3, n), "mid": max(1, n // 2), "high": max(1, n - 3)}


class DataCache:
    """A directory of self-distillation data; see the module docstring for its files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.sequences_path = self.root / "sequences.jsonl"
        self.features_path = self.root / "features.safetensors"
        self.recipe_path = self.root / "recipe.json"

    def conversations(self) -> list[Conversation]:
        if not self.sequences_path.is_file():
            return []
        with self.sequences_path.open() as f:
            return [Conversation(**json.loads(line)) for line in f if line.strip()]

    def check_recipe(self, recipe: dict) -> None:
        """Refuse to grow data made with another recipe (model, seed or settings)."""
        if self.recipe_path.is_file():
            stored = json.loads(self.recipe_path.read_text())
            if stored != recipe:
                changed = sorted(k for k in set(stored) | set(recipe) if stored.get(k) != recipe.get(k))
                raise ValueError(
                    f"{self.root} holds data made with a different recipe ({', '.join(changed)} differ); "
                    "give another data directory or the same settings"
                )
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            self.recipe_path.write_text(json.dumps(recipe, indent=2) + "\n")

    def append(self, conversations: list[Conversation]) -> None:
        with self.sequences_path.open("a") as f:
            for c in conversations:
                f.write(json.dumps(asdict(c)) + "\n")
        self.features_path.unlink(missing_ok=True)  # stale once sequences change


def data_recipe(model: str, seed: int, instructions: InstructionRecipe, responses: ResponseRecipe) -> dict:
    """What the data is a function of (besides the number of rounds); stored in the cache."""
    return {"model": model, "seed": seed, "instructions": instructions.as_dict(), "responses": responses.as_dict()}


def chat_prompt(tokenizer: PreTrainedTokenizerBase, instruction: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": instruction}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False).input_ids)


@torch.inference_mode()
def answer(
    model: PreTrainedModel,
    prompts: list[list[int]],
    stops: list[int],
    sampled: bool,
    max_new_tokens: int,
) -> list[list[int]]:
    """The target's answers to chat-formatted `prompts`, in one left-padded `generate` call;
    each answer ends at its first stop token (kept) or at `max_new_tokens`."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), stops[0], dtype=torch.long)  # [B, width]
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    options = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sampled else {"do_sample": False}
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
        eos_token_id=stops, pad_token_id=stops[0], **options,
    )[:, width:].tolist()  # [B, <= max_new_tokens]
    answers = []
    for row in out:
        end = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        answers.append(row[:end])
    return answers


def grow(
    cache: DataCache,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    eos_token_ids: tuple[int, ...],
    seed: int,
    deadline: float,
    instructions: InstructionRecipe = InstructionRecipe(),
    responses: ResponseRecipe = ResponseRecipe(),
    max_sequences: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Conversation]:
    """Append rounds to `cache` until `time.monotonic()` passes `deadline` (a round started
    is finished) or `max_sequences` exist; returns every conversation in the cache.
    `progress(sequences, answer_tokens)` is called after each round."""
    have = cache.conversations()
    seen = {fold(c.instruction) for c in have}
    next_round = max((c.round for c in have), default=-1) + 1
    stops = list(end_of_turn_ids(tokenizer, eos_token_ids))
    while time.monotonic() < deadline and (max_sequences is None or len(have) < max_sequences):
        r = next_round
        next_round += 1
        wanted = instructions.batch if max_sequences is None else min(instructions.batch, max_sequences - len(have))
        fresh = []
        for text in sample_instructions(model, tokenizer, eos_token_ids, seed * 1_000_003 + r, instructions)[:wanted]:
            if fold(text) not in seen:
                seen.add(fold(text))
                fresh.append(text)
        index = len(have)
        made = []
        for sampled in (False, True):
            chosen = [t for i, t in enumerate(fresh) if ((index + i) % responses.sampled_one_in == responses.sampled_one_in - 1) == sampled]
            for start in range(0, len(chosen), responses.batch):
                group = chosen[start:start + responses.batch]
                prompts = [chat_prompt(tokenizer, t) for t in group]
                for text, prompt, reply in zip(group, prompts, answer(model, prompts, stops, sampled, responses.max_new_tokens)):
                    made.append(Conversation(r, text, sampled, prompt, reply))
        cache.append(made)
        have.extend(made)
        if progress is not None:
            progress(len(have), sum(len(c.answer_ids) for c in have))
    return have


@torch.inference_mode()
def compute_features(
    model: PreTrainedModel, conversations: list[Conversation], batch_tokens: int = 4096
) -> dict[str, torch.Tensor]:
    """Run the target once over every conversation and collect `FEATURE_NAMES` features per
    token (see the module docstring); sequences are grouped by length into batches of about
    `batch_tokens` tokens and right-padded, so padding never precedes a real token."""
    layers = feature_layers(model.config.num_hidden_layers)
    seqs = [c.prompt_ids + c.answer_ids for c in conversations]
    starts = torch.zeros(len(seqs) + 1, dtype=torch.long)
    starts[1:] = torch.cumsum(torch.tensor([len(s) for s in seqs]), 0)
    hidden = model.config.hidden_size
    features = torch.empty(int(starts[-1]), len(FEATURE_NAMES), hidden, dtype=torch.bfloat16)  # [N, F, H]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    group: list[int] = []
    for position, i in enumerate(order):
        group.append(i)
        last = position == len(order) - 1
        if last or (len(group) + 1) * len(seqs[order[position + 1]]) > batch_tokens:
            _features_of(model, [seqs[j] for j in group], layers, features, [int(starts[j]) for j in group])
            group = []
    return {
        "features": features,
        "tokens": torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
        "starts": starts,
        "answer_starts": torch.tensor([len(c.prompt_ids) for c in conversations], dtype=torch.long),
    }


def _features_of(model, seqs: list[list[int]], layers: dict[str, int], out: torch.Tensor, offsets: list[int]) -> None:
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)  # [B, width]
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, :len(s)] = torch.tensor(s)
        mask[row, :len(s)] = 1
    body = model.get_decoder()
    states = body(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    chosen = [states.last_hidden_state] + [states.hidden_states[layers[name]] for name in FEATURE_NAMES[1:]]
    stacked = torch.stack(chosen, dim=2).to(torch.bfloat16)  # [B, width, F, H]
    for row, (s, offset) in enumerate(zip(seqs, offsets)):
        out[offset:offset + len(s)] = stacked[row, :len(s)]


def load_features(cache: DataCache, model: PreTrainedModel, conversations: list[Conversation]) -> dict[str, torch.Tensor]:
    """The cached features, computed and saved first if missing or stale."""
    if cache.features_path.is_file():
        stored = load_file(cache.features_path)
        if int(stored["starts"].numel()) == len(conversations) + 1:
            return stored
    computed = compute_features(model, conversations)
    save_file(computed, str(cache.features_path))
    return computed
