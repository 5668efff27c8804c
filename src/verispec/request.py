"""`Request`: one generation request as data, the unit every decoder takes.

A request names what to decode and how, and nothing about where it runs: the prompt's token
ids, the budget, the sampling transforms (greedy unless given, as on the command line), the
EOS ids, the seed of its own randomness (drawn when not given), the proposer (a registry spec such as `lookup` or
`eagle:weights=int8`, as text or as the `ProposerSpec` parsed from it; None for plain decoding)
and the k policy (an integer, a k spec such as `auto`, or the `KSpec` parsed from it). The single-request engine (`verispec.engine.Decoding`), the reference
decoder and the batch scheduler (`verispec.batching.Scheduler`) all take it; a proposer object
and a policy object are built from its specs by whoever holds the model
(`verispec.registry.build_proposer`, `build_policy`).

    >>> r = Request((1, 2, 3), max_new_tokens=8, proposer="lookup", k=4)
    >>> r.sampling.greedy, r.k, sorted(r.eos_token_ids)
    (True, 4, [])
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from itertools import count
from typing import Protocol, runtime_checkable

from verispec.checks import is_int
from verispec.k_spec import KSpec, parse_k
from verispec.logprobs import ALL
from verispec.sampling import GREEDY, SamplingParams

_ids = count()


@runtime_checkable
class ParsedProposer(Protocol):
    """A proposer spec parsed where it entered, as a request may hold it instead of the text
    (`verispec.registry.ProposerSpec`): the kind it names and the text it was read from."""

    kind: object
    text: str


def _next_id() -> str:
    return f"req-{next(_ids)}"


@dataclass(frozen=True)
class Request:
    """prompt_ids: the prompt's token ids (at least one). max_new_tokens: the exact budget
    (>= 0). sampling: the transforms shared by p and q (default greedy). eos_token_ids: the
    output ends at the first of any. seed: the request's own randomness (`TorchRandom`), so
    its tokens depend on nothing else in a batch; at temperature > 0 under the coupled rule
    (the default) they are plain decoding's for this seed whatever the speculation. None: a
    fresh seed is drawn here, and `seed` holds it, so the result can be replayed. proposer: a registry spec (its text, or a
    parsed `verispec.registry.ProposerSpec`), or None (plain decoding, then k must be 0). k: an
    integer >= 0, a k spec (`auto`, `heuristic`, ...; `verispec.k_spec.K_GRAMMAR`) or a parsed
    `KSpec`, read once into `k_spec` (None for k = 0). verifier: "auto", a rule name
    (`verispec.verify.RULES`) or a rule function (checked where it is chosen,
    `verispec.verify.rule_chooser`).
    max_k: the most tokens a round drafts (a chain's k, a tree's depth), whatever the k policy
    chooses (None: no cap; 0: every round a plain step). Any k keeps the output law, so a cap
    changes the speed, never the tokens of a greedy request.
    logprobs: report each emitted token's log probability under the target with this many of
    the most likely tokens at its position (0 to the vocabulary's size, or -1 for all of it,
    vLLM's `verispec.logprobs.ALL`; None: none), as plain decoding would (`verispec.logprobs`).
    prompt_logprobs: report each prompt token's log probability under the target, with this
    many of the most likely tokens at its position (as `logprobs`; None: none), from one
    forward over the prompt (`verispec.logprobs.prompt_token_logprobs`; the first token's is
    None: nothing comes before it).
    request_id: a name for logs, metrics and cancellation (unique by default)."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams = GREEDY
    eos_token_ids: frozenset[int] = frozenset()
    seed: int | None = None
    proposer: str | ParsedProposer | None = None
    k: int | str | KSpec = 0
    verifier: str | Callable = "auto"
    max_k: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    request_id: str = field(default_factory=_next_id)
    k_spec: KSpec | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        prompt = tuple(self.prompt_ids)
        if not prompt:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [t for t in prompt if not is_int(t, least=0, integral=True)]
        if bad:
            raise ValueError(f"prompt token ids must be integers >= 0, got {bad[0]!r}")
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in prompt))
        m = self.max_new_tokens
        if not is_int(m, least=0):
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {m!r}")
        if not isinstance(self.sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams, got {self.sampling!r}")
        object.__setattr__(self, "eos_token_ids", eos_ids(self.eos_token_ids))
        if self.seed is None:
            object.__setattr__(self, "seed", secrets.randbits(63))
        if not is_int(self.seed):
            raise ValueError(f"seed must be an integer or None (drawn), got {self.seed!r}")
        proposer = self.proposer
        text = proposer.text if isinstance(proposer, ParsedProposer) else proposer
        if proposer is not None and (not isinstance(text, str) or not text.strip()):
            raise ValueError(f"proposer must be a registry spec (e.g. 'lookup') or None, got {proposer!r}")
        k = self.k
        if isinstance(k, bool) or not isinstance(k, (int, str, KSpec)):
            raise ValueError(f"k must be an integer >= 0 or a k spec such as 'auto', got {k!r}")
        if proposer is None and k != 0:
            raise ValueError("without a proposer, k must be 0 (plain decoding)")
        if self.max_k is not None and not is_int(self.max_k, least=0):
            raise ValueError(f"max_k must be an integer >= 0 or None, got {self.max_k!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value != ALL and not is_int(value, least=0):
                raise ValueError(f"{name} must be an integer >= 0, {ALL} (the whole vocabulary) or None, got {value!r}")
        # read once, here: a constant k >= 1 or a policy (k = 0: plain decoding, no policy)
        spec = k if isinstance(k, KSpec) else None if k == 0 else parse_k(k, option="k")
        object.__setattr__(self, "k_spec", spec)

    @property
    def speculative(self) -> bool:
        return self.proposer is not None

    def round_room(self, emitted: int) -> int:
        """The most tokens a round may emit once `emitted` have been: the rest of the budget, and
        at most max_k + 1 (the drafts and the repair or bonus token); `Plan.budgeted` takes it."""
        rest = self.max_new_tokens - emitted
        return rest if self.max_k is None else min(rest, self.max_k + 1)

    def k_for_decoding(self, policy: object | None = None) -> object:
        """What a decoder of this request takes as k: `policy` when given (a k spec such as
        'auto' needs one, built with the model: `verispec.registry.build_policy`), else the
        integer k; ValueError for a spec without its policy."""
        if policy is not None:
            return policy
        if self.k_spec is None:
            return 0
        if self.k_spec.kind != "constant":
            raise ValueError(f"k {self.k_spec.text or self.k!r} is a spec: build its policy "
                             "(verispec.registry.build_policy) and pass it")
        return self.k_spec.k


def eos_ids(given: int | Collection[int] | None) -> frozenset[int]:
    """One EOS id, a collection of them, or None, as a frozenset (each an integer >= 0)."""
    if given is None:
        return frozenset()
    ids = [given] if isinstance(given, int) else list(given)
    for eos in ids:
        if not is_int(eos, least=0, integral=True):
            raise ValueError(f"eos_token_ids must be token ids (integers >= 0), got {eos!r}")
    return frozenset(int(eos) for eos in ids)
