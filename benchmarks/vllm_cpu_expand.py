"""Two faults of vLLM 0.32's CPU build in the rejection sampler's sampling constraints, which
`verispec check-runtime vllm` finds; greedy requests skip both.

1. `expand_batch_to_tokens` spreads each request's temperature, top_k and top_p over its draft
   positions; its C++ fallback (no Triton-CPU) writes into an int64 copy of the output and
   leaves the real output uninitialised, so the target's logits are divided by leftover memory
   and every sampled request with verified drafts draws from a wrong law. Upstream:
   vllm-project/vllm #55005 (fix proposed in #55006).
2. With top_k set, a step in which no request drafted (zero draft positions) makes
   `apply_top_k_only` take `max()` of an empty tensor and raise, whatever (1) leaves there.

    .venv-vllm/bin/python benchmarks/vllm_cpu_expand.py

prints what each returned; exit status 1 when either is wrong.
"""

import sys
import types

import torch


def main() -> int:
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler

    cu = torch.tensor([3, 6, 9], dtype=torch.int32)  # three requests, three draft positions each
    wrong = 0
    for x in (torch.tensor([1.0, 0.6, 1.0]), torch.tensor([5, 5, 0], dtype=torch.int32), torch.tensor([0.8, 1.0, 0.8])):
        got = rejection_sampler.expand_batch_to_tokens(x, cu, 9)
        expected = x.repeat_interleave(3)
        wrong += not torch.equal(got, expected)
        print(f"expand {x.dtype}: {x.tolist()} -> {got.tolist()} (expected {expected.tolist()})")

    top_k = types.SimpleNamespace(all_greedy=False, temperature=torch.ones(2),
                                  top_k=torch.tensor([5, 5], dtype=torch.int32), top_p=None)
    try:
        rejection_sampler.apply_sampling_constraints(torch.zeros(0, 8), torch.tensor([0, 0], dtype=torch.int32), top_k)
        print("top_k with no draft positions: no error")
    except RuntimeError as error:
        wrong += 1
        print(f"top_k with no draft positions: RuntimeError: {error}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
