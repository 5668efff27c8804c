"""Does the cost model predict the speedup it claims? Predicted against measured, per proposer.

    .venv/bin/python benchmarks/prediction_check.py [--prompts FILE.jsonl] [--per-category 1]
        [--categories summarization,rag,coding,writing] [--proposers lookup,suffix,layerskip:8:8192]
        [--k 2] [--max-new-tokens 96] [--json OUT]

For each prompt and proposer: measure the profile (v(n), c) after the prompt, decode plainly
and speculatively with a fixed k, then compare the measured decode speedup (tokens per decode
second, prefill excluded, over plain decoding's) with the one `verispec.cost.predicted_speedup`
derives from the run's own survival and the profile. Reports both and their ratio; the pooled
row sums tokens and seconds over all prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from verispec import GREEDY, generate, load_model
from verispec.bench.workloads import data_file, read_workloads, select
from verispec.cli import BadInput
from verispec.cli.paths import check_output_file
from verispec.cost import predicted_speedup
from verispec.profile import measure_profile
from verispec.registry import build_proposer

SPECBENCH = data_file("specbench_dev.jsonl", Path(__file__).parents[1])


def decode_rate(stats) -> float:
    return stats.new_tokens / stats.decode_seconds


def check(loaded, workloads, proposers: list[str], k: int, max_new_tokens: int) -> list[dict]:
    rows = []
    for workload in workloads:
        ids = workload.token_ids(loaded)
        options = dict(max_new_tokens=max_new_tokens, sampling=GREEDY, eos_token_id=loaded.eos_token_id)
        plain = generate(loaded.lm, None, ids, k=0, **options).stats
        for spec in proposers:
            proposer = build_proposer(spec, loaded, corpus=[ids])
            profile = measure_profile(loaded.lm, proposer, ids, k_max=k, repeats=5, warmup=1)
            run = generate(loaded.lm, proposer, ids, k=k, **options).stats
            rows.append({
                "prompt": f"{workload.category}/{workload.id}",
                "proposer": spec,
                "k": k,
                "c": profile.c,
                "v": profile.v,
                "mean_accepted": run.mean_accepted,
                "predicted": predicted_speedup(run, profile),
                "measured": decode_rate(run) / decode_rate(plain),
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=SPECBENCH)
    parser.add_argument("--categories", default="summarization,rag,coding,writing")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--proposers", default="lookup,suffix,layerskip:8:8192")
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--force", action="store_true", help="overwrite an existing --json file")
    args = parser.parse_args()
    if args.json:
        try:
            check_output_file(args.json, "--json", args.force)  # before the run, not after it
        except BadInput as error:
            parser.error(str(error))
    loaded = load_model()
    workloads = select(read_workloads(args.prompts), args.categories.split(","), args.per_category)
    rows = check(loaded, workloads, args.proposers.split(","), args.k, args.max_new_tokens)
    print(f"{'prompt':<22}{'proposer':<18}{'tau':>6}{'predicted':>11}{'measured':>10}{'ratio':>8}")
    for row in rows:
        ratio = row["predicted"] / row["measured"]
        print(f"{row['prompt']:<22}{row['proposer']:<18}{row['mean_accepted']:>6.2f}"
              f"{row['predicted']:>10.2f}x{row['measured']:>9.2f}x{ratio:>8.2f}")
    for spec in args.proposers.split(","):
        mine = [row for row in rows if row["proposer"] == spec]
        ratios = [row["predicted"] / row["measured"] for row in mine]
        print(f"{spec}: median predicted/measured {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f}) over {len(mine)} prompts")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
