"""Greedy identity on real text: every proposer, at k = 4 and k = auto (and at the constant tree
tree:2x2x1 where it fills trees), and HF generate produce verispec's plain greedy output token
for token on the default model.

    .venv/bin/python benchmarks/greedy_identity.py [--dtype float32|bfloat16] [--runtime auto|fast|hf]
        [--deterministic] [--per-category 2]
        [--max-new-tokens 64] [--prompts FILE] [--proposers lookup,suffix,...] [--ks 4,auto,tree:2x2x1]
        [--json OUT [--force]]

The prompts are the first N of each category of a Spec-Bench file (first turn, through the chat
template). Prints prompts down and methods across (`=` and tokens per round where identical,
`tie@i` or `FAIL@i` at the first differing new token i), then every mismatch with its diagnosis:
the target's top-2 logit margin in the forward each run chose that token from and in a fresh
full forward. Exit status 1 when a mismatch is not a near tie within the dtype's tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from verispec.bench.identity_suite import KS, identity_proposers, identity_suite, identity_summary, identity_table
from verispec.bench.workloads import data_file, read_workloads, select
from verispec.cli import BadInput
from verispec.cli.paths import check_output_file
from verispec.models.loading.load import DEFAULT_MODEL, load_model

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--runtime", default="auto", choices=["auto", "fast", "hf"])
    parser.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=None,
                        help="the fast runtime's shape-invariant scoring (default: on in bfloat16)")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=Path, default=SPECBENCH)
    parser.add_argument("--proposers", default=None, help=f"comma-separated (default: {','.join(identity_proposers())})")
    parser.add_argument("--ks", default=",".join(KS),
                        help="comma-separated k policies (a tree policy runs only for proposers that fill trees)")
    parser.add_argument("--json", type=Path, default=None, help="write the header, records and summary here")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    args = parser.parse_args()
    if args.json:
        try:
            check_output_file(args.json, "--json", args.force)  # before the run, not after it
        except BadInput as error:
            parser.error(str(error))

    start = time.perf_counter()
    loaded = load_model(args.model, dtype=args.dtype, runtime=args.runtime, deterministic=args.deterministic)
    default = [p.replace(DEFAULT_MODEL, args.model) for p in identity_proposers()]  # the draft is the target's own model
    proposers = args.proposers.split(",") if args.proposers else default
    ks = args.ks.split(",")
    workloads = select(read_workloads(args.prompts), limit_per_category=args.per_category)
    print(f"{args.model} ({args.dtype}, runtime {loaded.runtime}{' deterministic' * bool(getattr(loaded.lm, 'deterministic', False))}), {len(workloads)} prompts, {args.max_new_tokens} new tokens, "
          f"proposers {', '.join(proposers)}, k {', '.join(ks)}; {torch.get_num_threads()} torch threads",
          file=sys.stderr)
    records = identity_suite(loaded, workloads, proposers, ks, args.max_new_tokens,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    summary = identity_summary(records, args.dtype)

    print(identity_table(records))
    print()
    print(f"{summary['identical']} identical of {summary['runs']} runs "
          f"({len(workloads)} prompts x {summary['runs'] // len(workloads)} methods, each against verispec-plain; "
          f"hf-generate is HF generate against verispec-plain)")
    print(f"largest difference of a top-2 logit between two runs at the same prefix: {summary['top_logit_gap']:.3g}, "
          f"so rounding can flip ties within {2 * summary['top_logit_gap']:.3g} "
          f"(near-tie tolerance for {args.dtype}: {summary['tolerance']:g})")
    for record in summary["near_ties"] + summary["failures"]:
        m = record["mismatch"]
        widths = ", ".join(f"{name}: {n}-token forward" for name, n in m["forward_tokens"].items())
        print(f"{'near tie' if m['near_tie'] else 'FAILURE'}: {record['category']}/{record['prompt_id']} "
              f"{record['method']} at new token {m['position']} (expected {m['expected']}, got {m['got']}; {widths}): "
              f"{m['diagnosis']}")
    print(f"{len(summary['failures'])} failures, {len(summary['near_ties'])} near ties; "
          f"{time.perf_counter() - start:.0f} s")

    if args.json:
        header = {"model": args.model, "dtype": args.dtype, "runtime": loaded.runtime,
                  "deterministic": args.deterministic, "max_new_tokens": args.max_new_tokens,
                  "prompts": str(args.prompts), "per_category": args.per_category, "proposers": proposers, "ks": ks,
                  "torch_threads": torch.get_num_threads()}
        counts = {key: summary[key] for key in ("runs", "identical", "top_logit_gap", "tolerance")}
        counts["near_ties"], counts["failures"] = len(summary["near_ties"]), len(summary["failures"])
        args.json.write_text(json.dumps({"header": header, "summary": counts, "records": records}, indent=1))
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
