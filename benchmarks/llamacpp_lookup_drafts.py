"""How often llama-cpp-python's prompt lookup drafts on the sampled-law prompts of
`verispec check-runtime llamacpp`: what its `spec vs plain` rows can see.

    .venv/bin/python benchmarks/llamacpp_lookup_drafts.py ["another prompt" ...]

For each raw-text prompt (default: the check's `law.SPREAD_TEXTS`), the number of tokens
`LlamaPromptLookupDecoding(num_pred_tokens=10)` drafts after the prompt (what the first sampled
token is verified against) and the probability, under the target's exact law, that it drafts
after prompt + t1 (the second token). A prompt where both are 0 checks plain sampling twice. No
sampling, so nothing here is random; needs the llamacpp extra (`make llamacpp`) for the draft
model only.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from verispec.bench.methods import LLAMACPP_LOOKUP_TOKENS
from verispec.models.load import load_model
from verispec.runtime_check.law import SPREAD_TEXTS


def drafts(lookup, ids: list[int]) -> int:
    return len(lookup(np.asarray(ids, dtype=np.intc)))


def main(texts: list[str]) -> None:
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    lookup = LlamaPromptLookupDecoding(num_pred_tokens=LLAMACPP_LOOKUP_TOKENS)
    loaded = load_model(dtype="float32")
    print("| prompt | tokens drafted after it | P(a draft after prompt + t1) |\n|---|---|---|")
    for text in texts:
        ids = loaded.encode(text, chat=False)
        p = torch.softmax(loaded.lm.score(ids)[-1].double(), -1)  # [V]
        likely = torch.nonzero(p > 1e-6).flatten().tolist()
        second = sum(float(p[t]) for t in likely if drafts(lookup, ids + [t]))
        print(f"| {text!r} | {drafts(lookup, ids)} | {second:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1:] or list(SPREAD_TEXTS))
