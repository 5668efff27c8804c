"""From run records to `summary.json` and `report.md`.

Speedup is paired, as the runs are interleaved: for a prompt and a repeat, a method's
end-to-end tokens/s over verispec-plain's on the same prompt in the same repeat (equal to the
wall-time ratio whenever the outputs are equal, as greedy decoding requires); a prompt's
speedup is the median over repeats, and a category reports the median and interquartile range
across its prompts, like the Spec-Bench leaderboard. tau (tokens per round, Spec-Bench's mean
accepted length) is all new tokens over all target forwards after the prompt.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence

from verispec.bench.methods import PLAIN, Method, is_plain
from verispec.cost import FixedCosts, expected_tokens_by_k, predicted_speedup
from verispec.stats import Stats

OVERALL = "overall"


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3); a single value is all three."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def group_summary(
    records: Sequence[dict], plain: dict[tuple[str, int], dict], fastest: dict[tuple[str, int], float] | None = None
) -> dict:
    """The numbers of one method over one group of prompts.

    plain: (prompt_id, repeat) -> verispec-plain's record, the pair for each speedup.
    fastest: (prompt_id, repeat) -> the fastest plain decoding's tokens/s among the formats run
    (`fastest_plain`), the pair for each speedup over the fastest plain format; None where only
    the bench's own format decoded plainly.
    """
    by_prompt: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_prompt[r["prompt_id"]].append(r)
    speedups, over_fastest, rates = [], [], []
    for prompt_id, runs in by_prompt.items():
        speedups.append(statistics.median(
            r["tokens_per_second"] / plain[prompt_id, r["repeat"]]["tokens_per_second"] for r in runs
        ))
        if fastest is not None:
            over_fastest.append(statistics.median(r["tokens_per_second"] / fastest[prompt_id, r["repeat"]] for r in runs))
        rates.append(statistics.median(r["tokens_per_second"] for r in runs))
    q1, median, q3 = quartiles(speedups)
    fastest_q1, fastest_median, fastest_q3 = quartiles(over_fastest) if over_fastest else (None, None, None)
    rate_q1, rate, rate_q3 = quartiles(rates)
    engines = [r["engine"] for r in records if r["engine"] is not None]
    drafted = sum(e["drafted"] for e in engines)
    decode = [r["decode_tokens_per_second"] for r in records if r["decode_tokens_per_second"] is not None]
    return {
        "prompts": len(by_prompt),
        "runs": len(records),
        "speedup_median": median,
        "speedup_q1": q1,
        "speedup_q3": q3,
        "over_fastest_plain_median": fastest_median,
        "over_fastest_plain_q1": fastest_q1,
        "over_fastest_plain_q3": fastest_q3,
        "tokens_per_second_median": rate,
        "tokens_per_second_q1": rate_q1,
        "tokens_per_second_q3": rate_q3,
        "tokens_per_round": sum(r["new_tokens"] for r in records) / max(1, sum(r["rounds"] for r in records)),
        "acceptance_rate": sum(e["accepted"] for e in engines) / drafted if drafted else None,
        "wall_seconds_median": statistics.median(r["wall_seconds"] for r in records),
        "first_token_seconds_median": statistics.median(r["first_token_seconds"] for r in records),
        "decode_tokens_per_second_median": statistics.median(decode) if decode else None,
        "draft_seconds_total": sum(e["draft_seconds"] for e in engines) if engines else None,
        "target_seconds_total": sum(e["target_seconds"] for e in engines) if engines else None,
        "overhead_seconds_total": sum(e["overhead_seconds"] for e in engines) if engines else None,
        "new_tokens_total": sum(r["new_tokens"] for r in records),
        "matching_runs": (
            None if any(r["matches_plain"] is None for r in records) else sum(r["matches_plain"] for r in records)
        ),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in records),
        "plans": dict(sum((Counter(e.get("plans", {})) for e in engines), Counter()).most_common()),
        "by_source": by_source([e.get("by_source", {}) for e in engines]),
        "position_acceptance": position_acceptance(engines),
        "cost_model": cost_model(engines, [plain[r["prompt_id"], r["repeat"]]["engine"] for r in records]),
    }


def position_counts(engines: Sequence[dict]) -> tuple[list[int], list[int]]:
    """The runs' `Stats.position_attempts` and `position_accepts`, summed position by position."""
    longest = max((len(e["position_attempts"]) for e in engines), default=0)
    attempts, accepts = [0] * longest, [0] * longest
    for e in engines:
        for i, (tried, taken) in enumerate(zip(e["position_attempts"], e["position_accepts"])):
            attempts[i] += tried
            accepts[i] += taken
    return attempts, accepts


def position_acceptance(engines: Sequence[dict]) -> list[float] | None:
    """Acceptance by position over the runs: [i] = of the rounds whose draft reached position
    i + 1 with the first i accepted, the share that accepted it too; None where nothing was
    drafted."""
    attempts, accepts = position_counts(engines)
    rates = [taken / tried for tried, taken in zip(attempts, accepts) if tried]
    return rates or None


def cost_model(engines: Sequence[dict], plain_engines: Sequence[dict | None]) -> dict | None:
    """What the cost model predicts for these runs (`cost.predicted_speedup`) from what they
    measured themselves, to set beside the measured speedup.

    t(1): verispec-plain's seconds per forward (each of its rounds scores one position) on the
    same prompts and repeats. c: the runs' draft seconds per drafted token / t(1) (a draft model's
    first round reads the whole prompt, so over short outputs c includes its prefill). v(n): the
    mean seconds of their rounds that scored n positions / t(1) (`v`, by n); an n no round
    scored gets v(1) = 1 or the line between its measured neighbours, which the prediction
    never reads. survival: the product of the acceptance by position. The model leaves out
    prefill and the engine's verify and commit time, which the measured end-to-end speedup
    includes. None for runs that drafted nothing, drafted trees (the chain formula does not
    cost them) or kept no engine counters (HF, llama.cpp), or without plain's counters.
    """
    if not engines or any(e is None for e in plain_engines) or any(e["tree_rounds"] for e in engines):
        return None
    drafted = [k for e in engines for k in e["drafted_per_round"]]
    if not sum(drafted):
        return None
    step = sum(e["target_seconds"] for e in plain_engines) / sum(e["rounds"] for e in plain_engines)
    seconds: dict[int, list[float]] = defaultdict(list)
    for e in engines:
        for k, spent in zip(e["drafted_per_round"], e["target_seconds_per_round"]):
            seconds[k + 1].append(spent)
    v = {n: statistics.fmean(spent) / step for n, spent in sorted(seconds.items())}
    c = sum(e["draft_seconds"] for e in engines) / sum(drafted) / step
    attempts, accepts = position_counts(engines)
    stats = Stats(drafted=drafted, position_attempts=attempts, position_accepts=accepts)
    return {
        "step_seconds": step,
        "c": c,
        "v": v,
        "expected_tokens_per_round": predicted_tokens(stats),
        "predicted_speedup": predicted_speedup(stats, FixedCosts(c, v_curve(v, max(drafted) + 1))),
    }


def predicted_tokens(stats: Stats) -> float:
    """The tokens per round the runs' survival predicts for their rounds' k, on average
    (positions no round reached count as rejected, as in `cost.predicted_speedup`)."""
    survival = stats.survival()
    expected = expected_tokens_by_k(survival + [0.0] * (max(stats.drafted) - len(survival)))
    return statistics.fmean(expected[k] for k in stats.drafted)


def v_curve(measured: dict[int, float], positions: int) -> list[float]:
    """v(n) for n = 1..positions: the measured values, v(1) = 1 where unmeasured, and any other
    unmeasured n on the line between its measured neighbours."""
    known = {1: 1.0} | measured
    points = sorted(known.items())
    curve = []
    for n in range(1, positions + 1):
        if n in known:
            curve.append(known[n])
            continue
        (low, v_low), (high, v_high) = max(p for p in points if p[0] < n), min(p for p in points if p[0] > n)
        curve.append(v_low + (v_high - v_low) * (n - low) / (high - low))
    return curve


def by_source(parts: Sequence[dict]) -> dict:
    """The per-source counters of runs (`Stats.as_dict()["by_source"]`), summed: rounds, new
    tokens, drafted and accepted, and plans."""
    total: dict[str, dict] = {}
    for part in parts:
        for name, counts in part.items():
            into = total.setdefault(name, {"rounds": 0, "new_tokens": 0, "drafted": 0, "accepted": 0, "plans": Counter()})
            for key in ("rounds", "new_tokens", "drafted", "accepted"):
                into[key] += counts[key]
            into["plans"] += Counter(counts["plans"])
    return {name: {**counts, "plans": dict(counts["plans"].most_common())} for name, counts in sorted(total.items())}


def summarize(records: Sequence[dict], methods: Sequence[Method], header: dict) -> dict:
    """summary.json: the header, each method's numbers per category and overall, mismatches.

    mismatches: runs of the target itself that differ from plain decoding (exactness failures
    unless diagnosed near ties); peer_differences: runs of a peer runtime that differ, which
    its own arithmetic allows.
    """
    plain = {(r["prompt_id"], r["repeat"]): r for r in records if r["method"] == PLAIN}
    fastest = fastest_plain(records)
    categories = sorted({r["category"] for r in records})
    results = {}
    for method in methods:
        mine = [r for r in records if r["method"] == method.name]
        groups = {c: [r for r in mine if r["category"] == c] for c in categories}
        results[method.name] = {
            **{c: group_summary(rs, plain, fastest) for c, rs in groups.items() if rs},
            OVERALL: group_summary(mine, plain, fastest),
        }
    differences = [
        {k: r[k] for k in ("method", "prompt_id", "category", "repeat")} | r["mismatch"]
        for r in records
        if r["mismatch"] is not None
    ]
    peers = {r["method"]: r["peer"] for r in records if r["peer"] is not None}
    return {
        "header": header,
        "categories": categories,
        "methods": {m.name: {"family": m.family, "proposer": m.proposer, "policy": m.policy,
                             "hf_mode": m.hf_mode, "hf_arg": m.hf_arg, "k": m.k, "peer": peers.get(m.name)}
                    for m in methods},
        "results": results,
        "mismatches": [d for d in differences if d["peer"] is None],
        "peer_differences": [d for d in differences if d["peer"] is not None],
    }


def fastest_plain(records: Sequence[dict]) -> dict[tuple[str, int], float] | None:
    """(prompt_id, repeat) -> the highest tokens/s of plain decoding among the formats run
    (verispec-plain and each `verispec-plain@FORMAT`); None where no other format was run.

        >>> runs = [{"method": m, "prompt_id": "a", "repeat": 0, "tokens_per_second": s}
        ...         for m, s in [("verispec-plain", 50.0), ("verispec-plain@q4", 60.0), ("verispec-lookup-k4", 80.0)]]
        >>> fastest_plain(runs)
        {('a', 0): 60.0}
    """
    plains = [r for r in records if is_plain(r["method"])]
    if all(r["method"] == PLAIN for r in plains):
        return None
    fastest: dict[tuple[str, int], float] = {}
    for r in plains:
        key = (r["prompt_id"], r["repeat"])
        fastest[key] = max(fastest.get(key, 0.0), r["tokens_per_second"])
    return fastest


def speedup_cell(group: dict) -> str:
    return (
        f"{group['speedup_median']:.2f}x ({group['speedup_q1']:.2f}-{group['speedup_q3']:.2f})"
        f" · tau {group['tokens_per_round']:.2f}"
    )


def fastest_plain_section(summary: dict) -> list[str]:
    """Each method's speedup over the fastest plain format run (`fastest_plain`), by category;
    nothing where only the bench's own format decoded plainly."""
    results, names = summary["results"], list(summary["methods"])
    if results[PLAIN][OVERALL]["over_fastest_plain_median"] is None:
        return []
    groups = [*summary["categories"], OVERALL]
    return [
        "",
        "## Speedup over the fastest plain format",
        "",
        "End-to-end tokens/s of each method over the fastest plain decoding among the formats run "
        f"({', '.join(n for n in names if is_plain(n))}) on the same prompt in the same repeat; median "
        "(interquartile range) across prompts. Against plain decoding in the bench's own format alone, a "
        "format chosen for speculative decoding would be credited with a slower baseline than another format "
        "decodes at.",
        "",
        *table(["category", *names],
               [[g, *(fastest_cell(results[n][g]) if g in results[n] else "-" for n in names)] for g in groups]),
    ]


def fastest_cell(group: dict) -> str:
    return (f"{group['over_fastest_plain_median']:.2f}x ({group['over_fastest_plain_q1']:.2f}-"
            f"{group['over_fastest_plain_q3']:.2f})")


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def sampling_text(sampling: dict, seed: int) -> str:
    """'greedy decoding' or 'sampled: temperature 0.7, top-p 0.9 (seed 0)'."""
    if sampling["temperature"] == 0:
        return "greedy decoding"
    filters = [f"{name.replace('_', '-')} {sampling[name]:g}" for name in ("top_k", "top_p", "min_p")
               if sampling[name] is not None]
    temperature = f"temperature {sampling['temperature']:g}"
    return f"sampled: {', '.join([temperature, *filters])} (seed {seed})"


def identity_section(summary: dict, others: Sequence[str]) -> list[str]:
    """Greedy decoding: every method's output against verispec-plain's, token for token."""
    results = summary["results"]
    lines = ["", "## Greedy identity with verispec-plain", ""]
    lines += table(
        ["method", "runs equal to plain"],
        [[n, f"{results[n][OVERALL]['matching_runs']}/{results[n][OVERALL]['runs']}"
             + (" (a peer: not required to be equal)" if summary["methods"][n]["peer"] else "")]
         for n in others],
    )
    sections = [
        ("mismatches", "Mismatches (first differing position; target top-2 logit margin there, fresh forward):"),
        ("peer_differences", "Differences of peer runtimes, which compute the model differently (not exactness "
                             "failures; first differing position, the target's margin there):"),
    ]
    for key, title in sections:
        if summary[key]:
            lines += ["", title, ""]
            lines += [
                f"- {m['method']} on {m['category']}/{m['prompt_id']} (repeat {m['repeat']}): position "
                f"{m['position']}, plain {m['expected']} vs {m['got']}; {m['diagnosis']}"
                for m in summary[key]
            ]
    return lines


def sampled_section(summary: dict, names: Sequence[str]) -> list[str]:
    """Sampled decoding: outputs differ from plain decoding's by design, so acceptance and
    tokens per round stand where identity would."""
    results = summary["results"]
    lines = [
        "",
        "## Acceptance and tokens per round (sampled)",
        "",
        "At temperature > 0 a speculative output is not expected to equal plain decoding's token "
        "for token: only its distribution is. Exactness at temperature > 0 is established by the "
        "exhaustive audit (`verispec audit`: every random branch of the engine against the target's "
        "exact law on rational tables) and the statistical test (`tests/test_statistical.py`), not "
        "by this benchmark. Acceptance: accepted / drafted tokens (verispec methods); tau: new "
        "tokens per target forward.",
        "",
    ]
    lines += table(
        ["method", "acceptance", "tau", "runs"],
        [[n, fmt(o["acceptance_rate"], ".2f"), fmt(o["tokens_per_round"], ".2f"), str(o["runs"])]
         for n in names for o in [results[n][OVERALL]]],
    )
    return lines


def cost_model_section(summary: dict, names: Sequence[str]) -> list[str]:
    """Acceptance by position and the cost model's predicted speedup beside the measured one,
    for each method whose runs it can cost (`cost_model`)."""
    rows = []
    for name in names:
        overall = summary["results"][name][OVERALL]
        model = overall.get("cost_model")
        if model is None:
            continue
        v = ", ".join(f"v({n}) {value:.2f}" for n, value in model["v"].items())
        rows.append([
            name, " ".join(f"{rate:.2f}" for rate in overall["position_acceptance"] or []), f"{model['c']:.3f}", v,
            f"{model['expected_tokens_per_round']:.2f}", f"{overall['tokens_per_round']:.2f}",
            f"{model['predicted_speedup']:.2f}x", f"{overall['speedup_median']:.2f}x",
        ])
    if not rows:
        return []
    lines = [
        "",
        "## The cost model against the measurement (all prompts)",
        "",
        "Acceptance by position i: of the rounds whose draft reached position i with the first i - 1 "
        "accepted, the share that accepted it too. Predicted: `cost.predicted_speedup` from these runs' "
        "own survival (the product of those rates), c (draft seconds per drafted token) and v(n) (the mean "
        "seconds of a forward over n positions), both over verispec-plain's seconds per forward in the same "
        "runs (a draft model's c includes its own read of the prompt in the first round); tau predicted is the "
        "tokens per round that survival gives. The model leaves out the target's prefill and the "
        "engine's verify and commit time, which the measured end-to-end speedup (the median over prompts) "
        "includes.",
        "",
    ]
    return lines + table(
        ["method", "acceptance by position", "c", "v(n) measured", "tau predicted", "tau measured",
         "predicted speedup", "measured speedup"],
        rows,
    )


def plans_section(summary: dict, names: Sequence[str]) -> list[str]:
    """What the speculative methods' policies chose per round (k, tree shape or a plain step),
    over all prompts: the three most frequent plans with their share of rounds; for a proposer
    with several sources (`lookup+eagle`), each source's rounds, tau and plans below it."""
    def top(plans: dict) -> str:
        total = sum(plans.values())
        return ", ".join(f"{plan} {count / total:.0%}" for plan, count in list(plans.items())[:3])

    rows = []
    for name in names:
        overall = summary["results"][name][OVERALL]
        plans = overall.get("plans") or {}
        if sum(plans.values()) and set(plans) != {"plain step"}:
            rows.append([name, str(sum(plans.values())), "-", top(plans)])
            for source, part in (overall.get("by_source") or {}).items():
                tau = part["new_tokens"] / part["rounds"] if part["rounds"] else 0.0
                rows.append([f"{name}: {source} rounds", str(part["rounds"]), f"{tau:.2f}", top(part["plans"])])
    if not rows:
        return []
    lines = ["", "## Plans chosen per round (all prompts)", ""]
    return lines + table(["method", "rounds", "tau", "most frequent plans (share of rounds)"], rows)


def header_lines(h: dict) -> list[str]:
    """The title and what was measured, on what and how: the top of every report.md."""
    return [
        "# verispec bench",
        "",
        f"- Machine: {h['cpu']} (native bf16: {'yes' if h['native_bf16'] else 'no'}), "
        f"{h['logical_cpus']} logical CPUs, {h['torch_threads']} torch threads; {h['platform']}",
        f"- Software: Python {h['python']}, torch {h['torch']}, transformers {h['transformers']}, "
        f"verispec {h['verispec']}",
        f"- Model: {h['model']} ({h['dtype']}, runtime {h.get('runtime', 'hf')}); "
        f"{sampling_text(h['sampling'], h['seed'])}; "
        f"{h['max_new_tokens']} new tokens at most; "
        f"{h['prompts']} prompts; {h['repeats']} repeat(s) after {h['warmup']} warm-up run(s) per method",
        f"- Command: `{h['command']}`",
        "",
    ]


def render(summary: dict, plots: Sequence[str]) -> str:
    """report.md."""
    h = summary["header"]
    results = summary["results"]
    names = list(summary["methods"])
    others = [n for n in names if n != PLAIN]
    groups = [*summary["categories"], OVERALL]
    greedy = h["sampling"]["temperature"] == 0
    lines = [
        *header_lines(h),
        "## Speedup over verispec-plain",
        "",
        "End-to-end tokens/s of each method over verispec-plain's on the same prompt in the same "
        "repeat; median (interquartile range) across prompts; tau = new tokens per target forward "
        "(Spec-Bench's mean accepted length).",
        "",
    ]
    lines += table(
        ["category", f"{PLAIN} tok/s", *others],
        [
            [g, fmt(results[PLAIN][g]["tokens_per_second_median"], ".1f"),
             *(speedup_cell(results[n][g]) if g in results[n] else "-" for n in others)]
            for g in groups
        ],
    )
    lines += fastest_plain_section(summary)
    lines += [
        "",
        "## End-to-end tokens per second (median across prompts)",
        "",
    ]
    lines += table(
        ["category", *names],
        [[g, *(fmt(results[n][g]["tokens_per_second_median"], ".1f") if g in results[n] else "-" for n in names)]
         for g in groups],
    )
    lines += [
        "",
        "## Where the time goes (all prompts)",
        "",
        "First-token seconds: from the call to the first emitted token(s) (prefill and the first "
        "round). Decode tok/s: the tokens after those over the time after them. Draft / target / "
        "overhead: the verispec engine's own split, summed over runs (HF does not expose it). Peak "
        "RSS: the whole process's peak so far (all methods share one process and one model).",
        "",
    ]
    lines += table(
        ["method", "wall s", "first-token s", "decode tok/s", "tau", "acceptance", "draft s", "target s",
         "overhead s", "peak RSS MiB"],
        [
            [n, fmt(o["wall_seconds_median"]), fmt(o["first_token_seconds_median"]),
             fmt(o["decode_tokens_per_second_median"], ".1f"), fmt(o["tokens_per_round"], ".2f"),
             fmt(o["acceptance_rate"], ".2f"), fmt(o["draft_seconds_total"], ".2f"),
             fmt(o["target_seconds_total"], ".2f"), fmt(o["overhead_seconds_total"], ".2f"),
             fmt(o["peak_rss_mb"], ".0f")]
            for n in names
            for o in [results[n][OVERALL]]
        ],
    )
    lines += cost_model_section(summary, others)
    lines += plans_section(summary, others)
    lines += identity_section(summary, others) if greedy else sampled_section(summary, names)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    lines += [
        "",
        "## How it was measured",
        "",
        "Every method runs on the same model object, dtype and torch thread count. After the "
        "warm-up, each prompt is run by every method in turn, the order rotated by one per prompt "
        "and per repeat. One clock measures every method the same way: wall time from the call to "
        "the return, and token arrivals (the verispec engine's iterator; an HF streamer). The HF "
        "methods get a GenerationConfig with the same sampling transforms (do_sample exactly when "
        "the temperature is above 0) and the same single EOS id as verispec, pad = EOS, "
        "no length or repetition processors and an all-ones attention mask; otherwise HF's own "
        "defaults (hf-lookup: 10 tokens, n-grams up to 2; hf-early-exit and hf-assisted without "
        "-kN: HF's assistant schedule)." + (
            " The llamacpp methods run llama-cpp-python on the GGUF file the target was loaded from, with "
            "the same prompt ids, thread count, budget and EOS id, greedy (temperature 0, no penalties), "
            "each request from an empty cache; llama.cpp computes with the file's quantized blocks, so it "
            "is a peer whose output may differ."
            if any(m["family"] == "llamacpp" for m in summary["methods"].values()) else ""
        ) + " Raw runs: runs.jsonl; numbers: summary.json.",
        "",
    ]
    return "\n".join(lines)
