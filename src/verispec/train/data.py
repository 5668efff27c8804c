"""Training data for a head: the target's own conversations, grown in rounds, and the
target's features over them, cached on disk.

A round takes a batch of instructions from one source, keeps the new ones, and has the target
answer them in batched `generate` calls: greedily, or by sampling at temperature 1 in every
`sampled_one_in`-th round (one mode per round keeps the batch whole). The sources: Magpie
instructions sampled from the empty user turn (`prompts`), or passages of local package texts
under a task (`documents`), whose long prompts are answered in groups of similar length within
`answer_batch_tokens`; or raw texts (`texts`), local Python source and documentation as they
are, one sequence each with no prompt and nothing generated. Rounds are appended to
`sequences.jsonl` as they finish, so an interrupted run keeps what it made and a later run
continues with the next round. Round r draws its randomness from the torch seed
`seed * 1_000_003 + r`, so the data is a function of the seed and the number of rounds.
Grown to a count of conversations (`grow(..., conversations=N)`), the round that reaches N is
cut there and `partial-round.json` names it; a later growth replays that round whole and
appends what the cut left out, so a directory grown to N in any number of runs holds the first
N conversations of one uncut growth: the data is a function of the seed and N.

Features (`features.safetensors`) are computed once over every sequence, in the target's dtype,
and stored per token as bfloat16, for the taps `feature_taps(L)`: FINAL (the final norm's
output, what the target's output layer reads, as EAGLE-1 and Medusa read it) and EAGLE-3's
low, middle and high decoder-layer outputs (Li et al. 2503.01840; `eagle3_layers`). A head
reads the columns of the taps its config names. The file holds:
- `features` [N, len(taps), H] bfloat16; its metadata lists the taps;
- `tokens` [N] int32, `starts` [S + 1] int64 (sequence s is tokens[starts[s]:starts[s + 1]]),
  `answer_starts` [S] int64 (offset of the target's answer within each sequence);
- `argmax` [N] int32: the target's most likely next token at each position (over the full
  vocabulary), and `logsumexp` [N] float32 of its logits, so a head's pruned vocabulary can
  report the share of p it covers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from verispec.heads.config import eagle3_layers
from verispec.models.base import FINAL, Tap
from verispec.train.documents import Documents
from verispec.train.loop import padded_groups
from verispec.train.prompts import InstructionRecipe, end_of_turn_ids, fold, sample_instructions
from verispec.train.texts import Texts


@dataclass(frozen=True)
class ResponseRecipe:
    """How the target answers the instructions."""

    max_new_tokens: int = 192
    sampled_one_in: int = 3  # every third round is answered by sampling at temperature 1
    batch: int = 64

    def as_dict(self) -> dict:
        return {
            "answers": "the target's own, greedy and sampled at temperature 1 (top-k/top-p off)",
            **asdict(self),
        }


@dataclass(frozen=True)
class Conversation:
    """One training sequence: the chat-formatted instruction and the target's answer; for a
    raw text, the text as `instruction`, no prompt, and its tokens as the scored `answer_ids`."""

    round: int
    instruction: str
    sampled: bool
    prompt_ids: list[int]
    answer_ids: list[int]  # ends with the end-of-turn token unless cut at max_new_tokens (or a raw text)


def feature_taps(num_layers: int) -> tuple[Tap, ...]:
    """The taps cached for a target of `num_layers` decoder layers: FINAL, then EAGLE-3's."""
    return (FINAL, *eagle3_layers(num_layers))


class DataCache:
    """A directory of self-distillation data; see the module docstring for its files."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.sequences_path = self.root / "sequences.jsonl"
        self.features_path = self.root / "features.safetensors"
        self.recipe_path = self.root / "recipe.json"
        self.partial_path = self.root / "partial-round.json"  # the round a count cut short, if any

    def conversations(self) -> list[Conversation]:
        if not self.sequences_path.is_file():
            return []
        with self.sequences_path.open() as f:
            return [Conversation(**json.loads(line)) for line in f if line.strip()]

    def recipe(self) -> dict:
        """The recipe the data was made with (`recipe.json`: model, seed and settings)."""
        return json.loads(self.recipe_path.read_text())

    def check_recipe(self, recipe: dict) -> None:
        """Refuse to grow data made with another recipe (model, seed or settings)."""
        if self.recipe_path.is_file():
            stored = self.recipe()
            if stored != recipe:
                changed = sorted(k for k in set(stored) | set(recipe) if stored.get(k) != recipe.get(k))
                raise ValueError(
                    f"{self.root} holds data made with a different recipe ({', '.join(changed)} differ); "
                    "give another data directory or the same settings"
                )
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            self.recipe_path.write_text(json.dumps(recipe, indent=2) + "\n")

    def partial_round(self) -> int | None:
        """The round cut short by a count of conversations (the last one stored), or None."""
        return json.loads(self.partial_path.read_text())["round"] if self.partial_path.is_file() else None

    def mark_partial(self, r: int | None, kept: int = 0) -> None:
        """Record that round `r` was cut after `kept` of its conversations (None: no round was)."""
        if r is None:
            self.partial_path.unlink(missing_ok=True)
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            self.partial_path.write_text(json.dumps({"round": r, "kept": kept}) + "\n")

    def append(self, conversations: list[Conversation]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with self.sequences_path.open("a") as f:
            for c in conversations:
                f.write(json.dumps(asdict(c)) + "\n")
        self.features_path.unlink(missing_ok=True)  # stale once sequences change


def data_recipe(model: str, seed: int, instructions: InstructionRecipe | Documents | Texts, responses: ResponseRecipe) -> dict:
    """What the data is a function of (besides the number of rounds); stored in the cache.
    Raw texts have no answers, so no response recipe."""
    answers = None if isinstance(instructions, Texts) else responses.as_dict()
    return {"model": model, "seed": seed, "instructions": instructions.as_dict(), "responses": answers}


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
    instructions: InstructionRecipe | Documents | Texts = InstructionRecipe(),
    responses: ResponseRecipe = ResponseRecipe(),
    max_sequences: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    conversations: int | None = None,
) -> list[Conversation]:
    """Append rounds to `cache` until `time.monotonic()` passes `deadline`, at least
    `max_sequences` exist, exactly `conversations` exist, or a `Documents` or `Texts` source has
    nothing left; returns every conversation in the cache. A round started is finished (the
    data stays a function of the seed and the number of rounds), except the one that reaches
    `conversations`, which is cut there and recorded (`DataCache.mark_partial`): the next growth
    replays it whole and appends the rest, so the data is a function of the seed and the count.
    A cache already holding more than `conversations` is refused. A `Texts` round is its
    passages as they are (no prompt, nothing generated). `progress(sequences, answer_tokens)`
    is called after each round."""
    have = cache.conversations()
    if conversations is not None and len(have) > conversations:
        raise ValueError(
            f"{cache.root} already holds {len(have)} conversations, more than the {conversations} asked for; "
            "give its count or another data directory"
        )
    partial = cache.partial_round()
    if partial is None:
        next_round, skip = max((c.round for c in have), default=-1) + 1, 0
        seen = {fold(c.instruction) for c in have}
    else:  # replay the cut round from its start; its stored conversations are its first `skip`
        next_round, skip = partial, sum(c.round == partial for c in have)
        seen = {fold(c.instruction) for c in have if c.round < partial}
    stops = list(end_of_turn_ids(tokenizer, eos_token_ids))
    while (
        (conversations is not None or time.monotonic() < deadline)
        and (max_sequences is None or len(have) < max_sequences)
        and (conversations is None or len(have) < conversations)
    ):
        r = next_round
        next_round += 1
        if isinstance(instructions, (Documents, Texts)) and r >= instructions.rounds:
            break
        if isinstance(instructions, Texts):
            texts = instructions.texts(seed, r)
        elif isinstance(instructions, Documents):
            torch.manual_seed(seed * 1_000_003 + r)  # the sampled answers' randomness
            texts = instructions.instructions(seed, r)
        else:
            texts = sample_instructions(model, tokenizer, eos_token_ids, seed * 1_000_003 + r, instructions, instructions.opener(r))
        fresh = []
        for text in texts:
            if fold(text) not in seen:
                seen.add(fold(text))
                fresh.append(text)
        if isinstance(instructions, Texts):
            made = [Conversation(r, text, False, [], list(tokenizer(text).input_ids)) for text in fresh]
        else:
            made = _answered(model, tokenizer, r, fresh, stops, instructions, responses)
        made, skip = made[skip:], 0
        if conversations is not None and len(have) + len(made) > conversations:
            made = made[:conversations - len(have)]
            cache.mark_partial(r, sum(c.round == r for c in have) + len(made))  # before the append: a crash between replays the round
            cache.append(made)
        else:
            cache.append(made)
            cache.mark_partial(None)
        have.extend(made)
        if progress is not None:
            progress(len(have), sum(len(c.answer_ids) for c in have))
    return have


def _answered(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, r: int, instructions: list[str], stops: list[int],
    source: InstructionRecipe | Documents, responses: ResponseRecipe,
) -> list[Conversation]:
    """Round `r`'s instructions, chat-formatted, with the target's answers."""
    sampled = r % responses.sampled_one_in == responses.sampled_one_in - 1
    prompts = [chat_prompt(tokenizer, t) for t in instructions]
    replies: list[list[int]] = [[] for _ in instructions]
    batch_tokens = source.recipe.answer_batch_tokens if isinstance(source, Documents) else None
    for group in answer_groups(prompts, responses, batch_tokens):
        for i, reply in zip(group, answer(model, [prompts[i] for i in group], stops, sampled, responses.max_new_tokens)):
            replies[i] = reply
    return [Conversation(r, text, sampled, prompt, reply) for text, prompt, reply in zip(instructions, prompts, replies)]


def answer_groups(prompts: list[list[int]], responses: ResponseRecipe, batch_tokens: int | None) -> list[list[int]]:
    """Indices of `prompts` answered together: consecutive runs of `responses.batch`, or, with
    `batch_tokens`, runs of similar length (shortest first) whose left-padded rows, prompt and
    answer, stay within `batch_tokens` and `responses.batch` rows."""
    if batch_tokens is None:
        return [list(range(i, min(i + responses.batch, len(prompts)))) for i in range(0, len(prompts), responses.batch)]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    lengths = [len(p) + responses.max_new_tokens for p in prompts]
    return [
        group[start:start + responses.batch]
        for group in padded_groups(order, lengths, batch_tokens)
        for start in range(0, len(group), responses.batch)
    ]


@torch.inference_mode()
def compute_features(
    model: PreTrainedModel, conversations: list[Conversation], batch_tokens: int = 2048
) -> tuple[dict[str, torch.Tensor], tuple[Tap, ...]]:
    """Run the target once over every conversation; the tensors of `features.safetensors`
    and the taps of its feature columns. Sequences are grouped by length into batches of
    about `batch_tokens` tokens, right-padded, so padding never precedes a real token."""
    taps = feature_taps(model.config.num_hidden_layers)
    seqs = [c.prompt_ids + c.answer_ids for c in conversations]
    starts = torch.zeros(len(seqs) + 1, dtype=torch.long)
    starts[1:] = torch.cumsum(torch.tensor([len(s) for s in seqs]), 0)
    total = int(starts[-1])
    out = {
        "features": torch.empty(total, len(taps), model.config.hidden_size, dtype=torch.bfloat16),  # [N, F, H]
        "argmax": torch.empty(total, dtype=torch.int32),  # [N]
        "logsumexp": torch.empty(total, dtype=torch.float32),  # [N]
    }
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for group in padded_groups(order, [len(s) for s in seqs], batch_tokens):
        _features_of(model, [seqs[j] for j in group], taps, out, [int(starts[j]) for j in group])
    out["tokens"] = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    out["starts"] = starts
    out["answer_starts"] = torch.tensor([len(c.prompt_ids) for c in conversations], dtype=torch.long)
    return out, taps


def _features_of(model, seqs: list[list[int]], taps: tuple[Tap, ...], out: dict[str, torch.Tensor], offsets: list[int]) -> None:
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)  # [B, width]
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        ids[row, :len(s)] = torch.tensor(s)
        mask[row, :len(s)] = 1
    states = model.get_decoder()(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    # hidden_states[n] is decoder layer n's output (0 is the embedding), the taps' numbering.
    chosen = [states.last_hidden_state if tap == FINAL else states.hidden_states[tap] for tap in taps]
    stacked = torch.stack(chosen, dim=2)  # [B, width, F, H]
    logits = model.get_output_embeddings()(states.last_hidden_state).float()  # [B, width, V]
    for row, (s, offset) in enumerate(zip(seqs, offsets)):
        n = len(s)
        out["features"][offset:offset + n] = stacked[row, :n].to(torch.bfloat16)
        out["argmax"][offset:offset + n] = logits[row, :n].argmax(-1).to(torch.int32)
        out["logsumexp"][offset:offset + n] = logits[row, :n].logsumexp(-1)


def cached_features(cache: DataCache, sequences: int) -> tuple[dict[str, torch.Tensor], tuple[Tap, ...]] | None:
    """The features stored in `cache` and their taps, or None when missing or not over
    `sequences` sequences (stale)."""
    if not cache.features_path.is_file():
        return None
    with safe_open(cache.features_path, "pt") as f:
        taps = tuple(json.loads(f.metadata()["taps"]))
    stored = load_file(cache.features_path)
    return (stored, taps) if int(stored["starts"].numel()) == sequences + 1 else None


def load_features(
    cache: DataCache, model: PreTrainedModel, conversations: list[Conversation]
) -> tuple[dict[str, torch.Tensor], tuple[Tap, ...]]:
    """The cached features and their taps, computed and saved first if missing or stale."""
    cached = cached_features(cache, len(conversations))
    if cached is not None:
        return cached
    computed, taps = compute_features(model, conversations)
    save_file(computed, str(cache.features_path), metadata={"taps": json.dumps(list(taps))})
    return computed, taps


def concatenate_features(parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One set of feature tensors holding every part's sequences, part after part: the
    per-token tensors concatenated, each part's `starts` offset by the tokens before it."""
    out = {name: torch.cat([p[name] for p in parts]) for name in ("features", "tokens", "argmax", "logsumexp", "answer_starts")}
    offsets = torch.tensor([0, *[int(p["starts"][-1]) for p in parts]]).cumsum(0)  # [len(parts) + 1]
    out["starts"] = torch.cat([offsets[:1], *[p["starts"][1:] + offset for p, offset in zip(parts, offsets)]])  # [S + 1]
    return out
