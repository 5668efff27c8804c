"""The k policy a command line names: an integer, `heuristic`, `auto` or `auto:PROFILE.json`.

Apart from `verispec.policies` because `auto` measures (`verispec.profile`), and the policies
themselves must not depend on the profiler.
"""

from __future__ import annotations

from collections.abc import Sequence

from verispec.models.base import CausalLM
from verispec.policies import AutoK, ConstantK, HeuristicK, KPolicy
from verispec.profile import Profile, measured_autok
from verispec.proposers.base import Proposer
from verispec.sampling import SamplingParams


def policy_from_spec(
    spec: str,
    target: CausalLM,
    proposer: Proposer | None,
    prompt_ids: Sequence[int],
    sampling: SamplingParams | None = None,
) -> KPolicy:
    """The policy a command line names: an integer k >= 0, `heuristic` (HF's schedule),
    `auto` (AutoK on a brief profile measured now, after this prompt) or `auto:PROFILE.json`
    (AutoK on a profile written by `verispec profile --out`)."""
    text = spec.strip()
    if text.isdigit():
        return ConstantK(int(text))
    if text == "heuristic":
        return HeuristicK()
    if text.startswith("auto:"):
        return AutoK(Profile.load(text.removeprefix("auto:")))
    if text == "auto":
        if proposer is None:
            raise ValueError("k = auto measures the proposer's cost; give a proposer or an integer k")
        return measured_autok(target, proposer, prompt_ids, sampling=sampling)
    raise ValueError(f"unknown k {spec!r}; give an integer >= 0, heuristic, auto or auto:PROFILE.json")
