"""Tokens per second against the context length: plain decoding, fixed k and `--k auto` with
and without the profile's context axis, on one long document.

    .venv/bin/python benchmarks/long_context.py [--lengths 512,1024,2048,4096,6144]
        [--proposer lookup] [--ks 1,2,4] [--max-new-tokens 40] [--repeats 3] [--warmup 1]
        [--dtype auto] [--json FILE] [--plot FILE.png]

The document is this project's own documentation (README.md and docs/*.md, in name order)
tokenized once; the request at length L is its first L tokens, continued greedily for
`--max-new-tokens` tokens (no EOS: every run emits the same number of tokens). The lengths
are prefixes of one document, so the target's cache is filled once: the profile prefills the
longest and rolls back through the others (`measure_context_costs`), then the runs go from
the shortest length up, the cache extended to each in turn and rolled back to the prompt
before every run (`Decoding.begin(prefilled=...)`). At each length the methods run in turn, the order rotated every repeat, after `--warmup` untimed
rounds of them all; a run's tokens per second count its decoding rounds (from the first
round to the last), not the prompt. Every run's tokens are compared with plain decoding's.

Methods: `plain`; `k=N` for each of `--ks`; `auto`, the auto policy on a profile measured at
every length (the context axis, what `verispec profile --contexts` measures); `auto-flat`,
the same policy on the profile of the shortest length only (costs taken as flat in context,
as before the context axis). Prints a table of medians and writes the per-run numbers, the
profile's context table and the machine (`--json`) and tok/s against the context length with
the interquartile range (`--plot`). The targets: auto >= 0.97x plain at every length and
>= 0.95x the best fixed k there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from verispec import GREEDY, load_model
from verispec.cost import FixedCosts
from verispec.engine import Decoding
from verispec.machine import describe
from verispec.models import DEFAULT_MODEL
from verispec.policies import AutoK
from verispec.profile import Timing, measure_context_costs, measure_profile
from verispec.registry import build_proposer
from verispec.request import Request

ROOT = Path(__file__).parents[1]


def document(loaded, length: int) -> list[int]:
    """This project's documentation as token ids, at least `length` of them."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    ids = loaded.encode("\n\n".join(path.read_text() for path in files), chat=False)
    if len(ids) < length:
        raise SystemExit(f"error: the documentation holds {len(ids)} tokens; give lengths up to that")
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--proposer", default="lookup")
    parser.add_argument("--lengths", default="512,1024,2048,4096,6144")
    parser.add_argument("--ks", default="1,2,4")
    parser.add_argument("--k-max", type=int, default=4, help="the longest chain auto considers (v(n) to k_max + 1)")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--profile-repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    try:
        lengths = sorted(int(n) for n in args.lengths.split(","))
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        parser.error(f"--lengths and --ks take comma-separated integers, got {args.lengths!r} and {args.ks!r}")
    if lengths[0] < 2 or min(ks) < 1 or max(ks) > args.k_max:
        parser.error(f"lengths must be >= 2 and every k in 1..--k-max ({args.k_max})")

    loaded = load_model(args.model, dtype=args.dtype)
    target = loaded.lm
    limit = loaded.context_limit
    if limit is not None and lengths[-1] + args.max_new_tokens > limit:
        parser.error(f"the longest length and the new tokens exceed the model's context of {limit} tokens")
    ids = document(loaded, lengths[-1])
    proposer = build_proposer(args.proposer, loaded)

    start = time.perf_counter()
    options = dict(k_max=args.k_max, repeats=args.profile_repeats, warmup=1)
    profile = measure_profile(target, proposer, ids[: lengths[0]], **options)
    profile.contexts = measure_context_costs(target, proposer, ids, lengths, **options)
    profile_seconds = time.perf_counter() - start
    print(f"profiled {len(lengths)} context lengths in {profile_seconds:.0f} s", flush=True)
    policies = {
        "auto": AutoK(profile),
        "auto-flat": AutoK(FixedCosts(profile.c, profile.v, profile.step_seconds)),
    }
    methods = ["plain", *(f"k={k}" for k in ks), *policies]

    def grow(length: int) -> None:
        """Extend the cache, which holds a prefix of the document, to its first `length` tokens."""
        if length > target.length:
            target.extend(ids[target.length : length], keep=1)

    def run(length: int, method: str) -> tuple[list[int], float]:
        """One request of the first `length` tokens, the target's cache holding all but the last."""
        target.rollback(length - 1)
        policy = 0 if method == "plain" else int(method[2:]) if method.startswith("k=") else policies[method]
        decoding = Decoding(
            target, None if method == "plain" else proposer,
            Request(tuple(ids[:length]), args.max_new_tokens, sampling=GREEDY), policy=policy,
        )
        decoding.begin(prefilled=0.0)
        began = time.perf_counter()
        while not decoding.done:
            decoding.round()
        return decoding.tokens, len(decoding.tokens) / (time.perf_counter() - began)

    results: dict[int, dict[str, list[float]]] = {}
    unlike: list[str] = []
    for length in lengths:  # the cache holds the shortest; each longer one extends it
        grow(length - 1)
        speeds: dict[str, list[float]] = {method: [] for method in methods}
        plain_tokens = None
        for repeat in range(args.warmup + args.repeats):
            shift = repeat % len(methods)
            for method in methods[shift:] + methods[:shift]:
                tokens, speed = run(length, method)
                if method == "plain":
                    plain_tokens = plain_tokens or tokens
                elif plain_tokens is not None and tokens != plain_tokens:
                    unlike.append(f"{method} at {length}")
                if repeat >= args.warmup:
                    speeds[method].append(speed)
        results[length] = speeds
        medians = {m: statistics.median(s) for m, s in speeds.items()}
        best = max((m for m in methods if m.startswith("k=")), key=medians.__getitem__)
        print(
            f"{length:>6} tokens: " + ", ".join(f"{m} {medians[m]:.2f}" for m in methods)
            + f" tok/s; auto {medians['auto'] / medians['plain']:.3f}x plain, "
            f"{medians['auto'] / medians[best]:.3f}x the best fixed k ({best}) [{time.perf_counter() - start:.0f} s]",
            flush=True,
        )
    table = profile.context_table
    report = {
        "header": {
            "model": loaded.name, "dtype": loaded.dtype_name, "runtime": loaded.runtime, "proposer": args.proposer,
            "lengths": lengths, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "warmup": args.warmup,
            "k_max": args.k_max, "profile_seconds": profile_seconds, "machine": describe(loaded.dtype_name),
            "context_table": {"contexts": table.contexts, "seconds": table.seconds, "draft": table.draft},
        },
        "unlike_plain": unlike,
        "tok_s": {str(length): speeds for length, speeds in sorted(results.items())},
        "summary": {
            str(length): {m: Timing.of(s).__dict__ for m, s in speeds.items()} for length, speeds in sorted(results.items())
        },
    }
    print(f"runs unlike plain decoding: {len(unlike)}" + (f" ({', '.join(unlike)})" if unlike else ""))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        draw(args.plot, report, methods)
    return 0


def draw(path: Path, report: dict, methods: list[str]) -> None:
    """Median tok/s against the context length, each method with its interquartile range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header = report["header"]
    lengths = header["lengths"]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for method in methods:
        timings = [report["summary"][str(n)][method] for n in lengths]
        medians = [t["median"] for t in timings]
        spread = [[m - t["q1"] for m, t in zip(medians, timings)], [t["q3"] - m for m, t in zip(medians, timings)]]
        style = {"linewidth": 2.5} if method == "auto" else {"linestyle": "--"} if method == "plain" else {"alpha": 0.8}
        axes.errorbar(lengths, medians, yerr=spread, marker="o", capsize=3, label=method, **style)
    axes.set_xscale("log", base=2)
    axes.set_xticks(lengths, [str(n) for n in lengths])
    axes.set_xlabel("context length (tokens of the document before the new ones)")
    axes.set_ylabel("tokens per second (median, IQR)")
    machine = header["machine"]
    axes.set_title(
        f"{header['model']} {header['dtype']} ({header['runtime']}), {header['proposer']}, "
        f"{machine.get('cpu', '')}, {machine.get('torch_threads', '?')} threads", fontsize=8,
    )
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
