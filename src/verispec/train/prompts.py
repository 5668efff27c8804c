"""Instructions the target writes itself (Magpie, Xu et al. 2406.08464).

A chat model fed only the opening of a user turn of its own template (for SmolLM2:
`<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n`) continues with a plausible user
request and closes the turn. Sampling that continuation many times gives instructions drawn
from the model's own idea of what users ask, with no benchmark or external prompt involved.
They are then filtered: only turns the model closed itself, within length bounds, without
template markers, deduplicated after case and whitespace folding. With openers, the user turn
is started with a few written words ("Solve", "Translate", ...) and the model writes the rest:
the same sampling, steered to one kind of request per round.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

_SENTINEL = "\x00verispec-user-content\x00"

# Opening words of requests of many kinds, one per round (`--prompts openers`): left to
# itself, Magpie on a small model asks mostly for advice ("Can you help me ..."). A written
# list of common instruction types, none of them taken from a benchmark; 32 of them, so that
# every third round's sampled answers (`ResponseRecipe.sampled_one_in`) meet every opener.
OPENERS = (
    "Write", "Explain", "Solve", "How do I", "Translate", "What is", "Write a Python function", "Imagine you are",
    "Summarize", "Why", "Compare", "Give me", "Calculate", "Describe", "Rewrite", "If", "Create", "Extract",
    "Suggest", "Fix", "Tell me", "Classify", "Plan", "Who", "Analyze", "Draft", "List", "Prove", "Brainstorm",
    "Define", "Convert", "Given",
)


@dataclass(frozen=True)
class InstructionRecipe:
    """How instructions are sampled and filtered; recorded beside the data and the head."""

    temperature: float = 1.0
    top_p: float = 0.95
    max_tokens: int = 96  # sampled tokens (after the opener, if any); a turn not closed within them is dropped
    min_chars: int = 12
    max_chars: int = 400
    batch: int = 64
    closed_only: bool = True  # drop turns the model did not close within max_tokens
    openers: tuple[str, ...] = ()  # round r's user turns start with openers[r % len]; () starts them empty

    def opener(self, r: int) -> str:
        """The words round `r`'s user turns start with ("" for plain Magpie)."""
        return self.openers[r % len(self.openers)] if self.openers else ""

    def as_dict(self) -> dict:
        fields = asdict(self)
        if not self.openers:  # plain Magpie's record, as data directories made before openers hold it
            del fields["openers"]
            return {"method": "magpie: sample the user turn from the chat template's empty user prefix", **fields}
        method = "magpie with openers: sample the rest of a user turn that starts with round r's opener"
        return {"method": method, **fields, "openers": list(self.openers)}


def user_turn_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids of the chat template up to where a user's words would start.

    >>> tokenizer.decode(user_turn_prefix(tokenizer))   # SmolLM2-Instruct
    '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\\n<|im_start|>user\\n'
    """
    if tokenizer.chat_template is None:
        raise ValueError("the model has no chat template, so it cannot write its own instructions (Magpie)")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False)
    prefix, found, _ = text.partition(_SENTINEL)
    if not found:
        raise ValueError("the chat template does not place the user's content verbatim; cannot find the user turn")
    return list(tokenizer(prefix, add_special_tokens=False).input_ids)


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase, eos_token_ids: tuple[int, ...]) -> tuple[int, ...]:
    """Ids that close a turn: the template's text right after the user's content, and EOS
    (EOS alone for a model without a chat template)."""
    if tokenizer.chat_template is None:
        return tuple(dict.fromkeys(eos_token_ids))
    text = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False)
    after = text.partition(_SENTINEL)[2]
    ids = tokenizer(after, add_special_tokens=False).input_ids if after else []
    return tuple(dict.fromkeys([*ids[:1], *eos_token_ids]))


def fold(text: str) -> str:
    """The key two instructions are duplicates under: lower case, runs of spaces folded."""
    return re.sub(r"\s+", " ", text).strip().lower()


def keep_instruction(text: str, recipe: InstructionRecipe) -> bool:
    stripped = text.strip()
    return recipe.min_chars <= len(stripped) <= recipe.max_chars and "<|" not in stripped


@torch.inference_mode()
def sample_instructions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    eos_token_ids: tuple[int, ...],
    seed: int,
    recipe: InstructionRecipe = InstructionRecipe(),
    opener: str = "",
) -> list[str]:
    """One batch of `recipe.batch` user turns sampled from the user turn started with `opener`
    (empty: Magpie's empty user turn; torch seed `seed`), each the opener and its sampled rest,
    keeping those the model closed itself that pass `keep_instruction`; duplicates within the
    batch are dropped (the caller dedupes across batches with `fold`)."""
    start = list(tokenizer(opener, add_special_tokens=False).input_ids) if opener else []
    prefix = torch.tensor([user_turn_prefix(tokenizer) + start])  # [1, P]
    stops = list(end_of_turn_ids(tokenizer, eos_token_ids))
    torch.manual_seed(seed)
    out = model.generate(
        input_ids=prefix.expand(recipe.batch, -1),
        attention_mask=torch.ones(recipe.batch, prefix.shape[1], dtype=torch.long),
        do_sample=True,
        temperature=recipe.temperature,
        top_p=recipe.top_p,
        top_k=0,
        max_new_tokens=recipe.max_tokens,
        eos_token_id=stops,
        pad_token_id=stops[0],
    )[:, prefix.shape[1]:].tolist()  # [batch, <= max_tokens]
    kept: dict[str, str] = {}
    for row in out:
        closed = next((i for i, t in enumerate(row) if t in stops), None)
        if closed is None and recipe.closed_only:
            continue
        text = tokenizer.decode(start + row[:closed], skip_special_tokens=False).strip()
        if keep_instruction(text, recipe):
            kept.setdefault(fold(text), text)
    return list(kept.values())
