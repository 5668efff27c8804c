"""Sampling transforms: logits -> p (target) or q (proposal).

p and q are always built by the same function with the same `SamplingParams`, so the verifier
compares the distributions that were actually sampled from (the seed's transform contract).
Temperature 0 is greedy decoding and never builds a distribution: the greedy verifier reads
only the argmax of each row.

Three transforms read the context, not only the row: a grammar (`verispec.grammar`: the tokens
it does not allow after the row's output prefix get logit -inf), the repetition penalty (HF's and vLLM's:
a token already in the prompt or the output has its logit divided by the penalty when
positive, multiplied when negative) and min_tokens (vLLM's: the EOS ids are masked until that
many tokens have been emitted). `penalised` applies them to a round's rows, each row with its
own context (the emitted text and the drafts before that row), before the other transforms,
so the verified target is the penalised one; a proposer's q is what it drafted from (a draft
model penalises its own rows alike), which is all the rules need of q.

Probabilities are float64. Logits equal to -inf are legal masks and give exact zeros; NaN and
+inf are rejected, never clipped, and so is a temperature that scales a row to nothing.

Devices: the transforms run where the logits are; `rule_rows` then moves the rows a rule reads
to the host in one copy, the only place model output crosses over (`to_host`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from verispec.checks import is_int, is_number
from verispec.grammar import Grammar


@dataclass(frozen=True)
class SamplingParams:
    """How a distribution is derived from logits; shared by target (p) and proposal (q).

    temperature: 0 is greedy; > 0 divides the logits.
    top_k: keep the k most likely tokens (ties at the k-th value are all kept).
    top_p: keep the smallest most-likely set whose mass reaches top_p (nucleus).
    min_p: keep tokens whose probability is at least min_p times the largest.
    repetition_penalty: > 0; 1 is none. A token already in the context has its logit divided
        by it when positive and multiplied by it when negative (HF's and vLLM's rule).
    min_tokens: the EOS ids are masked until this many tokens have been emitted (vLLM's).
    grammar: constrained output (`verispec.grammar.Grammar`): a token it does not allow after
        the output so far is masked; None: none.
    The penalties and the grammar read the context (`penalised`); then the filters apply in
    the order temperature, top-k, top-p, min-p (HF's order).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    grammar: Grammar | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        t = self.temperature
        if not is_number(t, least=0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and not is_int(self.top_k, least=1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not is_number(self.top_p, 0, 1, open_least=True):
            raise ValueError(f"top_p must lie in (0, 1] or be None, got {self.top_p!r}")
        if self.min_p is not None and not is_number(self.min_p, 0, 1, open_most=True):
            raise ValueError(f"min_p must lie in [0, 1) or be None, got {self.min_p!r}")
        if not is_number(self.repetition_penalty, 0, open_least=True):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1: none), got {self.repetition_penalty!r}")
        if not is_int(self.min_tokens, least=0):
            raise ValueError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise ValueError(f"grammar must be a verispec.grammar.Grammar (with allowed()), got {self.grammar!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def reads_context(self) -> bool:
        """Whether a row's transform depends on its context (`penalised`)."""
        return self.repetition_penalty != 1 or self.min_tokens > 0 or self.grammar is not None


GREEDY = SamplingParams(temperature=0.0)


def check_logits(logits: torch.Tensor) -> None:
    """Reject what no distribution can come from: an empty vocabulary, NaN or +inf."""
    if logits.ndim != 2 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape [n, V] with V >= 1, got {tuple(logits.shape)}")
    if math.isfinite(float(logits.sum())):
        return  # every entry is finite: the common case, one pass instead of four
    if bool(torch.isnan(logits).any()):
        raise ValueError("logits contain NaN; the model produced invalid scores")
    if bool(torch.isposinf(logits).any()):
        raise ValueError("logits contain +inf; only -inf (a masked token) is allowed")
    if bool(torch.isneginf(logits).all(dim=-1).any()):
        raise ValueError("a row of logits is entirely -inf; no token can be sampled")


def penalised(
    logits: torch.Tensor,
    params: SamplingParams,
    context: Sequence[int],
    row_tokens: Sequence[Sequence[int]],
    emitted: int,
    eos_ids: Collection[int],
) -> torch.Tensor:
    """logits[n, V] of a round's rows after the transforms that read the context: row r follows
    `context` (prompt and emitted tokens) and then `row_tokens[r]` (the drafts before it), and
    `emitted` of the context's tokens were generated. Returns `logits` itself when `params`
    has no such transform.

    >>> penalised(torch.tensor([[2.0, -1.0, 3.0]]), SamplingParams(repetition_penalty=2.0), [0, 1], [()], 0, ()).tolist()
    [[1.0, -2.0, 3.0]]
    """
    if not params.reads_context:
        return logits
    n, vocab = logits.shape
    out = logits
    if params.repetition_penalty != 1:
        seen = torch.zeros(n, vocab, dtype=torch.bool, device=logits.device)  # [n, V]
        seen[:, torch.tensor(sorted(set(context)), dtype=torch.long, device=logits.device)] = True
        for r, tokens in enumerate(row_tokens):
            if tokens:
                seen[r, torch.tensor(list(tokens), dtype=torch.long, device=logits.device)] = True
        theta = params.repetition_penalty
        out = torch.where(seen, torch.where(out > 0, out / theta, out * theta), out)
    masked = [r for r, tokens in enumerate(row_tokens) if emitted + len(tokens) < params.min_tokens]
    if masked and eos_ids:
        out = out.clone() if out is logits else out
        rows = torch.tensor(masked, dtype=torch.long, device=logits.device)
        eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=logits.device)
        out[rows.unsqueeze(1), eos.unsqueeze(0)] = -math.inf
    if params.grammar is not None:
        out = grammar_masked(out, params.grammar, list(context[len(context) - emitted :]), row_tokens)
    return out


def grammar_masked(logits: torch.Tensor, grammar: Grammar, output: list[int],
                   row_tokens: Sequence[Sequence[int]]) -> torch.Tensor:
    """logits[n, V] with the tokens `grammar` does not allow after `output` and each row's
    drafts set to -inf. A row whose drafts left the grammar (or ended at EOS) is left as it is:
    the token that left it has p = 0 there, so no rule reads the rows after it."""
    masks = [grammar.allowed([*output, *tokens]) for tokens in row_tokens]
    if any(mask is not None and not bool(mask.any()) for mask in masks):
        raise ValueError(f"the grammar allows no token after the {len(output)} tokens generated (with "
                         "min_tokens, not even EOS): it cannot be completed from here")
    full = torch.ones(logits.shape[-1], dtype=torch.bool)
    allowed = torch.stack([full if mask is None else mask for mask in masks]).to(logits.device)  # [n, V]
    return logits.masked_fill(~allowed, -math.inf)


def to_host(rows: torch.Tensor) -> torch.Tensor:
    """`rows` on the CPU: the one crossing from a model's device to the host (free when the
    model is on the CPU). The rules and the random draws read single entries, and each read
    of a device tensor would be a synchronisation; one copy of the rows costs one."""
    return rows.cpu()


def rule_rows(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """What a verification rule reads, on the host: the checked logits[n, V] when greedy
    (the argmax of a row with NaN or +inf would pass silently), else p = float64
    probabilities[n, V] after the request's transforms."""
    if params.greedy:
        check_logits(logits)
        return to_host(logits)
    return to_host(probabilities(logits, params))


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits[n, V] -> float64 probabilities[n, V] after temperature, top-k, top-p, min-p.

    >>> probabilities(torch.tensor([[0.0, 0.0, -math.inf]]), SamplingParams()).tolist()
    [[0.5, 0.5, 0.0]]
    """
    if params.greedy:
        raise ValueError("temperature 0 is greedy decoding and has no sampling distribution")
    check_logits(logits)
    scaled = logits.double()
    if params.temperature != 1:
        scaled = scaled / params.temperature
        if bool(torch.isposinf(scaled).any()):
            raise ValueError(f"temperature {params.temperature} overflows the logits; use a larger one")
        if bool(torch.isneginf(scaled).all(dim=-1).any()):
            # Every logit of the row is negative and / temperature rounds to -inf: softmax
            # would give NaN everywhere.
            raise ValueError(
                f"temperature {params.temperature} underflows a whole row of logits to -inf, so no "
                "token has a probability; use a larger temperature, or 0 for greedy decoding"
            )
    if params.top_k is not None and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p is not None and params.top_p < 1:
        probs = _nucleus(probs, params.top_p)
    if params.min_p is not None and params.min_p > 0:
        floor = params.min_p * probs.max(dim=-1, keepdim=True).values
        probs = _renormalise(probs.masked_fill(probs < floor, 0.0))
    return probs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of the descending order whose mass reaches top_p."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return _renormalise(probs.masked_fill(drop, 0.0))


def _renormalise(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum(dim=-1, keepdim=True)
