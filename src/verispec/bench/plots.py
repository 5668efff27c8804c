"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed).

speedup_by_category.png: each method's median speedup over verispec-plain per category, with
    the interquartile range as error bars; one horizontal bar group per category.
accepted_length.png: the distribution of tokens emitted per target forward, per speculative
    method (1 = nothing accepted).
speedup_vs_k.png: overall speedup against the fixed k, one line per proposer, drawn only when
    a proposer was run with at least two fixed k.
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
            label = f"verispec {m.proposer}" if m.family == "verispec" else f"hf {m.hf_mode} {m.hf_arg or ''}".strip()
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
