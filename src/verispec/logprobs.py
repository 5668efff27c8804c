"""Log probabilities of emitted tokens: the target's own distribution at each position.

A speculative round scores [pending, *drafts] in one forward, so row i of its logits is the
target's next-token distribution after the emitted prefix and the first i drafts; the tokens
a round emits (the accepted drafts, then the repair or bonus token) each come after the rows
before them, so token j's distribution is row j (a tree's: the rows along the accepted path).
Those are the very rows plain decoding would score one at a time, so the log probabilities are
plain decoding's whatever the round accepted, and whatever the proposer's q was.

They are the model's raw log probabilities (vLLM's default `raw_logprobs`): log-softmax of the
logits in float32, before the request's temperature, filters and penalties. Each row is
reduced on its own, so a row's values do not depend on how many rows its forward scored.

    >>> rows = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]))
    >>> [(t.token, round(t.logprob, 4), [i for i, _ in t.top]) for t in token_logprobs(rows, [1, 2], 2)]
    [(1, -1.3863, [0, 1]), (2, -0.2231, [2, 0])]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_TOP = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log probability under the target, and the `top` most likely tokens
    at its position with theirs, most likely first (ties: the lower id first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(rows: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """The log probabilities of `tokens`, token j under rows[j] (logits[n >= len(tokens), V]),
    with the `top` (0 to `MAX_TOP`) most likely tokens at each position."""
    out = []
    for j, token in enumerate(tokens):
        logp = torch.log_softmax(rows[j].float(), dim=-1)  # [V], a row alone: batch-invariant
        best = []
        if top:
            values, ids = torch.topk(logp, min(top, logp.shape[-1]), sorted=True)
            best = sorted(zip(ids.tolist(), values.tolist()), key=lambda pair: (-pair[1], pair[0]))
        out.append(TokenLogprob(int(token), float(logp[token]), tuple(best)))
    return out
