"""vLLM 0.32's CPU build spreads a request's temperature, top_k and top_p over its draft
positions with `expand_batch_to_tokens`, whose C++ fallback (no Triton-CPU) writes into an int64
copy of the output and leaves the real output uninitialised: the rejection sampler then divides
the target's logits by garbage, so every sampled request with speculation draws its verified
tokens from a wrong law (what `verispec check-runtime vllm` finds). Greedy requests skip it.
Upstream: vllm-project/vllm #55005 (fix proposed in #55006).

    .venv-vllm/bin/python benchmarks/vllm_cpu_expand.py

prints each input and what the kernel returned; exit status 1 when they differ.
"""

import sys

import torch
from vllm.platforms import current_platform

current_platform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens  # noqa: E402

cu = torch.tensor([3, 6, 9], dtype=torch.int32)  # three requests, three draft positions each
wrong = 0
for x in (torch.tensor([1.0, 0.6, 1.0]), torch.tensor([5, 5, 0], dtype=torch.int32), torch.tensor([0.8, 1.0, 0.8])):
    got = expand_batch_to_tokens(x, cu, 9)
    expected = x.repeat_interleave(3)
    wrong += not torch.equal(got, expected)
    print(f"{x.dtype}: {x.tolist()} -> {got.tolist()} (expected {expected.tolist()})")
sys.exit(1 if wrong else 0)
