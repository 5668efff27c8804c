"""`verispec profile`: measure v(n) and c for a model and a proposer on this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import torch
import typer
from rich.console import Console
from rich.table import Table

from verispec.cli import BadInput, app
from verispec.cli.runtime_options import CacheTypeVOption, DeterministicOption, DeviceOption, RuntimeOption
from verispec.cli.paths import FORCE_HELP, check_output_file
from verispec.cost import K_MAX, optimal_k, speedup_by_k
from verispec.k_spec import K_BOUND, TREE_SHAPE_BOUND
from verispec.machine import cpu_model
from verispec.models import DEFAULT_MODEL
from verispec.models.base import SlotScoring
from verispec.models.loading.format_costs import FormatCost, record
from verispec.models.runtime import Runtime
from verispec.models.weight_format import WeightFormat
from verispec.profile import Profile
from verispec.profiling import BATCH_ROWS_BOUND, ProfileSettings, profile_model
from verispec.registry import build_proposer, parse_spec, proposer_help
from verispec.sampling import SamplingParams
from verispec.vllm_config import drafter as vllm_drafter
from verispec.vllm_config import vllm_config as make_vllm_config
from verispec.vllm_config import write as write_vllm_config

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel

# A summarising request: the kind of prompt whose answer reuses its words, as many do.
DEFAULT_PROMPT = (
    "Summarise the following passage in three sentences.\n\n"
    "The lighthouse at the harbour entrance was built in 1874 from granite quarried on the "
    "island itself. Its first lamp burned colza oil and was turned by a clockwork mechanism "
    "that the keeper wound every four hours through the night. In 1911 the oil lamp was "
    "replaced by an incandescent paraffin burner, which tripled the range of the light, and "
    "in 1952 the station was connected to the mainland electricity grid. The last keeper left "
    "in 1989, when the light was automated and its monitoring moved to a control room on the "
    "mainland. Today the lighthouse is a museum: visitors climb the 117 steps of the tower, "
    "see the clockwork mechanism that once turned the lamp, and read the keepers' logbooks, "
    "which record storms, shipwrecks and the daily routine of the station for more than a "
    "century."
)


@app.command()
def profile(
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    proposer: Annotated[str, typer.Option(help=proposer_help())] = "lookup",
    k_max: Annotated[int, typer.Option("--k-max", min=1, max=K_BOUND, help="Measure v(n) for n = 1..k_max + 1.")] = K_MAX,
    tree_nodes: Annotated[
        Optional[int],
        typer.Option(
            "--tree-nodes", min=0, max=TREE_SHAPE_BOUND,
            help="Also time tree rounds of 0..this many nodes (v(nodes + 1) for trees) beside chains as long; 0: skip "
            "[default: 16 where the model scores trees in one forward, else 0].",
            show_default=False,
        ),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats of every measurement.")] = 7,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed repeats first.")] = 2,
    context_tokens: Annotated[
        Optional[int],
        typer.Option("--context-tokens", min=2, help="Time at this context length (the prompt tiled or cut)."),
    ] = None,
    contexts: Annotated[
        Optional[str],
        typer.Option(
            "--contexts",
            help="Also time v(n) and c after each of these context lengths, the prompt tiled (e.g. 1024,4096,8000): "
            "the context axis, which --k auto:FILE reads at each request's current context, so speculation stops "
            "where a long context makes it lose and drafts again where it pays (linear between lengths). "
            "Without it the costs are taken as the same at every context. The longest is prefilled once, the "
            "others are rollbacks of it.",
            show_default=False,
        ),
    ] = None,
    prompt: Annotated[
        Optional[str], typer.Option(help="The context to time at (default: a built-in summarising request).")
    ] = None,
    survival_tokens: Annotated[
        int,
        typer.Option(
            "--survival-tokens", min=0, help="Generate this many tokens at k = k_max to measure survival; 0: skip."
        ),
    ] = 64,
    temperature: Annotated[
        float, typer.Option(help="Sampling temperature of drafts and survival run; 0 is greedy.")
    ] = 0.0,
    dtype: Annotated[str, typer.Option(help="auto (bf16 where the CPU has it natively), float32, bfloat16 or q4.")] = "auto",
    runtime: RuntimeOption = "auto",
    deterministic: DeterministicOption = None,
    cache_type_v: CacheTypeVOption = None,
    device: DeviceOption = "auto",
    batch_rows: Annotated[
        Optional[int],
        typer.Option(
            "--batch-rows", min=0, max=BATCH_ROWS_BOUND,
            help="Also time batched forwards of 1..this many rows over up to 8 request slots, and print the k "
            "auto would draft per request at each batch size; 0: skip [default: 64 where the model has request "
            "slots, else 0].",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the profile as JSON instead of tables.")] = False,
    out: Annotated[
        Optional[Path], typer.Option(help="Write the profile JSON here (for `cost --profile`, `--k auto:FILE`).")
    ] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Draw v(n) against n to this .png file.")] = None,
    vllm_config: Annotated[
        Optional[Path],
        typer.Option(
            "--vllm-config",
            help="Write the speculative_config vLLM should serve this model and proposer with, from these "
            "measurements: its method, the best k and k per batch size (needs the survival and batch rows).",
        ),
    ] = None,
    vllm_head: Annotated[
        Optional[Path],
        typer.Option(
            "--vllm-head",
            help="With --vllm-config: the profiled head as vLLM reads it (an export of --format speculators for "
            "eagle3, vllm-medusa for medusa); eagle3:DIR of a speculators export needs none.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help=FORCE_HELP)] = False,
    keep_costs: Annotated[
        bool,
        typer.Option(
            "--keep-costs",
            help="Keep the target's measured t(1) and v(n) (the batched rows where measured) as this machine's curve "
            "for its dtype and runtime: --dtype auto and --runtime auto then weigh each format's expected tokens/s by it "
            "(`verispec load-plan` shows them). Profile quietly: a curve timed under load misleads every later choice.",
        ),
    ] = False,
) -> None:
    """Measure the target's scoring cost v(n) and the proposer's draft cost c at the request's
    context length (and with --contexts at other lengths: the context axis `--k auto` reads at
    each request's current context): medians and spread over repeats, and the best k they
    predict."""
    settings = ProfileSettings(
        k_max=k_max, tree_nodes=tree_nodes, repeats=repeats, warmup=warmup, context_tokens=context_tokens,
        survival_tokens=survival_tokens, sampling=SamplingParams(temperature=temperature), batch_rows=batch_rows,
        contexts=context_lengths(contexts),
    )
    proposer_spec = parse_spec(proposer)
    if out is not None:
        check_output_file(out, "--out", force)
    if plot is not None:
        check_output_file(plot, "--plot", force, suffix=".png")
    method = None
    if vllm_config is not None:
        check_output_file(vllm_config, "--vllm-config", force, suffix=".json")
        if (batch_rows is not None and batch_rows < 2) or not survival_tokens:
            raise BadInput("--vllm-config plans k per batch size from the survival and the batched forward: "
                           "give --survival-tokens > 0 and --batch-rows >= 2 (or leave both at their defaults)")
        method = vllm_drafter(proposer_spec, vllm_head)
    elif vllm_head is not None:
        raise BadInput("--vllm-head goes with --vllm-config; give both or neither")
    from verispec.models.loading.load import load_model  # transformers: imported when needed

    loaded = load_model(model, dtype=dtype, runtime=runtime, deterministic=deterministic, device=device,
                        cache_type_v=cache_type_v)
    if vllm_config is not None and not isinstance(loaded.lm, SlotScoring):
        raise BadInput(f"--vllm-config plans k per batch size from batched forwards; {loaded.runtime} has no request slots")
    prompt_ids = loaded.encode(prompt if prompt is not None else DEFAULT_PROMPT)
    if keep_costs and (refusal := costs_refusal(loaded)):
        raise BadInput(f"--keep-costs: {refusal}")
    measured = profile_model(loaded, build_proposer(proposer_spec, loaded), proposer_spec.text, prompt_ids, settings)
    if keep_costs:
        keep(loaded, measured)
    if out is not None:
        measured.save(out)
    if plot is not None:
        draw(plot, measured)
    if vllm_config is not None:
        config = make_vllm_config(measured, method)
        write_vllm_config(vllm_config, config)
        print_vllm_config(config, vllm_config)
    if as_json:
        print(json.dumps(measured.to_dict()))
    else:
        show(measured)


def context_lengths(text: str | None) -> tuple[int, ...]:
    """--contexts: context lengths joined by commas (None: none)."""
    if text is None:
        return ()
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) >= 2 for part in parts):
        raise BadInput(f"--contexts takes context lengths (integers >= 2) joined by commas, e.g. 1024,4096,8000; got {text!r}")
    return tuple(int(part) for part in parts)


def costs_refusal(loaded: LoadedModel) -> str | None:
    """Why `loaded`'s costs cannot be kept for the auto choices, or None: they weigh the fast
    runtime and transformers on the CPU, in q4, bfloat16 or float32."""
    if loaded.device != "cpu" or loaded.runtime not in (Runtime.FAST, Runtime.HF):
        return f"the auto choices weigh the fast runtime and transformers on the CPU, not the {loaded.runtime} runtime on {loaded.device}"
    if loaded.dtype_name not in ("q4", "bfloat16", "float32"):
        return f"the auto choices weigh q4, bfloat16 and float32, not {loaded.dtype_name}"
    return None


def keep(loaded: LoadedModel, measured: Profile) -> None:
    """Record the profile's t(1) and v(n) as this machine's curve for `loaded`'s format and runtime
    (`format_costs.record`): the batched forward's rows where measured, else n = 1..k_max + 1."""
    if measured.batch:
        rows, v, t1 = measured.batch["rows"], measured.batch["v"], measured.batch["score"][0]["median"]
    else:
        rows, v, t1 = list(range(1, len(measured.v) + 1)), measured.v, measured.score[0].median
    cost = FormatCost(loaded.runtime, WeightFormat(loaded.dtype_name), t1, tuple(rows), tuple(v),
                      f"measured by verispec profile at {measured.context_tokens} tokens of context")
    threads = torch.get_num_threads()
    path = record(loaded.source, cost, cpu_model(), threads)
    print(f"kept {cost.label} on this CPU with {threads} thread(s) in {path}: --dtype auto and --runtime auto weigh it",
          file=sys.stderr)


def print_vllm_config(config: dict, path: Path) -> None:
    """Where the vLLM config went and what it says, on stderr (stdout may carry --json)."""
    console = Console(stderr=True)
    speculative = config["speculative_config"]
    if speculative is None:
        console.print(f"{path}: speculative_config null: no k beats plain decoding here; serve without speculation")
        return
    schedule = ", ".join(f"{first}-{last}: {k}" for first, last, k in speculative["num_speculative_tokens_per_batch_size"])
    console.print(f"{path}: vLLM {speculative['method']}, num_speculative_tokens {speculative['num_speculative_tokens']}, "
                  f"k by batch size {schedule}")


def show(profile: Profile) -> None:
    console = Console()
    ms = 1000.0
    table = Table(
        title=f"{profile.target}: scoring n new tokens after {profile.context_tokens} ({profile.repeats} repeats)"
    )
    for column in ("n", "v(n)", "median ms", "IQR ms", "min-max ms"):
        table.add_column(column, justify="right")
    for n, (v, t) in enumerate(zip(profile.v, profile.score), start=1):
        table.add_row(
            str(n), f"{v:.3f}", f"{t.median * ms:.2f}", f"{t.q1 * ms:.2f}-{t.q3 * ms:.2f}",
            f"{t.minimum * ms:.2f}-{t.maximum * ms:.2f}",
        )
    console.print(table)
    if profile.tree_v:
        show_trees(console, profile)
    d = profile.draft
    console.print(
        f"proposer {profile.proposer}: {d.median * ms:.3f} ms per drafted token (IQR {d.q1 * ms:.3f}-"
        f"{d.q3 * ms:.3f}, min-max {d.minimum * ms:.3f}-{d.maximum * ms:.3f}), c = {profile.c:.4f}; "
        f"it returned {profile.drafted:.1f} of {profile.k_max} tokens asked for"
    )
    if profile.survival:
        ratios = speedup_by_k(profile.c, profile.v, profile.survival)
        best = optimal_k(profile.c, profile.v, survival=profile.survival)
        console.print("survival s_1.. = " + ", ".join(f"{s:.2f}" for s in profile.survival))
        console.print(
            f"best k = {best}, predicted speedup {ratios[best]:.2f}" if best
            else "best k = 0: no k beats plain decoding here"
        )
    show_contexts(console, profile)
    if profile.batch:
        show_batch(console, profile)
    if profile.memory:
        mib = 2**20
        m = profile.memory
        console.print(
            f"memory: target weights {m['target_weight_bytes'] / mib:.1f} MiB, proposer {m['proposer_bytes'] / mib:.1f} MiB, "
            f"KV {m['kv_bytes_per_token'] / 1024:.1f} KiB per token ({m['kv_bytes_per_slot'] / mib:.1f} MiB per slot at "
            f"{m['context_tokens']} tokens), peak RSS {m['peak_rss_bytes'] / mib:.0f} MiB"
        )
    console.print(", ".join(f"{key} {value}" for key, value in profile.machine.items()), style="dim")


def show_contexts(console: Console, profile: Profile) -> None:
    """The context axis: the plain step, v(2), v(k_max + 1) and c after each context length,
    and the best k there for the measured survival; or that the costs are taken as flat."""
    table = profile.context_table
    if table is None:
        console.print(
            f"costs measured after {profile.context_tokens} tokens only: --k auto takes them as the same at every "
            "context (measure the context axis with --contexts)", style="dim",
        )
        return
    grid = Table(title="the context axis: costs after each context length (--k auto reads them at a request's context)")
    for column in ("context", "t(1) ms", "v(2)", f"v({profile.k_max + 1})", "c", "best k"):
        grid.add_column(column, justify="right")
    for length, seconds, draft in zip(table.contexts, table.seconds, table.draft):
        v = [t / seconds[0] for t in seconds]
        best = optimal_k(draft / seconds[0], v, survival=profile.survival) if profile.survival else None
        grid.add_row(
            str(length), f"{seconds[0] * 1000:.2f}", f"{v[1]:.3f}", f"{v[-1]:.3f}", f"{draft / seconds[0]:.4f}",
            "-" if best is None else str(best),
        )
    console.print(grid)


def show_batch(console: Console, profile: Profile) -> None:
    """v over a batched forward's rows, one row's time by context, and k per batch size."""
    ms = 1000.0
    batch = profile.batch
    table = Table(title=f"batched forward: n rows over up to {batch['slots']} request slots, {batch['context_tokens']} tokens each")
    for column in ("rows n", "v(n)", "median ms", "IQR ms"):
        table.add_column(column, justify="right")
    for n, v, t in zip(batch["rows"], batch["v"], batch["score"]):
        table.add_row(str(n), f"{v:.2f}", f"{t['median'] * ms:.2f}", f"{t['q1'] * ms:.2f}-{t['q3'] * ms:.2f}")
    console.print(table)
    console.print("one row after a context of " + ", ".join(
        f"{n} tokens: {t['median'] * ms:.1f} ms" for n, t in zip(batch["contexts"], batch["context_score"])
    ))
    if profile.batch_k:
        table = Table(title="k per request at each batch size (auto k, this proposer's survival)")
        table.add_column("batch size", justify="right")
        table.add_column("k", justify="right")
        for size, k in profile.batch_k.items():
            table.add_row(size, str(k))
        console.print(table)


def show_trees(console: Console, profile: Profile) -> None:
    """v(n) of tree rounds against chains of as many positions, from the same repeats."""
    ms = 1000.0
    table = Table(title="tree rounds: the pending token + a tree of n - 1 nodes, its deepest path kept")
    for column in ("n", "tree shape", "v(n) tree", "v(n) chain", "tree / chain", "median ms", "IQR ms"):
        table.add_column(column, justify="right")
    rows = zip(profile.tree_v, profile.tree_chain_v, profile.tree_score, profile.tree_shapes)
    for n, (tree, chain, t, shape) in enumerate(rows, start=1):
        table.add_row(
            str(n), shape, f"{tree:.3f}", f"{chain:.3f}", f"{tree / chain:.3f}", f"{t.median * ms:.2f}",
            f"{t.q1 * ms:.2f}-{t.q3 * ms:.2f}",
        )
    console.print(table)


def draw(path: Path, profile: Profile) -> None:
    """v(n) with its interquartile range, against n."""
    # Imported here: every command module loads with the CLI, and only --plot needs matplotlib.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = profile.step_seconds
    ns = range(1, len(profile.v) + 1)
    low = [v - t.q1 / step for v, t in zip(profile.v, profile.score)]
    high = [t.q3 / step - v for v, t in zip(profile.v, profile.score)]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.errorbar(ns, profile.v, yerr=[low, high], marker="o", capsize=3, label="measured v(n) (IQR)")
    axes.plot(ns, list(ns), color="grey", linestyle=":", label="n separate steps")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xlabel("n, tokens scored in one forward (k + 1)")
    axes.set_ylabel("v(n): time / one plain step")
    axes.set_title(
        f"{profile.target}, context {profile.context_tokens}, step {step * 1000:.1f} ms, c = {profile.c:.3g}"
    )
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
