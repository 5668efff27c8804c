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

Devices: the transforms run where the logits are, and so does greedy's argmax and its check
(`rule_input`: nothing is read there); what a rule reads then crosses to the host in one copy
(`transfers.to_host_all`: a step's every request in one), and `rule_rows_of` finishes it there: greedy
brings back each row's argmax and whether the row's maximum is finite, never the rows.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from verispec.checks import is_int, is_number
from verispec.grammar import Grammar
from verispec.transfers import to_device, to_host_all


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


def check_shape(logits: torch.Tensor) -> None:
    if logits.ndim != 2 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape [n, V] with V >= 1, got {tuple(logits.shape)}")


def check_logits(logits: torch.Tensor) -> None:
    """Reject what no distribution can come from: an empty vocabulary, NaN or +inf."""
    check_shape(logits)
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
    seen = torch.zeros(n, vocab, dtype=torch.bool)  # [n, V] on the host: the tokens each row's context holds
    if params.repetition_penalty != 1:
        seen[:, sorted(set(context))] = True
        for r, tokens in enumerate(row_tokens):
            seen[r, list(tokens)] = True
    banned = torch.zeros(n, vocab, dtype=torch.bool)  # [n, V]: the EOS ids before min_tokens, what the grammar forbids
    masked = [r for r, tokens in enumerate(row_tokens) if emitted + len(tokens) < params.min_tokens]
    if masked and eos_ids:
        banned[torch.tensor(masked)[:, None], torch.tensor(sorted(eos_ids))[None]] = True
    if params.grammar is not None:
        banned |= ~grammar_allowed(params.grammar, list(context[len(context) - emitted :]), row_tokens, vocab)
    seen, banned = to_device([seen, banned], logits.device)  # one copy the host does not wait for
    theta = params.repetition_penalty
    out = torch.where(seen, torch.where(logits > 0, logits / theta, logits * theta), logits)
    return out.masked_fill(banned, -math.inf)


def grammar_allowed(grammar: Grammar, output: list[int], row_tokens: Sequence[Sequence[int]], vocab: int) -> torch.Tensor:
    """bool[n, V] on the host: the tokens `grammar` allows after `output` and each row's drafts.
    A row whose drafts left the grammar (or ended at EOS) allows everything: the token that left
    it has p = 0 there, so no rule reads the rows after it."""
    masks = [grammar.allowed([*output, *tokens]) for tokens in row_tokens]
    if any(mask is not None and not bool(mask.any()) for mask in masks):
        raise ValueError(f"the grammar allows no token after the {len(output)} tokens generated (with "
                         "min_tokens, not even EOS): it cannot be completed from here")
    full = torch.ones(vocab, dtype=torch.bool)
    return torch.stack([full if mask is None else mask for mask in masks])  # [n, V]


def to_host(rows: torch.Tensor) -> torch.Tensor:
    """`rows` on the CPU: the one crossing from a model's device to the host (free when the
    model is on the CPU). The rules and the random draws read single entries, and each read
    of a device tensor would be a synchronisation; one copy of the rows costs one."""
    return rows.cpu()


def rule_input(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, ...]:
    """What a verification rule reads, computed where `logits` [n, V] are and not read there,
    with what its check needs: when greedy, each row's argmax [n] (the first on ties, as on the
    host) and whether the row's maximum is finite [n] (NaN with a NaN, +inf with a +inf, -inf
    when the whole row is: exactly what `check_logits` refuses, while -inf masks pass); else
    p = float64 probabilities[n, V] after the request's transforms and whether p's sum is finite
    [] (NaN wherever a check of `probabilities` would refuse). `rule_rows_of` finishes the check
    on the host."""
    if params.greedy:
        check_shape(logits)
        if type(logits) is torch.Tensor and logits.device.type == "cpu" and logits.dtype != torch.bfloat16:
            rows = logits.detach().numpy()  # plain host rows: numpy's reductions, ~10x faster than torch's over 49k
            ids = rows.argmax(axis=-1)  # [n]; the first NaN where a row has one, so its value is the row's max as to finiteness
            return torch.from_numpy(ids), torch.from_numpy(np.isfinite(rows[np.arange(len(ids)), ids]))
        return logits.argmax(dim=-1), torch.isfinite(logits.amax(dim=-1))
    p = probabilities(logits, params, checked=False)
    return p, torch.isfinite(p.sum())


def rule_rows_of(host: Sequence[torch.Tensor], logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The rule's rows from `rule_input(logits, params)` on the host, once the check passes:
    greedy's argmax ids [n], else p [n, V]. Where it does not, the full check reads `logits`
    again to say what is wrong (the one case that reads the device a second time)."""
    rows, finite = host
    if bool(finite.all()):
        return rows
    if params.greedy:
        check_logits(logits)
        return rows
    return to_host(probabilities(logits, params))


def rule_rows(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """What a verification rule reads, on the host, after one copy: the argmax ids [n] of
    the checked logits when greedy (the argmax of a row with NaN or +inf would pass silently),
    else p = float64 probabilities[n, V] after the request's transforms."""
    return rule_rows_of(to_host_all(rule_input(logits, params)), logits, params)


def probabilities(logits: torch.Tensor, params: SamplingParams, checked: bool = True) -> torch.Tensor:
    """logits[n, V] -> float64 probabilities[n, V] after temperature, top-k, top-p, min-p.
    `checked=False` skips the checks that read the logits (each a synchronisation on a device):
    whatever they reject (NaN, +inf, a row of -inf, a temperature that overflows or empties a
    row) leaves NaN in the result instead (`rule_input` checks for it where the rows are).

    >>> probabilities(torch.tensor([[0.0, 0.0, -math.inf]]), SamplingParams()).tolist()
    [[0.5, 0.5, 0.0]]
    """
    if params.greedy:
        raise ValueError("temperature 0 is greedy decoding and has no sampling distribution")
    if checked:
        check_logits(logits)
    else:
        check_shape(logits)
    scaled = logits.double()
    if params.temperature != 1:
        scaled = scaled / params.temperature
        if checked:
            check_scaled(scaled, params.temperature)
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


def check_scaled(scaled: torch.Tensor, temperature: float) -> None:
    """Reject logits that `temperature` scaled out of range."""
    if bool(torch.isposinf(scaled).any()):
        raise ValueError(f"temperature {temperature} overflows the logits; use a larger one")
    if bool(torch.isneginf(scaled).all(dim=-1).any()):
        # Every logit of the row is negative and / temperature rounds to -inf: softmax
        # would give NaN everywhere.
        raise ValueError(
            f"temperature {temperature} underflows a whole row of logits to -inf, so no "
            "token has a probability; use a larger temperature, or 0 for greedy decoding"
        )


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of the descending order whose mass reaches top_p."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return _renormalise(probs.masked_fill(drop, 0.0))


def _renormalise(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum(dim=-1, keepdim=True)
