"""From a concurrency sweep's records to `summary.json` and `report.md`.

Per method and level c: the aggregate output tokens/s of its closed loops (median over
repeats, with the lowest and highest), the same over verispec-plain's at the same c and repeat
(paired, as the loops are interleaved), each request's time to first token and time per output
token (p50, p90, p99 over every request of every repeat), acceptance (accepted / drafted),
tokens per round (new tokens / target forwards), the k chosen (drafted tokens per round),
memory, and how many requests equal verispec-plain's output at c = 1.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from verispec.bench.methods import PLAIN, Method
from verispec.bench.report import fmt, header_lines, table

PERCENTILES = (50, 90, 99)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """{'p50': .., 'p90': .., 'p99': ..}, linear between order statistics (None: no values)."""
    if not values:
        return {f"p{q}": None for q in PERCENTILES}
    return {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def cell(requests: Sequence[dict], loops: Sequence[dict], plain_loops: dict[int, dict], kv_per_token: int | None,
         longest: int, concurrency: int) -> dict:
    """One method at one level."""
    rounds = sum(r["rounds"] for r in requests)
    drafted = sum(r["drafted"] for r in requests)
    compared = [r["matches_plain"] for r in requests if r["matches_plain"] is not None]
    return {
        "mode": loops[0]["mode"],
        "loops": len(loops),
        "requests": len(requests),
        "most_in_flight": max(loop["most_in_flight"] for loop in loops),
        "tokens_per_second": spread([loop["tokens_per_second"] for loop in loops]),
        "over_plain": spread([loop["tokens_per_second"] / plain_loops[loop["repeat"]]["tokens_per_second"]
                              for loop in loops]),
        "ttft_seconds": percentiles([r["ttft_seconds"] for r in requests]),
        "tpot_seconds": percentiles([r["tpot_seconds"] for r in requests if r["tpot_seconds"] is not None]),
        "acceptance_rate": sum(r["accepted"] for r in requests) / drafted if drafted else None,
        "tokens_per_round": sum(r["new_tokens"] for r in requests) / rounds if rounds else None,
        "drafted_per_round": drafted / rounds if rounds else None,
        "peak_rss_mb": max(loop["peak_rss_mb"] for loop in loops),
        "kv_bytes_per_token": kv_per_token,
        "kv_bytes_per_slot": kv_per_token * longest if kv_per_token is not None else None,
        "kv_bytes_in_flight": kv_per_token * longest * concurrency if kv_per_token is not None else None,
        "matching_requests": sum(compared) if compared else None,
        "compared_requests": len(compared),
    }


def crossover(results: dict, name: str, levels: Sequence[int], batch_costs: dict | None) -> dict:
    """Where `name` stops beating verispec-plain: the first level whose median ratio is below
    1 (None: at no level), with the rows a step scores there, n = c (1 + drafted per round),
    against plain's n = c, and v at both when the batched forward's cost was measured."""
    at = next((c for c in levels if results[name][str(c)]["over_plain"]["median"] < 1.0), None)
    found = {"concurrency": at, "ratio": None, "rows": None, "v_rows": None, "plain_rows": None, "v_plain_rows": None}
    if at is None:
        return found
    here = results[name][str(at)]
    rows = at * (1 + (here["drafted_per_round"] or 0.0))
    found.update(ratio=here["over_plain"]["median"], rows=rows, plain_rows=at)
    if batch_costs is not None:
        v = lambda n: float(np.interp(n, batch_costs["rows"], batch_costs["v"]))  # noqa: E731
        found.update(v_rows=v(rows), v_plain_rows=v(at))
    return found


def summarize_sweep(
    requests: Sequence[dict],
    loops: Sequence[dict],
    methods: Sequence[Method],
    levels: Sequence[int],
    header: dict,
    kv_per_token: dict[str, int | None],
) -> dict:
    """summary.json of a sweep: the header, results[method][str(c)] (`cell`), each non-plain
    method's crossover, mismatches (verispec's own outputs that differ from plain decoding's
    at c = 1) and peer_differences (a peer's, which its arithmetic allows)."""
    longest = header["longest_request_tokens"]
    results = {}
    for method in methods:
        results[method.name] = {}
        for c in levels:
            plain_loops = {loop["repeat"]: loop for loop in loops if loop["method"] == PLAIN and loop["concurrency"] == c}
            results[method.name][str(c)] = cell(
                [r for r in requests if r["method"] == method.name and r["concurrency"] == c],
                [loop for loop in loops if loop["method"] == method.name and loop["concurrency"] == c],
                plain_loops, kv_per_token[method.name], longest, c,
            )
    differences = [
        {k: r[k] for k in ("method", "concurrency", "prompt_id", "category", "repeat")} | r["mismatch"]
        for r in requests if r["mismatch"] is not None
    ]
    return {
        "header": header,
        "levels": list(levels),
        "methods": {m.name: {"family": m.family, "proposer": m.proposer, "policy": m.policy, "hf_mode": m.hf_mode,
                             "k": m.k, "speculative": m.speculative} for m in methods},
        "results": results,
        "crossover": {m.name: crossover(results, m.name, levels, header.get("batch_costs"))
                      for m in methods if m.speculative and m.family == "verispec"},
        "mismatches": [d for d in differences if d["peer"] is None],
        "peer_differences": [d for d in differences if d["peer"] is not None],
    }


def ms(value: float | None) -> str:
    return fmt(value * 1000 if value is not None else None, ".1f")


def mib(value: int | None) -> str:
    return fmt(value / 2**20 if value is not None else None, ".2f")


def render_sweep(summary: dict, plots: Sequence[str]) -> str:
    """report.md of a sweep."""
    h, results, levels = summary["header"], summary["results"], summary["levels"]
    names = list(summary["methods"])
    others = [n for n in names if n != PLAIN]
    c_head = [f"c = {c}" for c in levels]
    lines = header_lines(h) + [
        f"- Concurrency: {', '.join(str(c) for c in levels)}; each level a closed loop over every prompt once per "
        "repeat (whole batches where the mode says so)",
        "",
        "## Aggregate output tokens per second",
        "",
        "All new tokens of a closed loop over its wall time; median over repeats (lowest-highest).",
        "",
    ]
    lines += table(["method", "mode", *c_head], [
        [n, results[n][str(levels[-1])]["mode"],
         *(f"{t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f})" for c in levels
           for t in [results[n][str(c)]["tokens_per_second"]])]
        for n in names
    ])
    if others:
        lines += ["", f"## Over {PLAIN} at the same concurrency", "",
                  f"Each loop's tokens/s over {PLAIN}'s in the same repeat; median (lowest-highest).", ""]
        lines += table(["method", *c_head], [
            [n, *(f"{t['median']:.2f}x ({t['min']:.2f}-{t['max']:.2f})" for c in levels
                  for t in [results[n][str(c)]["over_plain"]])]
            for n in others
        ])
    lines += crossover_lines(summary)
    lines += ["", "## Latency per request", "",
              "TTFT: submission to the first token (prefill and the first round; in whole batches the batch's "
              "prefill). TPOT: the request's time after its first token over its tokens after the first. "
              "Milliseconds, over every request of every repeat.", ""]
    lines += table(
        ["method", "c", "TTFT p50", "p90", "p99", "TPOT p50", "p90", "p99", "requests", "most in flight"],
        [[n, str(c), *(ms(x[f"p{q}"]) for x in (o["ttft_seconds"], o["tpot_seconds"]) for q in (50, 90, 99)),
          str(o["requests"]), str(o["most_in_flight"])]
         for n in names for c in levels for o in [results[n][str(c)]]],
    )
    lines += ["", "## Acceptance, tokens per round and the k chosen", "",
              "Acceptance: accepted / drafted tokens. Tau: new tokens per target forward. k: drafted tokens per "
              "round (what the policy chose, after the batch's plan).", ""]
    lines += table(
        ["method", *(f"{c_h}: acceptance / tau / k" for c_h in c_head)],
        [[n, *(f"{fmt(o['acceptance_rate'], '.2f')} / {fmt(o['tokens_per_round'], '.2f')} / "
               f"{fmt(o['drafted_per_round'], '.2f')}" for c in levels for o in [results[n][str(c)]])]
         for n in names if summary["methods"][n]["speculative"]],
    )
    lines += ["", "## Memory", "",
              f"Target weights as held: {mib(h.get('weights_bytes'))} MiB. KV per slot: one request of the longest "
              f"prompt and the whole budget ({h['longest_request_tokens']} positions); in flight: c such slots. "
              "Peak RSS: the process's high-water mark after the method's loops at that level (every method "
              "shares the process, so it only grows).", ""]
    lines += table(
        ["method", "KV bytes/token", "KV MiB/slot", *(f"{c_h}: KV MiB in flight / peak RSS MiB" for c_h in c_head)],
        [[n, fmt(first["kv_bytes_per_token"], "d") if first["kv_bytes_per_token"] is not None else "-",
          mib(first["kv_bytes_per_slot"]),
          *(f"{mib(o['kv_bytes_in_flight'])} / {o['peak_rss_mb']:.0f}" for c in levels for o in [results[n][str(c)]])]
         for n in names for first in [results[n][str(levels[0])]]],
    )
    lines += identity_lines(summary)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    lines += [
        "",
        "## How it was measured",
        "",
        "At each level c, every method first serves the first c prompts (warm-up, dropped), then, per repeat, "
        "the whole workload in a closed loop of c: c requests in flight, each finished request replaced by the "
        "next prompt, every prompt once. Methods run one after another within a level, the order rotated by one "
        "per repeat and per level. verispec methods run the continuous-batching scheduler "
        "(`verispec.batching.Scheduler`, one target forward per step over every request's rows; an auto k is "
        "planned per batch from the measured v(n)). llamacpp-plain decodes several sequences at once through "
        "llama-cpp-python's batch API (one `llama_decode` per step, one sequence id per request, a finished "
        "sequence's cache cells removed and its id given to the next prompt: continuous, as llama.cpp's server "
        "does with parallel slots), greedy, on the GGUF file the target was loaded from. hf-generate decodes "
        "left-padded whole batches: HF cannot add a request to a batch in progress, so c prompts start together "
        "and the next c start when the slowest has finished. Raw requests: runs.jsonl; loops: loops.jsonl; "
        "numbers: summary.json.",
        "",
    ]
    return "\n".join(lines)


def crossover_lines(summary: dict) -> list[str]:
    """Where speculation stops paying, per speculative verispec method, and v(n) there."""
    if not summary["crossover"]:
        return []
    lines = ["", "## Where speculation stops paying", ""]
    for name, x in summary["crossover"].items():
        if x["concurrency"] is None:
            lines.append(f"- {name}: at or above {PLAIN} (median) at every level measured.")
            continue
        text = (f"- {name}: below {PLAIN} from c = {x['concurrency']} ({x['ratio']:.2f}x); a step there scores "
                f"{x['rows']:.1f} rows against plain's {x['plain_rows']}")
        if x["v_rows"] is not None:
            text += f", v({x['rows']:.1f}) = {x['v_rows']:.2f} against v({x['plain_rows']}) = {x['v_plain_rows']:.2f}"
        lines.append(text + ".")
    return lines


def identity_lines(summary: dict) -> list[str]:
    """Greedy: every request against verispec-plain's output for its prompt at c = 1."""
    results, levels = summary["results"], summary["levels"]
    if all(results[n][str(c)]["compared_requests"] == 0 for n in results for c in levels):
        return ["", "## Outputs", "", "Sampled decoding: outputs are not compared with plain decoding's "
                "(exactness at temperature > 0 is the audit's and the statistical test's)."]
    lines = ["", f"## Greedy identity with {PLAIN} at c = 1", "",
             "Requests whose output equals verispec-plain's for the same prompt decoded alone; a peer "
             "(llama.cpp, HF on a padded batch) computes differently and need not be equal.", ""]
    lines += table(["method", *(f"c = {c}" for c in levels)], [
        [n, *(f"{o['matching_requests']}/{o['compared_requests']}" for c in levels for o in [results[n][str(c)]])]
        for n in results
    ])
    for key, title in (("mismatches", "Mismatches (first differing position; the target's top-2 margin there):"),
                       ("peer_differences", "Differences of peers (their arithmetic, not exactness failures):")):
        if summary[key]:
            lines += ["", title, ""]
            lines += [f"- {m['method']} at c = {m['concurrency']} on {m['category']}/{m['prompt_id']} (repeat "
                      f"{m['repeat']}): position {m['position']}, plain {m['expected']} vs {m['got']}; {m['diagnosis']}"
                      for m in summary[key][:20]]
            if len(summary[key]) > 20:
                lines.append(f"- ... and {len(summary[key]) - 20} more (summary.json)")
    return lines
