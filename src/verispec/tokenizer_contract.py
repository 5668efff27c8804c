"""The tokenizer contract between a target and a draft model.

Verification compares token ids, so a draft is only useful when every id means the same
token to both models, the same special tokens sit at the same ids, and text is cut into ids
the same way (the draft learned its distribution over the target's tokenisation). An equal
vocabulary size proves none of that: two tokenizers of the same size can swap
'<|im_end|>' and '<|endoftext|>'.

`check_tokenizers(target, draft)` compares, in this order:
- the full id -> token string map;
- the named special tokens with their ids, and the set of ids marked special;
- the fast tokenizer's pipeline from its backend JSON: normalizer, pre-tokenizer,
  post-processor, decoder, added-token settings, and the model (type, options, BPE merges);
- the chat template, by hash.
Each difference is one sentence naming the first place it occurs. A different chat template
changes how prompts are written, not what ids mean, so it is a note; everything else is a
mismatch, and a draft model refuses a mismatched pair.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

SPECIAL_TOKENS = ("bos", "eos", "unk", "pad", "sep", "cls", "mask")
PIPELINE = {
    "normalizer": "normalizers",
    "pre_tokenizer": "pre-tokenizers",
    "post_processor": "post-processors",
    "decoder": "decoders",
    "added_tokens": "added-token settings",
}
_ABSENT = object()


@dataclass(frozen=True)
class TokenizerReport:
    """What differs between two tokenizers, in words.

    mismatches: differences that change what an id means or how text becomes ids.
    notes: differences that do not (the chat template), and parts that could not be compared.
    """

    names: tuple[str, str]
    size: tuple[int, int]
    mismatches: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """No mismatch: the pair may serve as target and draft."""
        return not self.mismatches

    @property
    def identical(self) -> bool:
        return not self.mismatches and not self.notes

    def require_match(self) -> None:
        """Raise ValueError carrying the report unless the pair matches."""
        if not self.ok:
            raise ValueError(f"{self}\nuse a draft model that shares the target's tokenizer")

    def __str__(self) -> str:
        a, b = self.names
        if self.identical:
            return f"{a} and {b} tokenizers are identical ({self.size[0]} tokens)"
        head = f"{a} and {b} tokenizers match" if self.ok else f"{a} and {b} tokenizers do not match"
        return "\n".join([f"{head}:", *(f"- {m}" for m in self.mismatches), *(f"- note: {n}" for n in self.notes)])


def check_tokenizers(a: Any, b: Any, names: tuple[str, str] = ("target", "draft")) -> TokenizerReport:
    """Compare two transformers tokenizers (see the module docstring for what is compared).

    >>> print(check_tokenizers(target_tokenizer, draft_tokenizer))   # doctest: +SKIP
    target and draft tokenizers do not match:
    - target and draft tokenizers differ at id 2 ('<|im_end|>' vs '<|endoftext|>') and at 1 more id
    - eos tokens differ: target '<|im_end|>' (id 2) vs draft '<|endoftext|>' (id 0)
    """
    vocab_a, vocab_b = _id_to_token(a), _id_to_token(b)
    mismatches = [
        *_vocabulary(vocab_a, vocab_b, names),
        *_special_tokens(a, b, names),
    ]
    notes = []
    pipeline_a, pipeline_b = _pipeline(a), _pipeline(b)
    if pipeline_a is None or pipeline_b is None:
        missing = [name for name, p in zip(names, (pipeline_a, pipeline_b)) if p is None]
        notes.append(
            f"the {' and '.join(missing)} tokenizer has no fast-tokenizer backend, so normalizer, "
            "pre-tokenizer, post-processor and decoder were not compared"
        )
    else:
        mismatches += _pipeline_differences(pipeline_a, pipeline_b, names)
    hashes = _template_hash(a), _template_hash(b)
    if hashes[0] != hashes[1]:
        shown = [f"{name} {h[:12] if h else 'none'}" for name, h in zip(names, hashes)]
        notes.append(f"chat templates differ (sha256 {shown[0]} vs {shown[1]})")
    return TokenizerReport(names, (len(vocab_a), len(vocab_b)), tuple(mismatches), tuple(notes))


def _id_to_token(tokenizer: Any) -> dict[int, str]:
    return {int(i): token for token, i in tokenizer.get_vocab().items()}


def _vocabulary(a: dict[int, str], b: dict[int, str], names: tuple[str, str]) -> list[str]:
    differing = [i for i in sorted(a.keys() | b.keys()) if a.get(i) != b.get(i)]
    if not differing:
        return []
    first = differing[0]
    shown = [repr(v[first]) if first in v else "no token" for v in (a, b)]
    more = len(differing) - 1
    tail = f" and at {more} more id{'s' if more > 1 else ''}" if more else ""
    sizes = f" ({len(a)} vs {len(b)} tokens)" if len(a) != len(b) else ""
    return [f"{names[0]} and {names[1]} tokenizers differ at id {first} ({shown[0]} vs {shown[1]}){tail}{sizes}"]


def _special_tokens(a: Any, b: Any, names: tuple[str, str]) -> list[str]:
    out = []
    for kind in SPECIAL_TOKENS:
        sides = [(getattr(t, f"{kind}_token", None), getattr(t, f"{kind}_token_id", None)) for t in (a, b)]
        if sides[0] != sides[1]:
            shown = [f"{name} {_special(token, i)}" for name, (token, i) in zip(names, sides)]
            out.append(f"{kind} tokens differ: {shown[0]} vs {shown[1]}")
    marked_a, marked_b = _special_ids(a), _special_ids(b)
    if marked_a != marked_b:
        only = [
            f"only {name} marks {_ids(ids)} special" for name, ids in zip(names, (marked_a - marked_b, marked_b - marked_a)) if ids
        ]
        out.append(f"special token ids differ: {'; '.join(only)}")
    return out


def _special_ids(tokenizer: Any) -> set[int]:
    """The named special tokens' ids and every added token flagged special."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return set(tokenizer.all_special_ids) | {int(i) for i, token in added.items() if token.special}


def _special(token: str | None, i: int | None) -> str:
    return "none" if token is None else f"{str(token)!r} (id {i})"


def _ids(ids: set[int]) -> str:
    shown = sorted(ids)
    return ", ".join(map(str, shown[:5])) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")


def _pipeline(tokenizer: Any) -> dict | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return None if backend is None else json.loads(backend.to_str())


def _pipeline_differences(a: dict, b: dict, names: tuple[str, str]) -> list[str]:
    out = []
    for key, label in PIPELINE.items():
        found = _first_difference(a.get(key), b.get(key), "")
        if found:
            out.append(_describe(label, found, names))
    # The vocabulary was compared id by id above; merges are compared as an ordered list.
    model_a, model_b = a.get("model") or {}, b.get("model") or {}
    options_a = {k: v for k, v in model_a.items() if k not in ("vocab", "merges")}
    options_b = {k: v for k, v in model_b.items() if k not in ("vocab", "merges")}
    found = _first_difference(options_a, options_b, "")
    if found:
        out.append(_describe("tokenization models", found, names))
    merges_a, merges_b = _merges(model_a), _merges(model_b)
    if merges_a != merges_b:
        i = next((j for j, (x, y) in enumerate(zip(merges_a, merges_b)) if x != y), min(len(merges_a), len(merges_b)))
        shown = [repr(m[i]) if i < len(m) else "none" for m in (merges_a, merges_b)]
        out.append(
            f"BPE merges differ at merge {i} ({shown[0]} vs {shown[1]}; "
            f"{len(merges_a)} vs {len(merges_b)} merges)"
        )
    return out


def _merges(model: dict) -> list[str]:
    # tokenizers writes a merge as "a b" in older files and as ["a", "b"] in newer ones.
    return [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]


def _first_difference(x: Any, y: Any, path: str) -> tuple[str, Any, Any] | None:
    """The path of the first place two JSON values differ, with the values there."""
    if x == y:
        return None
    # Two components of different types differ as wholes, not in their options.
    if isinstance(x, dict) and isinstance(y, dict) and x.get("type") == y.get("type"):
        for key in sorted(x.keys() | y.keys()):
            found = _first_difference(x.get(key, _ABSENT), y.get(key, _ABSENT), f"{path}.{key}")
            if found:
                return found
    if isinstance(x, list) and isinstance(y, list):
        for i in range(max(len(x), len(y))):
            u, v = (x[i] if i < len(x) else _ABSENT), (y[i] if i < len(y) else _ABSENT)
            found = _first_difference(u, v, f"{path}[{i}]")
            if found:
                return found
    return path, x, y


def _describe(label: str, found: tuple[str, Any, Any], names: tuple[str, str]) -> str:
    path, x, y = found
    where = f" at {path.lstrip('.')}" if path else ""
    return f"{label} differ{where}: {names[0]} {_json(x)} vs {names[1]} {_json(y)}"


def _json(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _template_hash(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()
