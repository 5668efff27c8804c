"""`verispec cost`: the speed equation, for one k or every k, from given or measured costs; with
--ranks, the token tree the cost model would choose, against the best chain and plain decoding."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from verispec.cli import app
from verispec.cli.paths import FORCE_HELP, check_input_file, check_output_file
from verispec.k_spec import K_BOUND
from verispec.cost import (
    FixedCosts,
    check_costs,
    context_table,
    expected_tokens_by_k,
    optimal_k,
    speedup_by_k,
    survival_from_alpha,
)
from verispec.profile import Profile
from verispec.tree_policy import (
    TREE_MARGIN,
    Candidate,
    TreeChoice,
    best_of_each_size,
    check_acceptance,
    search,
    tree_costs,
)

PLOT_ALPHAS = (0.3, 0.5, 0.7, 0.8, 0.9)


@app.command()
def cost(
    alpha: float | None = typer.Option(None, help="Per-token acceptance probability, constant and independent."),
    k: int | None = typer.Option(
        None, "--k", min=1, max=K_BOUND, help="Drafted tokens per round; omit for every k up to --k-max."
    ),
    c: float | None = typer.Option(None, "--c", help="One draft step / one target step."),
    v: float | None = typer.Option(
        None, "--v", help="Scoring the k + 1 positions / one target step, for every k (the seed's v; default 1)."
    ),
    profile: Path | None = typer.Option(
        None, help="A profile from `verispec profile --out`: its measured c, v(n) and, if any, survival."
    ),
    k_max: int | None = typer.Option(
        None, min=1, max=K_BOUND, help="Largest k to tabulate.", show_default="the profile's, else 8"
    ),
    context: int | None = typer.Option(
        None, "--context", min=0,
        help="With --profile: its costs after this many tokens of context, from its context axis "
        "(`profile --contexts`; linear between measured lengths), as --k auto reads them there.",
        show_default="the profile's own context",
    ),
    ranks: str | None = typer.Option(
        None,
        help="Explain a token tree: acceptance a(d, r) of the rank-r child at depth d given its parent, "
        "comma-separated ranks, '/' between depths (the last depth repeats deeper), e.g. 0.6,0.2/0.5,0.15. "
        "Trees of up to --k-max nodes.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    plot: Path | None = typer.Option(None, help="Draw the speedup against k for several alphas to this .png file."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Predicted speedup E / (k c + v(k + 1)) over plain decoding, and the best k; with --ranks,
    the best token tree E / (c depth + v(nodes + 1)) against the best chain and plain.

    verispec cost --alpha 0.8 --k 6 --c 0.1 --v 1    # E = 3.951424, speedup ~2.47
    verispec cost --ranks 0.6,0.2 --profile p.json   # the tree the tree policy would draft
    """
    if profile is not None:
        check_input_file(profile, "--profile", "a profile JSON file from `verispec profile --out FILE`")
    if plot is not None:
        check_output_file(plot, "--plot", force, suffix=".png")
    if ranks is not None:
        acceptance = parse_ranks(ranks)
        if alpha is not None or k is not None or plot is not None:
            raise ValueError("--ranks explains a tree of every size up to --k-max; leave out --alpha, --k and --plot")
        if context is not None:
            raise ValueError("--context prices chains along the profile's context axis; leave it out with --ranks")
        costs, measured = _costs(c, v, profile, k_max, k)
        if measured is not None:  # its tree rounds' v(n) when it timed them
            curve = tree_costs(measured).v
            costs = FixedCosts(costs.c, curve[: len(curve) if k_max is None else k_max + 1])
        depths = len(costs.v) - 1
        acceptance += [acceptance[-1]] * (depths - len(acceptance))
        acceptance = acceptance[:depths]
        choice = search(acceptance, costs.c, costs.v)
        _print_tree(choice, best_of_each_size(acceptance, costs.c, costs.v), costs, ranks, as_json)
        return
    costs, source = _costs(c, v, profile, k_max, k, context)
    if alpha is not None:
        survival, acceptance = survival_from_alpha(alpha, len(costs.v) - 1), f"alpha = {alpha:g}"
    elif profile is not None and source.survival is not None:
        survival, acceptance = source.survival, f"survival measured in {profile}"
    else:
        raise ValueError(
            "give --alpha, or a --profile that holds measured survival (`verispec profile` measures "
            "it unless --survival-tokens 0)"
        )
    ratios = speedup_by_k(costs.c, costs.v, survival)
    expected = expected_tokens_by_k(survival[: len(ratios) - 1])
    if k is not None:
        if k >= len(ratios):
            raise ValueError(f"k = {k} needs survival up to s_{k}; the profile measured only {len(ratios) - 1}")
        _print_one(k, expected[k], ratios[k], costs, alpha, as_json)
    else:
        best = optimal_k(costs.c, costs.v, survival=survival)
        _print_all(expected, ratios, best, costs, acceptance, as_json)
    if plot is not None:
        draw(plot, costs, alpha, survival if alpha is None else None)


def _costs(
    c: float | None, v: float | None, profile: Path | None, k_max: int | None, k: int | None, context: int | None = None
) -> tuple[FixedCosts, Profile | None]:
    """c and the curve v(1..K + 1), from the options or from a profile (after `context` tokens:
    from its context axis)."""
    if profile is not None:
        if c is not None or v is not None:
            raise ValueError("give --c and --v, or --profile with measured ones, not both")
        measured = Profile.load(profile)
        top = measured.k_max if k_max is None else min(k_max, measured.k_max)
        drafted, curve = (measured.c, measured.v) if context is None else context_table(measured).costs_at(context)
        return FixedCosts(drafted, curve[: top + 1]), measured
    if context is not None:
        raise ValueError("--context reads a profile's context axis; give --profile FILE from `verispec profile --contexts`")
    if c is None:
        raise ValueError("give --c (one draft step / one target step), or --profile FILE from `verispec profile`")
    top = max(k_max or 8, k or 0)
    v = 1.0 if v is None else v
    check_costs(c, v)
    # v(1) is one plain step by definition; the seed's v applies to every round's scoring.
    return FixedCosts(c, [1.0] + [v] * top), None


def _print_one(k: int, expected: float, speedup: float, costs: FixedCosts, alpha: float | None, as_json: bool) -> None:
    if as_json:
        print(json.dumps(
            {"k": k, "alpha": alpha, "c": costs.c, "v": costs.v[k], "expected_tokens": expected, "speedup": speedup}
        ))
        return
    verdict = "faster" if speedup > 1 else "slower" if speedup < 1 else "no change"
    print(f"expected tokens per round E = {expected:.6g}")
    print(f"speedup E / (k c + v) = {expected:.6g} / ({k} * {costs.c:g} + {costs.v[k]:g}) = {speedup:.4g} ({verdict})")


def _print_all(
    expected: list[float], ratios: list[float], best: int, costs: FixedCosts, acceptance: str, as_json: bool
) -> None:
    rows = [
        {"k": k, "expected_tokens": expected[k], "v": costs.v[k], "speedup": ratios[k]}
        for k in range(1, len(ratios))
    ]
    if as_json:
        print(json.dumps({"c": costs.c, "per_k": rows, "best_k": best, "best_speedup": ratios[best]}))
        return
    table = Table(title=f"predicted speedup, c = {costs.c:.4g}, {acceptance}")
    for column in ("k", "E (tokens/round)", "v(k+1)", "speedup"):
        table.add_column(column, justify="right")
    for row in rows:
        style = "bold green" if row["k"] == best else None
        table.add_row(
            str(row["k"]), f"{row['expected_tokens']:.3f}", f"{row['v']:.3f}", f"{row['speedup']:.3f}", style=style
        )
    console = Console()
    console.print(table)
    if best:
        console.print(f"best k = {best}: predicted speedup {ratios[best]:.3f}")
    else:
        console.print("best k = 0: no k beats plain decoding here; do not speculate")


def parse_ranks(text: str) -> list[list[float]]:
    """'0.6,0.2/0.5' -> [[0.6, 0.2], [0.5]]: a(d, r) per depth, checked."""
    try:
        table = [[float(x) for x in depth.split(",")] for depth in text.split("/")]
    except ValueError:
        raise ValueError(
            f"--ranks needs probabilities, comma-separated per rank and '/' between depths (e.g. 0.6,0.2/0.5), "
            f"got {text!r}"
        ) from None
    check_acceptance(table)
    return table


def _print_tree(choice: TreeChoice, by_size: list[Candidate], costs: FixedCosts, ranks: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps({
            "c": costs.c, "v": list(costs.v), "ranks": ranks, "tree_margin": TREE_MARGIN,
            "by_size": [plan.as_dict() for plan in by_size],
            "best_tree": choice.best_tree.as_dict(), "best_chain": choice.best_chain.as_dict(),
            "chosen": choice.chosen.as_dict(),
        }))
        return
    shown = " / ".join(", ".join(x.strip() for x in depth.split(",")) for depth in ranks.split("/"))
    table = Table(title=f"best token tree of each size, c = {costs.c:.4g} per level, a(d, r) = {shown}")
    for column in ("nodes", "per depth", "depth", "E (tokens/round)", "cost", "speedup"):
        table.add_column(column, justify="right")
    for plan in by_size:
        style = "bold green" if plan.shape == choice.chosen.shape else None
        widths = plan.shape.describe().partition(": ")[2]
        table.add_row(
            str(len(plan.shape)), widths, str(plan.shape.depth), f"{plan.expected:.3f}", f"{plan.cost:.3f}",
            f"{plan.speedup:.3f}", style=style,
        )
    Console().print(table)
    print(f"best tree:  {_explained(choice.best_tree, costs)}")
    print(f"best chain: {_explained(choice.best_chain, costs)}")
    print("plain:      E = 1 token per step, speedup 1")
    gain = choice.best_tree.speedup / choice.best_chain.speedup
    if choice.chosen.kind == "tree":
        verdict = f"the tree, {gain:.3f}x the best chain (a tree must beat it by {TREE_MARGIN:.0%})"
    elif choice.chosen.kind == "chain":
        verdict = (
            f"the chain: the best tree is {gain:.3f}x it, not the {1 + TREE_MARGIN:g}x a tree must reach"
            if choice.best_tree.kind == "tree" else "the chain: no branching raises E enough to pay for its nodes"
        )
    else:
        verdict = "plain decoding: no tree or chain beats it"
    print(f"chosen: {verdict}")
    if choice.chosen.kind == "tree":
        print("its rank paths: " + " ".join("(" + ",".join(map(str, path)) + ")" for path in choice.chosen.shape.paths))


def _explained(plan: Candidate, costs: FixedCosts) -> str:
    n, depth = len(plan.shape), plan.shape.depth
    scoring = f"v({n + 1})" if costs.v[n] == max(costs.v[: n + 1]) else f"max v(m <= {n + 1})"
    return (
        f"{plan.describe()}: E = {plan.expected:.3f}, cost = {costs.c:g} * {depth} + {scoring} "
        f"= {plan.cost:.3f} steps, speedup {plan.speedup:.3f}"
    )


def draw(path: Path, costs: FixedCosts, alpha: float | None, measured: list[float] | None) -> None:
    """Speedup against k for several constant alphas (and the given or measured acceptance)."""
    # Imported here: every command module loads with the CLI, and only --plot needs matplotlib.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = range(len(costs.v))
    figure, axes = plt.subplots(figsize=(7, 4.5))
    alphas = sorted({*PLOT_ALPHAS, *([alpha] if alpha is not None else [])})
    for a in alphas:
        curve = speedup_by_k(costs.c, costs.v, survival_from_alpha(a, len(costs.v) - 1))
        axes.plot(ks, curve, marker="o", markersize=3, linewidth=2.5 if a == alpha else 1.2, label=f"alpha {a:g}")
    if measured is not None:
        curve = speedup_by_k(costs.c, costs.v, measured)
        axes.plot(range(len(curve)), curve, "k--", marker="s", label="measured survival")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel("k (drafted tokens per round)")
    axes.set_ylabel("predicted speedup over plain decoding")
    axes.set_title(f"E / (k c + v(k+1)), c = {costs.c:.3g}")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
