"""Log probabilities of emitted tokens: the target's own distribution at each position.

A speculative round scores [pending, *drafts] in one forward, so row i of its logits is the
target's next-token distribution after the emitted prefix and the first i drafts; the tokens
a round emits (the accepted drafts, then the repair or bonus token) each come after the rows
before them, so token j's distribution is row j (a tree's: the rows along the accepted path).
Those are the very rows plain decoding would score one at a time, so the log probabilities are
plain decoding's whatever the round accepted, and whatever the proposer's q was.

The prompt's tokens have theirs too (`prompt_token_logprobs`): one forward over the prompt,
row i the target's distribution after its first i + 1 tokens, so token i + 1's; the first
token's is None (nothing comes before it), as OpenAI's `echo` and vLLM's `prompt_logprobs`
report it.

They are the model's raw log probabilities (vLLM's default `logprobs_mode`, `raw_logprobs`),
the prompt's and the reply's alike: log-softmax of the logits in float32, before the request's
temperature, filters, penalties and grammar. Each row is reduced on its own, so a row's values
do not depend on how many rows its forward scored. A token's `rank` is vLLM's: how many
tokens are at least as likely (1: the most likely).

`top` -1 is vLLM's "the whole vocabulary" (`ALL`): every token at the position, most likely
first, V pairs a token (a row's full sort: O(V log V) where a bounded top is O(V)).

    >>> rows = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]))
    >>> [(t.token, round(t.logprob, 4), t.rank, [i for i, _ in t.top]) for t in token_logprobs(rows, [1, 2], 2)]
    [(1, -1.3863, 3, [0, 1]), (2, -0.2231, 1, [2, 0])]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

MAX_TOP = 20  # OpenAI's bound on top_logprobs, and vLLM's default --max-logprobs
ALL = -1  # vLLM's `logprobs` / `prompt_logprobs` -1: every token of the vocabulary


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log probability under the target, its rank there (vLLM's: the tokens at
    least as likely, itself included), and the `top` most likely tokens at its position with
    theirs, most likely first (ties: the lower id first)."""

    token: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()

    def as_dict(self, text_of: Callable[[int], str]) -> dict:
        """As JSON (`verispec generate --json`): the token's id, its text (`text_of`), logprob
        and rank, and `top_logprobs`, each alternative's id, text and logprob."""
        return {"token_id": self.token, "token": text_of(self.token), "logprob": self.logprob, "rank": self.rank,
                "top_logprobs": [{"token_id": t, "token": text_of(t), "logprob": v} for t, v in self.top]}


def token_logprobs(rows: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """The log probabilities of `tokens`, token j under rows[j] (logits[n >= len(tokens), V]),
    with the `top` (0 to V, or `ALL`) most likely tokens at each position.

    >>> [(t, round(v, 4)) for t, v in token_logprobs(torch.zeros(1, 3), [2], ALL)[0].top]
    [(0, -1.0986), (1, -1.0986), (2, -1.0986)]
    """
    out = []
    for j, token in enumerate(tokens):
        logp = torch.log_softmax(rows[j].float(), dim=-1)  # [V], a row alone: batch-invariant
        best = []
        if top == ALL:  # a stable sort: ties keep the lower id first
            values, ids = torch.sort(logp, descending=True, stable=True)  # [V], [V]
            best = list(zip(ids.tolist(), values.tolist()))
        elif top:
            values, ids = torch.topk(logp, min(top, logp.shape[-1]), sorted=True)
            best = sorted(zip(ids.tolist(), values.tolist()), key=lambda pair: (-pair[1], pair[0]))
        out.append(TokenLogprob(int(token), float(logp[token]), int((logp >= logp[token]).sum()), tuple(best)))
    return out


def prompt_token_logprobs(rows: torch.Tensor, prompt: Sequence[int], top: int) -> list[TokenLogprob | None]:
    """The prompt's log probabilities from the target's rows over it (logits[n >= len(prompt)
    - 1, V], row i after prompt[: i + 1]): None for the first token, then token i + 1's under
    row i, with the `top` most likely tokens at each position.

    >>> rows = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    >>> [None if t is None else (t.token, round(t.logprob, 4)) for t in prompt_token_logprobs(rows, [2, 0], 1)]
    [None, (0, -0.6931)]
    """
    return [None, *token_logprobs(rows, prompt[1:], top)]
