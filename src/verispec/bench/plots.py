"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed).

speedup_by_category.png: each method's median speedup over verispec-plain per category, with
    the interquartile range as error bars; one horizontal bar group per category.
accepted_length.png: the distribution of tokens emitted per target forward, per speculative
    method (1 = nothing accepted).
speedup_vs_k.png: overall speedup against the fixed k, one line per proposer, drawn only when
    a proposer was run with at least two fixed k.

A concurrency sweep (`sweep`) draws instead:
throughput_vs_concurrency.png: aggregate output tokens/s against the concurrency, per method.
speedup_vs_concurrency.png: each method's tokens/s over verispec-plain's at the same
    concurrency; a speculative line crossing 1 is where speculation stops paying.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen before pyplot loads)

from verispec.bench.methods import PLAIN, Method  # noqa: E402
from verispec.bench.report import OVERALL  # noqa: E402


def colours(n: int) -> list:
    """n distinct colours: tab10 while it lasts, tab20 beyond (tab10 repeats after 10)."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def speedup_by_category(summary: dict, path: Path) -> None:
    """One horizontal bar group per category (overall last, below a rule), one bar per method:
    legible at README width (~900 px) for any number of categories, which only add height."""
    names = [n for n in summary["methods"] if n != PLAIN]
    groups = [*summary["categories"], OVERALL]
    bar = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(7.5, 1.4 + len(groups) * (0.2 + 0.095 * len(names))), layout="constrained")
    for i, (name, colour) in enumerate(zip(names, colours(len(names)))):
        cells = [summary["results"][name].get(g) for g in groups]
        ys = [j + (i - (len(names) - 1) / 2) * bar for j, c in enumerate(cells) if c]
        medians = [c["speedup_median"] for c in cells if c]
        errors = [[c["speedup_median"] - c["speedup_q1"] for c in cells if c],
                  [c["speedup_q3"] - c["speedup_median"] for c in cells if c]]
        ax.barh(ys, medians, bar, xerr=errors, capsize=1.5, error_kw={"linewidth": 0.8}, label=name, color=colour)
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.axhline(len(groups) - 1.5, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(groups)), groups, fontsize=10)
    ax.get_yticklabels()[-1].set_fontweight("bold")
    ax.set_ylim(len(groups) - 0.5, -0.5)  # first category on top, overall at the bottom
    ax.set_xlabel(f"speedup over {PLAIN} (median across prompts, bars: interquartile range)", fontsize=10)
    ax.grid(axis="x", linewidth=0.4, alpha=0.5)
    ax.set_axisbelow(True)
    fig.legend(loc="outside upper center", ncol=2, fontsize=9, frameon=False)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def accepted_length(records: Sequence[dict], methods: Sequence[Method], path: Path) -> None:
    speculative = [m.name for m in methods if m.speculative]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(1, len(speculative))
    for i, (name, colour) in enumerate(zip(speculative, colours(len(speculative)))):
        counts = Counter(n for r in records if r["method"] == name for n in r["tokens_per_round"])
        total = sum(counts.values()) or 1
        lengths = sorted(counts)
        ax.bar([n + (i - (len(speculative) - 1) / 2) * width for n in lengths],
               [counts[n] / total for n in lengths], width, label=name, color=colour)
    ax.set_xlabel("tokens emitted per target forward (accepted + 1)")
    ax.set_ylabel("fraction of rounds")
    if speculative:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def k_sweeps(methods: Sequence[Method]) -> dict[str, list[Method]]:
    """Proposer label -> its fixed-k methods sorted by k, for proposers run with >= 2 k."""
    sweeps: dict[str, list[Method]] = defaultdict(list)
    for m in methods:
        if m.k is not None:
            label = f"hf {m.hf_mode} {m.hf_arg or ''}".strip() if m.family == "hf" else f"{m.family} {m.proposer}"
            sweeps[label].append(m)
    return {label: sorted(ms, key=lambda m: m.k) for label, ms in sweeps.items() if len({m.k for m in ms}) >= 2}


def speedup_vs_k(summary: dict, sweeps: dict[str, list[Method]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, ms in sweeps.items():
        cells = [summary["results"][m.name][OVERALL] for m in ms]
        ks = [m.k for m in ms]
        ax.errorbar(ks, [c["speedup_median"] for c in cells],
                    yerr=[[c["speedup_median"] - c["speedup_q1"] for c in cells],
                          [c["speedup_q3"] - c["speedup_median"] for c in cells]],
                    marker="o", capsize=3, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("k (drafted tokens per round)")
    ax.set_ylabel(f"overall speedup over {PLAIN} (median, IQR)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


NAMES = ("speedup_by_category.png", "accepted_length.png", "speedup_vs_k.png")


def draw(summary: dict, records: Sequence[dict], methods: Sequence[Method], out: Path) -> list[str]:
    """Write the plots into `out`; their file names (`NAMES`, the last only with a k sweep)."""
    by_category, lengths, by_k = NAMES
    speedup_by_category(summary, out / by_category)
    accepted_length(records, methods, out / lengths)
    sweeps = k_sweeps(methods)
    if not sweeps:
        return [by_category, lengths]
    speedup_vs_k(summary, sweeps, out / by_k)
    return [by_category, lengths, by_k]


SWEEP_NAMES = ("throughput_vs_concurrency.png", "speedup_vs_concurrency.png")


def against_concurrency(summary: dict, names: Sequence[str], key: str, ylabel: str, path: Path, one: bool) -> None:
    """One line per method of results[name][c][key] (median, bars lowest-highest) against the
    concurrency on a log2 axis; one: a dashed line at 1."""
    levels = summary["levels"]
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    for name, colour in zip(names, colours(len(names))):
        cells = [summary["results"][name][str(c)][key] for c in levels]
        ax.errorbar(levels, [t["median"] for t in cells],
                    yerr=[[t["median"] - t["min"] for t in cells], [t["max"] - t["median"] for t in cells]],
                    marker="o", capsize=3, label=name, color=colour)
    if one:
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.grid(linewidth=0.4, alpha=0.5)
    if names:
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def throughput_vs_concurrency(summary: dict, path: Path) -> None:
    """Aggregate output tokens/s against c, one line per method."""
    against_concurrency(summary, list(summary["methods"]), "tokens_per_second",
                        "aggregate output tokens/s (median)", path, one=False)


def speedup_vs_concurrency(summary: dict, path: Path) -> None:
    """Each method's tokens/s over verispec-plain's at the same c (paired per repeat): where a
    speculative method's line crosses 1, speculation stops paying."""
    against_concurrency(summary, [n for n in summary["methods"] if n != PLAIN], "over_plain",
                        f"tokens/s over {PLAIN} (median)", path, one=True)


def draw_sweep(summary: dict, out: Path) -> list[str]:
    """Write a concurrency sweep's plots into `out`; their file names (`SWEEP_NAMES`)."""
    throughput, speedup = SWEEP_NAMES
    throughput_vs_concurrency(summary, out / throughput)
    speedup_vs_concurrency(summary, out / speedup)
    return list(SWEEP_NAMES)
