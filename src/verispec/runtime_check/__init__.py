"""`verispec check-runtime`: test any engine's speculative decoding for exactness, as verispec
tests its own (docs/check-runtime.md). Its G-tests, their error rate and power are
`verispec.statistics`'s.

    cases       the sampling parameters varied and verispec's exact law for each
    law         the exact law of a continuation's first tokens; the spread prompts
    engines     the engines under check behind one protocol (verispec, hf, openai, llamacpp, vllm)
    check       the checks of one engine: sampled law per method and parameter, greedy identity
    greedy      greedy identity with the near-tie diagnosis
    controls    broken engines the check must catch (raw q, a parameter on the bonus token only,
                a stale cache after a rejection)
    report      the table, as markdown and JSON
"""

from verispec.runtime_check.check import Reference, Settings, check_runtime

__all__ = ["Reference", "Settings", "check_runtime"]
