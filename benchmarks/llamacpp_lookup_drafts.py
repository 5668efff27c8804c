"""How often llama-cpp-python's prompt lookup drafts on the sampled-law prompts of
`verispec check-runtime llamacpp`: what its `spec vs plain` rows can see.

    .venv/bin/python benchmarks/llamacpp_lookup_drafts.py ["another prompt" ...]
    .venv/bin/python benchmarks/llamacpp_lookup_drafts.py --check 150 --out DIR "prompt" ... [--parameter P ...]

For each raw-text prompt (default: the check's `law.SPREAD_TEXTS`), the number of tokens
`LlamaPromptLookupDecoding(num_pred_tokens=10)` drafts after the prompt (what the first sampled
token is verified against) and the probability, under the target's exact law, that it drafts
after prompt + t1 (the second token). A prompt where both are 0 checks plain sampling twice. No
sampling, so nothing here is random; needs the llamacpp extra (`make llamacpp`) for the draft
model only.

With `--check N`, it then runs the sampled-law part of `verispec check-runtime llamacpp` on
these prompts instead of the check's own choice (N samples per side per parameter, split over
them; `--parameter` as the command's, default: default, temperature, top_k, min_p) and writes
`check-runtime-llamacpp-drafting.md` and `.json` to `--out`: the check on prompts where lookup
drafts, which the command's spread prompts mostly are not.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

from verispec.bench.methods import LLAMACPP_LOOKUP_TOKENS
from verispec.models.loading.load import load_model
from verispec.runtime_check import Reference, Settings, check_runtime
from verispec.runtime_check.engines import open_engine
from verispec.runtime_check.law import SPREAD_TEXTS

PARAMETERS = ["default", "temperature", "top_k", "min_p"]


def drafts(lookup, ids: list[int]) -> int:
    return len(lookup(np.asarray(ids, dtype=np.intc)))


def main(texts: list[str], check: int, out: Path | None, parameters: list[str]) -> None:
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
    if not check:
        return
    prompts = [loaded.encode(text, chat=False) for text in texts]
    settings = Settings(n=check, prompts=len(prompts), sample_prompts=prompts, parameters=parameters,
                        progress=lambda line: print(line, file=sys.stderr, flush=True))
    reference = Reference(loaded.lm.score, lambda text: loaded.encode(text, chat=False), loaded.eos_token_ids)
    report = check_runtime(open_engine("llamacpp", loaded, "float32"), reference, ["lookup"], settings)
    report.command = shlex.join(["python", "benchmarks/llamacpp_lookup_drafts.py", *sys.argv[1:]])
    report.prompts = [{**row, "text": text} for text, row in zip(texts, report.prompts)]
    print(report.markdown())
    if out is not None:
        (out / "check-runtime-llamacpp-drafting.md").write_text(report.markdown() + "\n", encoding="utf-8")
        (out / "check-runtime-llamacpp-drafting.json").write_text(
            json.dumps(report.as_dict(), indent=1, default=str) + "\n", encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("texts", nargs="*", help="raw-text prompts (default: the check's SPREAD_TEXTS)")
    parser.add_argument("--check", type=int, default=0, help="run the sampled-law check with N samples per side")
    parser.add_argument("--out", type=Path, help="write the check's report here")
    parser.add_argument("--parameter", action="append", help="a parameter of the check (repeatable)")
    args = parser.parse_args()
    main(args.texts or list(SPREAD_TEXTS), args.check, args.out, args.parameter or PARAMETERS)
