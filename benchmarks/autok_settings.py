"""AutoK settings compared on the dev prompts: each setting's end-to-end tokens/s over plain
decoding's on the same prompt in the same repeat, methods interleaved (the order rotates per
prompt), greedy, every run checked token for token against plain decoding (a difference must be
a near tie of the target's own rounding, as `verispec bench` diagnoses it, or the run fails).

    .venv/bin/python benchmarks/autok_settings.py --proposer eagle \\
        --settings '{"w1": {"prior_weight": 1, "memory": 0.9}, "default": {}}' \\
        [--tree] [--repeats 2] [--per-category 1] [--humaneval 1] [--max-new-tokens 128]
        [--dtype auto] [--json OUT]

A setting is a name and the `AutoK` (with `--tree`, `TreePolicy`) keyword options it changes;
{} is the defaults, and an integer is a fixed k instead, to compare with. All settings start from one profile of the proposer, measured once on the
first prompt, as `verispec bench` does. Reported per setting: the median ratio over plain
(interquartile range), the geometric mean, tau, and the share of rounds that drafted nothing
(plain steps, or a proposer with nothing to offer).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from verispec.identity import diagnose
from verispec.bench.runners import VerispecRunner
from verispec.runner import warm_up
from verispec.bench.workloads import read_workloads, select
from verispec.machine import describe
from verispec.models.loading.load import DEFAULT_MODEL, load_model
from verispec.policies import AutoK
from verispec.profile import measure_profile
from verispec.registry import build_proposer
from verispec.tree_policy import TREE_NODES, TreePolicy

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--proposer", default="eagle")
    parser.add_argument("--settings", required=True, help='JSON: {"name": {AutoK options} or a fixed k, ...}')
    parser.add_argument("--tree", action="store_true", help="TreePolicy instead of AutoK")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--humaneval", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    try:
        settings = json.loads(args.settings)
    except json.JSONDecodeError as error:
        parser.error(f"--settings is not valid JSON ({error.msg}); give an object such as '{{\"default\": {{}}}}'")
    if not isinstance(settings, dict) or not settings or "plain" in settings:
        parser.error('--settings must be a non-empty JSON object of name -> options, without "plain"')
    for name, options in settings.items():
        fixed = isinstance(options, int) and not isinstance(options, bool) and options >= 1
        if not (fixed or isinstance(options, dict)):
            parser.error(f"--settings: {name!r} must be an object of options or a fixed k >= 1, got {options!r}")

    loaded = load_model(args.model, dtype=args.dtype)
    workloads = select(read_workloads(args.data / "specbench_dev.jsonl"), limit_per_category=args.per_category)
    workloads += read_workloads(args.data / "humaneval_dev.jsonl")[: args.humaneval]
    prompts = [(w.category, w.token_ids(loaded)) for w in workloads]
    proposer = build_proposer(args.proposer, loaded)
    policy_class, k_max = (TreePolicy, TREE_NODES) if args.tree else (AutoK, 8)
    profile = measure_profile(loaded.lm, proposer, prompts[0][1], k_max=k_max, repeats=2, warmup=1)
    eos = loaded.eos_token_ids
    runners = {"plain": VerispecRunner(loaded.lm, None, 0, eos)}
    for name, options in settings.items():
        try:
            policy = options if isinstance(options, int) else policy_class(profile, **options)
        except (TypeError, ValueError) as error:
            parser.error(f"--settings: {name!r}: {error}")
        runners[name] = VerispecRunner(loaded.lm, proposer, policy, eos)
    names = list(runners)

    warm_up(loaded.lm, prompts[0][1])
    for runner in runners.values():
        runner(prompts[0][1], 16)
    ratios: dict[str, list[float]] = {name: [] for name in settings}
    taus: dict[str, list[float]] = {name: [] for name in settings}
    idle: dict[str, list[float]] = {name: [] for name in settings}
    ties: dict[str, int] = {name: 0 for name in settings}
    for repeat in range(args.repeats):
        for i, (category, ids) in enumerate(prompts):
            shift = (i + repeat) % len(names)
            outcomes = {name: runners[name](ids, args.max_new_tokens) for name in names[shift:] + names[:shift]}
            plain = outcomes["plain"]
            for name in settings:
                outcome = outcomes[name]
                mismatch = diagnose(ids, plain.tokens, outcome.tokens, loaded.lm.score, loaded.dtype_name)
                if mismatch is not None and not mismatch["near_tie"]:
                    raise SystemExit(f"error: {name} on {category}: {mismatch['diagnosis']}")
                ties[name] += mismatch is not None
                rounds = outcome.stats.rounds
                ratios[name].append(outcome.tokens_per_s / plain.tokens_per_s)
                taus[name].append(len(outcome.tokens) / rounds)
                idle[name].append(sum(d == 0 for d in outcome.stats.drafted) / rounds)
            print(category, " ".join(f"{n} {ratios[n][-1]:.2f}" for n in settings), flush=True)

    machine = describe(loaded.dtype_name)
    print(f"\n{machine['cpu']} (native bf16: {machine['native_bf16']}), {machine['torch_threads']} threads, "
          f"{loaded.dtype_name}, proposer {args.proposer}{' (tree)' if args.tree else ''}, "
          f"{len(prompts)} prompts x {args.repeats} repeats\n")
    print("| setting | options | x plain, median (IQR) | geometric mean | tau | rounds drafting nothing "
          "| runs unlike plain (near ties) |")
    print("|---|---|---|---|---|---|---|")
    summary = {}
    for name, options in settings.items():
        r = ratios[name]
        q1, _, q3 = statistics.quantiles(r, n=4)
        summary[name] = {
            "options": options, "median": statistics.median(r), "q1": q1, "q3": q3,
            "geometric_mean": statistics.geometric_mean(r), "tau": statistics.mean(taus[name]),
            "idle_share": statistics.mean(idle[name]), "near_ties": ties[name], "ratios": r,
        }
        s = summary[name]
        print(f"| {name} | `{json.dumps(options)}` | {s['median']:.3f} ({q1:.2f}-{q3:.2f}) | "
              f"{s['geometric_mean']:.3f} | {s['tau']:.2f} | {s['idle_share']:.0%} | {ties[name]} of {len(r)} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "args": vars(args) | {"data": str(args.data)},
                                         "settings": summary}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
