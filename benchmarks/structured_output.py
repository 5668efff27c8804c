"""Structured output with speculation on the default model: the grammar library's mask time,
and constrained decoding's speed, speculative against plain under the same grammar.

    .venv/bin/python benchmarks/structured_output.py [--part masks|decode|all] [--proposer lookup+eagle]
        [--k auto] [--per-category 1] [--max-new-tokens 128]

masks: llguidance's and outlines-core's time to produce one token mask of the 49,152-token
vocabulary along a JSON document (median and max over its tokens; outlines-core is measured
when installed). decode: each Spec-Bench dev prompt (per category) asked for a JSON object
following a small schema, greedy, plain and speculative interleaved under the same grammar;
prints tokens/s of each, the speedup, and checks the outputs are identical token for token.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

from verispec import SamplingParams, generate, load_model
from verispec.bench.workloads import data_file, read_workloads, select
from verispec.grammar import GrammarCompiler
from verispec.proposers.trained import default_proposer
from verispec.registry import build_policy, build_proposer, parse_k
from verispec.request import Request
from verispec.sampling import GREEDY

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"}, "summary": {"type": "string"},
                                           "points": {"type": "array", "items": {"type": "string"}}},
          "required": ["title", "summary", "points"]}
DOCUMENT = '{"title": "Ada Lovelace", "summary": "The first programmer.", "points": ["math", "poetry", "engines"]}'


def masks(loaded) -> None:
    ids = loaded.tokenizer(DOCUMENT, add_special_tokens=False).input_ids
    grammar = GrammarCompiler(loaded.tokenizer, loaded.lm.vocab_size).json_schema(SCHEMA)
    times = []
    for j in range(len(ids) + 1):
        grammar.masks.clear()
        start = time.perf_counter()
        grammar.allowed(ids[:j])
        times.append(time.perf_counter() - start)
    print(f"llguidance: {1e6 * statistics.median(times):.0f} us median, {1e6 * max(times):.0f} us max per mask "
          f"({len(times)} masks)")
    try:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
    except ImportError:
        print("outlines-core: not installed")
        return
    import torch

    tokenizer = loaded.tokenizer
    by_bytes: dict[bytes, list[int]] = {}
    for i in range(loaded.lm.vocab_size):
        if i not in tokenizer.all_special_ids:
            by_bytes.setdefault(tokenizer.decode([i]).encode(), []).append(i)
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), Vocabulary(tokenizer.eos_token_id, by_bytes))
    guide, times = Guide(index), []
    for token in ids:
        start = time.perf_counter()
        mask = torch.zeros(loaded.lm.vocab_size, dtype=torch.bool)
        mask[guide.get_tokens()] = True
        times.append(time.perf_counter() - start)
        guide.advance(token)
    print(f"outlines-core: {1e6 * statistics.median(times):.0f} us median, {1e6 * max(times):.0f} us max per mask")


def decode(loaded, args) -> None:
    proposer = build_proposer(args.proposer or default_proposer(args.model), loaded)
    compiler = GrammarCompiler(loaded.tokenizer, loaded.lm.vocab_size)
    prompts = [loaded.encode(w.text + "\nAnswer as JSON with a title, a summary and a list of points.", chat=w.chat)
               for w in select(read_workloads(SPECBENCH), limit_per_category=args.per_category)]
    policy = build_policy(parse_k(args.k), loaded.lm, proposer, prompts[0], GREEDY)

    def run(ids, speculative: bool):
        sampling = SamplingParams(temperature=0, grammar=compiler.json_schema(SCHEMA))
        request = Request(tuple(ids), args.max_new_tokens, sampling=sampling, eos_token_ids=loaded.eos_token_ids)
        start = time.perf_counter()
        out = generate(loaded.lm, proposer if speculative else None, request,
                       policy=copy.deepcopy(policy) if speculative else None)
        return out, len(out.tokens) / (time.perf_counter() - start)

    run(prompts[0], True)  # warm-up
    speedups = []
    for i, ids in enumerate(prompts):
        order = [False, True] if i % 2 == 0 else [True, False]
        results = {speculative: run(ids, speculative) for speculative in order}
        (plain, plain_rate), (spec, spec_rate) = results[False], results[True]
        if plain.tokens != spec.tokens:
            raise SystemExit(f"prompt {i}: speculative output differs from plain constrained decoding")
        speedups.append(spec_rate / plain_rate)
        print(f"prompt {i:>2}: plain {plain_rate:6.1f} tok/s, speculative {spec_rate:6.1f} tok/s, "
              f"{spec_rate / plain_rate:.2f}x, {spec.stats.mean_accepted:.2f} tokens/round")
    print(f"median speedup {statistics.median(speedups):.2f}x over {len(speedups)} prompts (target >= 1.3x), "
          "every output identical")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["masks", "decode", "all"], default="all")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--proposer", default=None)
    parser.add_argument("--k", default="auto")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    loaded = load_model(args.model, dtype=args.dtype)
    if args.part in ("masks", "all"):
        masks(loaded)
    if args.part in ("decode", "all"):
        decode(loaded, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
