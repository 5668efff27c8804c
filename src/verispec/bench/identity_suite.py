"""The greedy identity suite: on real prompts, every proposer at every k policy, and HF
`generate`, reproduce verispec's plain greedy decoding token for token.

For each prompt, verispec-plain is the reference; HF `generate(do_sample=False)` and each
`<proposer> k=<k>` run are compared with it; a tree policy (`tree:2x2x1`) runs for the
proposers that fill token trees. Every run keeps the logits it chose each token from
(`Recorder` for the engine, `output_logits` for HF), so a mismatch is diagnosed
(`identity.diagnose`) with the target's top-2 margin in the very forwards that decided: the
speculative round's scoring forward of k' + 1 tokens (or of a tree's nodes) and plain
decoding's one-token forward, beside a fresh full forward. Where two runs agree, their rows at
the same position come from forwards of different shapes over the same prefix; the largest
difference between them in the logits of the top two tokens (`top_logit_gap`) measures the
rounding that can flip a tie.

    >>> loaded = load_model(dtype="float32")
    >>> records = identity_suite(loaded, select(read_workloads(PATH), limit_per_category=2))
    >>> identity_summary(records, "float32")["failures"]
    []
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from verispec.identity import NEAR_TIE, diagnose, first_mismatch
from verispec.bench.methods import PLAIN
from verispec.bench.runners import VerispecRunner
from verispec.bench.workloads import Workload
from verispec.models.base import CausalLM, ForwardingLM, TreeScoring
from verispec.models.loading.load import LoadedModel
from verispec.peers.hf import HFRunner
from verispec.policies import KPolicy
from verispec.proposers.base import Proposer
from verispec.registry import KSpec, ProposerSpec, build_policy, build_proposer, parse_k, parse_spec, proposer_kinds
from verispec.sampling import GREEDY

HF_GENERATE = "hf-generate"
KS = ("4", "auto", "tree:2x2x1")


@dataclass
class Run:
    """One greedy request's output and what it was decided from.

    rows: logits[n, V] float32, row i the logits new token i was chosen from. widths[i]: how
    many tokens the forward that computed row i processed. tokens_per_round: new tokens per
    target forward after the prompt's (None for HF).
    """

    tokens: list[int]
    rows: torch.Tensor
    widths: list[int]
    tokens_per_round: float | None = None


class Recorder(ForwardingLM):
    """A `CausalLM` that passes every call to `inner` and keeps, for each prefix length, the
    logits row of the last forward that computed it with that forward's width.

    A speculative round's rows past the first rejection are rolled back and computed again
    by the next round, so the row kept for every emitted token is the one it was chosen from.
    `recorder(lm)` picks `TreeRecorder` for a model that scores token trees.
    """

    def __init__(self, lm: CausalLM) -> None:
        super().__init__(lm)
        self.rows: dict[int, tuple[torch.Tensor, int]] = {}  # prefix length -> (logits[V], width)

    def reset(self) -> None:
        self.inner.reset()
        self.rows.clear()

    def prefill(self, ids: Sequence[int]) -> None:
        self.inner.prefill(ids)
        self.rows.clear()

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        before = self.inner.length
        logits = self.inner.extend(tokens, keep)  # [keep or n, V]
        first = before + len(tokens) - len(logits) + 1  # the prefix length of row 0
        for i, row in enumerate(logits):
            self.rows[first + i] = (row, len(tokens))
        return logits

    def run(self, prompt_ids: Sequence[int], tokens: list[int], tokens_per_round: float | None) -> Run:
        kept = [self.rows[len(prompt_ids) + i] for i in range(len(tokens))]
        rows = torch.stack([row for row, _ in kept]) if kept else torch.empty(0, self.vocab_size)
        return Run(tokens, rows, [width for _, width in kept], tokens_per_round)


class TreeRecorder(Recorder):
    """A `Recorder` over a `TreeScoring` model, itself one: a tree forward's rows are held
    until `keep_path` names the nodes the cache keeps, whose rows are then kept for the kept
    path's prefix lengths, with the tree forward's width (its number of nodes)."""

    def __init__(self, lm: CausalLM) -> None:
        super().__init__(lm)
        self.tree: tuple[int, torch.Tensor] | None = None  # (length before the tree, logits[n, V])

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        before = self.inner.length
        logits = self.inner.extend_tree(tokens, parents)  # [n, V]
        self.tree = (before, logits)
        return logits

    def keep_path(self, path: Sequence[int]) -> None:
        self.inner.keep_path(path)  # refuses a path without a pending tree
        before, logits = self.tree
        self.tree = None
        for depth, node in enumerate(path, start=1):  # the node ends the prefix of length before + depth
            self.rows[before + depth] = (logits[node], len(logits))


def recorder(lm: CausalLM) -> Recorder:
    """A recorder of `lm` that scores token trees exactly when `lm` does."""
    return TreeRecorder(lm) if isinstance(lm, TreeScoring) else Recorder(lm)


def verispec_run(
    loaded: LoadedModel,
    proposer: Proposer | None,
    policy: int | KPolicy,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
) -> Run:
    """The verispec engine at temperature 0; plain decoding with proposer None and policy 0."""
    recording = recorder(loaded.lm)
    outcome = VerispecRunner(recording, proposer, policy, loaded.eos_token_ids)(prompt_ids, max_new_tokens)
    return recording.run(prompt_ids, outcome.tokens, outcome.stats.mean_accepted)


def hf_run(loaded: LoadedModel, prompt_ids: Sequence[int], max_new_tokens: int) -> Run:
    """HF `generate(do_sample=False)` with the benchmark's neutral generation config and its
    raw per-step logits."""
    outcome = HFRunner(loaded.transformers_model(), loaded.eos_token_ids, keep_logits=True)(prompt_ids, max_new_tokens)
    # The first token comes from the prompt's forward, every later one from a one-token forward.
    return Run(outcome.tokens, outcome.logits, [len(prompt_ids)] + [1] * (len(outcome.tokens) - 1))


def identity_proposers() -> list[str]:
    """The spec the suite runs for every registered proposer kind that names one."""
    return [kind.example for kind in proposer_kinds() if kind.example is not None]


def method_name(proposer: str, k: str) -> str:
    return f"{proposer} k={k}"


def runs_policy(proposer: str | ProposerSpec, k: str | KSpec) -> bool:
    """Whether the suite runs `proposer` at k policy `k`: a tree policy only for a proposer
    kind that fills token trees."""
    return (parse_k(k) if isinstance(k, str) else k).kind != "tree" or parse_spec(proposer).kind.trees


def identity_suite(
    loaded: LoadedModel,
    workloads: Sequence[Workload],
    proposers: Sequence[str] | None = None,
    ks: Sequence[str] = KS,
    max_new_tokens: int = 64,
    progress: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """One record per prompt and method (HF generate and every proposer at every k it can
    run, `runs_policy`), each compared with verispec-plain on that prompt.

    proposers: proposer specs; None: `identity_proposers()`, one per registered kind.
    ks: k policy specs ("4", "auto", "heuristic", "tree:2x2x1"); `auto` and `tree` profile
    each proposer once, after the first prompt; a tree policy runs only for the proposers
    that fill trees. progress(line) is called after each prompt.
    """
    if not workloads:
        raise ValueError("no prompts to check; check --prompts and --per-category")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    prompts = [(workload, workload.token_ids(loaded)) for workload in workloads]
    methods: dict[str, tuple[Proposer, KPolicy]] = {}
    policies = {k: parse_k(k) for k in ks}
    for spec in identity_proposers() if proposers is None else proposers:
        parsed = parse_spec(spec)
        proposer = build_proposer(parsed, loaded)
        for k in [k for k in ks if runs_policy(parsed, policies[k])]:
            policy = build_policy(policies[k], loaded.lm, proposer, prompts[0][1], GREEDY)
            methods[method_name(spec, k)] = (proposer, policy)
    dtype = str(loaded.dtype).removeprefix("torch.")
    records = []
    for workload, ids in prompts:
        plain = verispec_run(loaded, None, 0, ids, max_new_tokens)
        runs = {HF_GENERATE: hf_run(loaded, ids, max_new_tokens)}
        for name, (proposer, policy) in methods.items():
            runs[name] = verispec_run(loaded, proposer, policy, ids, max_new_tokens)
        done = [compare(loaded, workload, ids, plain, name, run, dtype) for name, run in runs.items()]
        records.extend(done)
        same = sum(r["identical"] for r in done)
        progress(f"{workload.category}/{workload.id}: {same} of {len(done)} identical to {PLAIN}")
    return records


def compare(
    loaded: LoadedModel, workload: Workload, ids: list[int], plain: Run, method: str, run: Run, dtype: str
) -> dict:
    """One record: `run` against plain decoding's `plain` on the same prompt."""
    position = first_mismatch(plain.tokens, run.tokens)
    agree = min(len(plain.tokens), len(run.tokens)) if position is None else position
    passes = {PLAIN: plain.rows, method: run.rows}
    mismatch = diagnose(ids, plain.tokens, run.tokens, loaded.lm.score, dtype, passes)
    if mismatch is not None:
        pairs = ((PLAIN, plain.widths), (method, run.widths))
        mismatch["forward_tokens"] = {name: widths[position] for name, widths in pairs if position < len(widths)}
    return {
        "prompt_id": workload.id,
        "category": workload.category,
        "method": method,
        "new_tokens": len(run.tokens),
        "tokens_per_round": run.tokens_per_round,
        "identical": mismatch is None,
        "top_logit_gap": top_logit_gap(plain.rows[:agree], run.rows[:agree]),
        "mismatch": mismatch,
    }


def top_logit_gap(reference: torch.Tensor, rows: torch.Tensor) -> float:
    """The largest difference between two passes' logits of the reference's top-2 tokens.

    reference, rows: logits[n, V] of two runs over the same n prefixes. The two passes can
    disagree on the argmax only where the reference's top-2 margin is below twice this.
    """
    if not len(reference):
        return 0.0
    top = reference.topk(2, dim=1).indices  # [n, 2]
    return float((rows.gather(1, top) - reference.gather(1, top)).abs().max())


def identity_summary(records: Sequence[dict], dtype: str) -> dict:
    """Counts, every mismatch, and the failures: mismatches that are not diagnosed near ties."""
    mismatches = [r for r in records if r["mismatch"] is not None]
    return {
        "runs": len(records),
        "identical": len(records) - len(mismatches),
        "near_ties": [r for r in mismatches if r["mismatch"]["near_tie"]],
        "failures": [r for r in mismatches if not r["mismatch"]["near_tie"]],
        "top_logit_gap": max((r["top_logit_gap"] for r in records), default=0.0),
        "tolerance": NEAR_TIE.get(dtype, NEAR_TIE["float32"]),
    }


def identity_table(records: Sequence[dict]) -> str:
    """Prompts down, methods across; a cell is `=` and the tokens per round (identical), or
    `tie@i` / `FAIL@i` at the first differing new token i."""
    methods = list(dict.fromkeys(r["method"] for r in records))
    prompts = list(dict.fromkeys((r["category"], r["prompt_id"]) for r in records))
    cells = {(r["category"], r["prompt_id"], r["method"]): cell(r) for r in records}
    headers = ["prompt", *(short(m) for m in methods)]
    rows = [[f"{c}/{p}", *(cells.get((c, p, m), "") for m in methods)] for c, p in prompts]
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    return "\n".join(
        "  ".join(t.ljust(w) if i == 0 else t.rjust(w) for i, (t, w) in enumerate(zip(row, widths)))
        for row in [headers, *rows]
    )


def cell(record: dict) -> str:
    mismatch = record["mismatch"]
    if mismatch is None:
        per_round = record["tokens_per_round"]
        return "=" if per_round is None else f"= {per_round:.2f}"
    return f"{'tie' if mismatch['near_tie'] else 'FAIL'}@{mismatch['position']}"


def short(method: str) -> str:
    """A column header: a draft model's path is left out (`draft k=4`)."""
    return f"draft {method.rpartition(' ')[2]}" if method.startswith("draft:") else method
