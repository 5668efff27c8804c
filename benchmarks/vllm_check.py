"""vLLM's drafts and acceptance with a head exported by verispec, beside verispec's own.

Evidence that an export is faithful rather than an approximation: for each prompt both engines
decode greedily in float32; at every prefix where vLLM drafted, its draft must equal the draft
verispec's proposer makes for the same prefix (loaded from the same exported directory), and
the mean tokens per round of the two must agree. Also checked: vLLM's greedy output equals
verispec's plain greedy output token by token.

Run it with verispec's venv; it runs vLLM in the venv that `make vllm-env` makes (vLLM pins its
own torch and transformers), as a subprocess of this same file with the engine in-process there,
so its proposer can be watched:

    make vllm-env
    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv/bin/python benchmarks/vllm_check.py \\
        --method eagle3 --head HEAD_DIR --out vllm-eagle3.json
    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv/bin/python benchmarks/vllm_check.py \\
        --method medusa --out vllm-medusa.json          # the Medusa head shipped with verispec

--head is a verispec head directory (exported here into --work first) or, for eagle3, a
speculators-format checkpoint. Without --head, eagle3 runs a seeded untrained head (the export's
faithfulness does not depend on the weights; its acceptance is near zero) and medusa the
shipped head. Stock vLLM 0.32 refuses a Medusa checkpoint with a truncated vocabulary (its
`Medusa.load_weights` never reports `token_map` loaded); this script adds that one name to what
the loader reports, which is the whole of the patch, and says so in the report.

Engine start compiles for minutes on a CPU unless --eager (the default here: no timings are
taken). Numbers are the machine's: the report records it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
# For the engine's process: the engine in it, so its proposer can be watched; the runner whose
# proposers `engine` hooks; a small KV cache.
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain why the sky is blue in two sentences.",
    "List three uses of a paperclip.",
    "Translate 'good morning, how are you?' into French.",
]


def default_target() -> Path:
    """The default model as a Hugging Face checkpoint directory: verispec's float32 conversion
    of the shipped GGUF file (made on first load)."""
    from verispec.models import DEFAULT_MODEL
    from verispec.models.loading.load import load_model
    from verispec.models.loading.sources import converted_dir

    source = Path(load_model(DEFAULT_MODEL, dtype="float32", runtime="hf").source)
    return converted_dir(source) if source.suffix == ".gguf" else source


def exported_head(method: str, head: str | None, target, work: Path) -> tuple[Path, str]:
    """(the directory vLLM loads, the verispec proposer spec that drafts with the same head)."""
    from verispec.heads.export import is_speculators, write_speculators, write_vllm_medusa
    from verispec.heads.untrained import seeded_eagle3

    if method == "eagle3":
        if head is None:
            head = str(seeded_eagle3(target, work / "untrained-eagle3"))
        if is_speculators(head):
            return Path(head), f"eagle3:{head}:weights=float32"
        out = write_speculators(head, work / "eagle3-speculators")
        return out, f"eagle3:{out}:weights=float32"  # verispec reads the export back: the round trip is in the check
    from verispec.proposers.trained import default_head

    head = head or str(default_head("medusa"))
    out = write_vllm_medusa(head, work / "medusa-vllm", target.lm.output_embeddings())
    return out, f"medusa:{head}:weights=float32"


def verispec_side(target, spec: str, prompts: list[list[int]], tokens: int, k: int) -> list[dict]:
    """Per prompt: plain greedy output, the proposer's draft after each prefix prompt + out[:n]
    (n = 1..tokens), and its tokens per round decoding with k."""
    from verispec import GREEDY, TorchRandom, generate
    from verispec.registry import build_proposer

    lm = target.lm
    proposer = build_proposer(spec, target)
    eos = target.eos_token_ids  # vLLM stops there too
    rows = []
    for prompt in prompts:
        out = generate(lm, None, prompt, max_new_tokens=tokens, sampling=GREEDY, k=0, eos_token_id=eos).tokens
        drafts = {}
        for n in range(1, len(out) + 1):
            context = prompt + out[:n]
            proposer.begin(prompt, GREEDY)
            lm.prefill(context[:-1])
            drafts[n] = list(proposer.propose(context, k, TorchRandom(0)).tokens)
        run = generate(lm, proposer, prompt, max_new_tokens=tokens, sampling=GREEDY, k=k, eos_token_id=eos)
        rounds = len(run.stats.accepted)
        rows.append({"output": out, "drafts": drafts, "tokens": len(run.tokens), "rounds": rounds,
                     "tokens_per_round": len(run.tokens) / max(rounds, 1), "identical": run.tokens == out})
    return rows


def worker_module():
    """`verispec.peers.vllm_worker`, loaded from its file: it needs only vLLM, and verispec is
    not installed in vLLM's venv."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "src" / "verispec" / "peers" / "vllm_worker.py"
    spec = importlib.util.spec_from_file_location("vllm_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def engine(request: dict) -> dict:
    """In vLLM's venv: per prompt, vLLM's greedy output and the drafts its proposer returned,
    in order. request: method, target, model (the export), prompts, tokens, k, eager."""
    import vllm
    from vllm import LLM, SamplingParams

    worker = worker_module()
    recorded: list[list[int]] = []
    worker.watch_proposers(recorded)
    patches = [worker.patch_medusa()] if request["method"] == "medusa" else []
    llm = LLM(
        model=request["target"], dtype="float32", max_model_len=1024, enforce_eager=request["eager"], seed=0,
        enable_prefix_caching=False, max_num_seqs=1, disable_log_stats=False,
        speculative_config={"method": request["method"], "model": request["model"], "num_speculative_tokens": request["k"]},
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=request["tokens"])
    rows = []
    for prompt in request["prompts"]:
        recorded.clear()
        result = llm.generate([{"prompt_token_ids": prompt}], greedy, use_tqdm=False)[0]
        rows.append({"output": list(result.outputs[0].token_ids), "drafts": [list(d) for d in recorded]})
    counters = {}
    try:
        for metric in llm.get_metrics():
            if "spec_decode" in metric.name and hasattr(metric, "value"):
                counters[metric.name] = metric.value
    except Exception as error:  # counters are a report's extra, never its verdict
        counters["unavailable"] = str(error)
    return {"rows": rows, "vllm": vllm.__version__, "patches": patches, "counters": counters}


def vllm_side(python: Path, request: dict, work: Path) -> dict:
    """`engine(request)` run by vLLM's venv's `python` on this file."""
    if not python.is_file():
        raise SystemExit(f"error: no vLLM venv at {python}; run `make vllm-env` first (or give --vllm-python)")
    (work / "request.json").write_text(json.dumps(request))
    env = {**os.environ, **ENGINE_ENV}
    subprocess.run([str(python), __file__, "--engine", str(work / "request.json"), "--engine-out", str(work / "engine.json")],
                   check=True, env=env)
    return json.loads((work / "engine.json").read_text())


def compare(ours: dict, theirs: dict, k: int) -> dict:
    """Pair vLLM's drafts with the prefixes they continued (`vllm_worker.rounds`: draft s
    continues out[:m_s], m_0 = 1, and the round emits its accepted tokens + 1) and compare each
    with verispec's draft for that prefix."""
    out = theirs["output"]
    per_round = worker_module().rounds(out, theirs["drafts"])
    checked = equal = 0
    mismatches = []
    m = 1
    for draft, emitted in zip(theirs["drafts"], per_round[1:]):
        mine = ours["drafts"].get(m)
        if mine is not None:
            checked += 1
            if mine == draft:
                equal += 1
            elif len(mismatches) < 5:
                mismatches.append({"prefix_tokens": m, "vllm": draft, "verispec": mine})
        m += emitted
    return {
        "greedy_identical": out == ours["output"][: len(out)],
        "drafts_checked": checked, "drafts_equal": equal, "mismatches": mismatches,
        # the rounds after the prefill's, which drafts nothing in vLLM (verispec drafts from its first round)
        "vllm_tokens": len(out) - 1, "vllm_rounds": len(per_round) - 1,
        "vllm_tokens_per_round": (len(out) - 1) / max(len(per_round) - 1, 1),
        "verispec_tokens": ours.get("tokens"), "verispec_rounds": ours.get("rounds"),
        "verispec_tokens_per_round": ours["tokens_per_round"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=("eagle3", "medusa"))
    parser.add_argument("--head", help="a verispec head directory (or, for eagle3, a speculators checkpoint)")
    parser.add_argument("--target", type=Path, help="the target as a Hugging Face checkpoint directory (default: the default model)")
    parser.add_argument("--k", type=int, help="draft length (default: 3 for eagle3, a Medusa head's K)")
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt")
    parser.add_argument("--prompts", type=int, default=4, help="how many of the built-in prompts")
    parser.add_argument("--work", type=Path, help="where the export is written (default: a temporary directory)")
    parser.add_argument("--compile", action="store_true", help="let vLLM compile (minutes on a CPU) instead of running eagerly")
    parser.add_argument("--vllm-python", type=Path, default=VLLM_PYTHON, help="the python of the venv `make vllm-env` makes")
    parser.add_argument("--out", type=Path, help="the JSON report")
    parser.add_argument("--engine", type=Path, help=argparse.SUPPRESS)  # in vLLM's venv: run `engine` on this request
    parser.add_argument("--engine-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.engine:
        args.engine_out.write_text(json.dumps(engine(json.loads(args.engine.read_text()))))
        return 0
    if args.method is None or args.out is None:
        parser.error("--method and --out are required")
    if args.out.exists():
        print(f"error: {args.out} already exists; give a new --out", file=sys.stderr)
        return 2

    import torch

    from verispec.models.loading.load import load_model

    started = time.time()
    target_dir = args.target or default_target()
    target = load_model(str(target_dir), dtype="float32", runtime="hf")
    work = args.work or Path(tempfile.mkdtemp(prefix="verispec-vllm-"))
    model_dir, spec = exported_head(args.method, args.head, target, work)
    if args.k is None:
        from verispec.heads import read_config

        args.k = 3 if args.method == "eagle3" else read_config(spec.split(":")[1]).heads
    tokenizer = target.tokenizer
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
               for p in PROMPTS[: args.prompts]]
    prompts = [list(p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p) for p in prompts]
    ours = verispec_side(target, spec, prompts, args.tokens, args.k)
    del target
    request = {"method": args.method, "target": str(target_dir), "model": str(model_dir), "prompts": prompts,
               "tokens": args.tokens, "k": args.k, "eager": not args.compile}
    engine_result = vllm_side(args.vllm_python, request, work)
    theirs = engine_result.pop("rows")
    per_prompt = [compare(o, t, args.k) for o, t in zip(ours, theirs)]
    checked = sum(p["drafts_checked"] for p in per_prompt)
    report = {
        "method": args.method, "head": args.head or ("untrained, seed 0" if args.method == "eagle3" else "shipped"),
        "exported": str(model_dir), "verispec_spec": spec, "k": args.k, "tokens": args.tokens,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch_threads": torch.get_num_threads(),
                    "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")},
        "engine": engine_result,
        "drafts_equal": sum(p["drafts_equal"] for p in per_prompt), "drafts_checked": checked,
        "greedy_identical": all(p["greedy_identical"] for p in per_prompt),
        # over all prompts' rounds (not a mean of per-prompt ratios)
        "vllm_tokens_per_round": sum(p["vllm_tokens"] for p in per_prompt) / max(sum(p["vllm_rounds"] for p in per_prompt), 1),
        "verispec_tokens_per_round": sum(p["verispec_tokens"] for p in per_prompt) / max(sum(p["verispec_rounds"] for p in per_prompt), 1),
        "prompts": per_prompt, "seconds": round(time.time() - started, 1),
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({key: report[key] for key in ("method", "drafts_equal", "drafts_checked", "greedy_identical",
                                                   "vllm_tokens_per_round", "verispec_tokens_per_round")}))
    return 0 if checked and report["drafts_equal"] == checked else 1


if __name__ == "__main__":
    sys.exit(main())
