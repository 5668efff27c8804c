"""The vLLM side of `verispec.peers.vllm`, run by the python of the venv `make vllm-env` makes
(vLLM pins its own torch and transformers, so verispec never imports it): standard library and
vLLM only, one engine in this process, one JSON line per message on stdin and per answer on
stdout.

    first line in:   {"target": DIR, "dtype": "float32", "speculative_config": {...} | null,
                      "eager": true, "max_model_len": 2048, "seed": 0, "max_num_seqs": 1}
    first line out:  {"ready": true, "vllm": "0.32.0", "patches": [...]}

One request at a time (`LLM.generate`):

    line in:         {"prompt": [ids], "max_tokens": n, "stop": [eos ids]}
    line out:        {"tokens": [ids], "drafts": [[ids], ...], "seconds": s}

`drafts` are what vLLM's proposer returned, in order, for the request (it runs alone): with
its greedy output they give the tokens each round emitted (`rounds`).

Many at once, each with its own sampling (`LLM.generate` on the list: vLLM batches them, up to
max_num_seqs in flight), for `verispec check-runtime`:

    line in:         {"generate": [{"prompt": [ids], "max_tokens": n, "stop": [eos ids],
                                    "sampling": {SamplingParams' fields: temperature, seed, ...}}, ...]}
    line out:        {"tokens": [[ids], ...], "drafted": d, "accepted": a}
                     or {"refused": "what vLLM said"} when vLLM rejects a request
                     or {"crashed": "what it raised"} when vLLM fails on requests it took;
                     the worker then ends (its engine's state is unknown)

`tokens` in the requests' order; `drafted` and `accepted`: the draft tokens vLLM's scheduler
verified for them and how many it accepted (0 and 0 without speculation).

Several in flight (the engine's own continuous batching, up to max_num_seqs): the caller adds
requests between steps and steps the engine (`LLMEngine.add_request`, `LLMEngine.step`):

    line in:         {"add": key, "prompt": [ids], "max_tokens": n, "stop": [eos ids]}  (no answer)
    line in:         {"step": true}
    line out:        {"outputs": [{"key": key, "tokens": [new ids], "finished": bool}, ...],
                      "verified": [[key, drafted, accepted], ...]}

`outputs`: every request that emitted tokens in this step (the step is one target forward
over every request in flight), with its new tokens only. `verified`: vLLM's own acceptance
counters, per request whose drafts this step verified, as its scheduler counts them.

Stock vLLM 0.32 refuses a Medusa checkpoint with a truncated vocabulary (`Medusa.load_weights`
never reports `token_map` loaded); `patch_medusa` adds that one name to what the loader
reports.
"""

from __future__ import annotations

import json
import os
import sys
import time

# The engine in this process, so its proposer can be watched; the runner whose proposers are hooked.
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_CPU_KVCACHE_SPACE": "2",
              "HF_HUB_OFFLINE": "1"}


def watch_proposers(recorded: list[list[int]]) -> None:
    """Record the first row of every draft tensor vLLM's EAGLE, ngram-free and Medusa proposers return."""
    from vllm.v1.spec_decode import llm_base_proposer, medusa

    for cls in (llm_base_proposer.SpecDecodeBaseProposer, medusa.MedusaProposer):
        original = cls.propose

        def propose(self, *args, _original=original, **kwargs):
            drafts = _original(self, *args, **kwargs)
            recorded.append(drafts.tolist()[0])
            return drafts

        cls.propose = propose


def patch_medusa() -> str:
    from vllm.model_executor.models import medusa

    load_weights = medusa.Medusa.load_weights

    def load_with_token_map(self, weights):
        return load_weights(self, weights) | ({"token_map"} if self.token_map is not None else set())

    medusa.Medusa.load_weights = load_with_token_map
    return "Medusa.load_weights reports token_map as loaded (stock vLLM 0.32 omits it and refuses the checkpoint)"


def rounds(output: list[int], drafts: list[list[int]]) -> list[int]:
    """Tokens emitted by each target forward, the prefill's one first, from a greedy output and
    the drafts in order: draft s continues output[:m_s] (m_0 = 1) and is accepted as far as it
    matches; the sum is len(output).

    >>> rounds([10, 11, 12, 13, 14], [[11, 12, 9], [9, 9, 9], [14, 9, 9]])
    [1, 3, 1]
    """
    if not output:
        return []
    per_round, m = [1], 1
    for draft in drafts:
        if m >= len(output):
            break
        accepted = 0
        while accepted < len(draft) and m + accepted < len(output) and draft[accepted] == output[m + accepted]:
            accepted += 1
        emitted = min(accepted + 1, len(output) - m)
        per_round.append(emitted)
        m += emitted
    if m < len(output):  # rounds without a recorded draft (plain decoding): one token each
        per_round += [1] * (len(output) - m)
    return per_round


def watch_verification(verified: list[list]) -> None:
    """Record (request, drafts verified, drafts accepted) as vLLM's scheduler counts them, per
    request and step (`Scheduler.make_spec_decoding_stats`, called once for each)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    original = Scheduler.make_spec_decoding_stats

    def make_spec_decoding_stats(self, stats, num_draft_tokens, num_accepted_tokens, *args, **kwargs):
        request_id = kwargs.get("request_id", args[-1] if args else None)
        verified.append([request_id, num_draft_tokens, num_accepted_tokens])
        return original(self, stats, num_draft_tokens, num_accepted_tokens, *args, **kwargs)

    Scheduler.make_spec_decoding_stats = make_spec_decoding_stats


class Loop:
    """The engine's requests in flight, by the caller's keys: a request's id is its key as text
    (its outputs carry that id; vLLM's scheduler adds a dash and 8 random characters)."""

    def __init__(self, engine, sampling_params, delta) -> None:
        self.engine, self.sampling_params, self.delta = engine, sampling_params, delta
        self.keys: dict[str, object] = {}  # request id -> key, for the requests in flight
        self.verified: list[list] = []
        watch_verification(self.verified)

    def add(self, request: dict) -> None:
        params = self.sampling_params(temperature=0.0, max_tokens=request["max_tokens"],
                                      stop_token_ids=request["stop"], output_kind=self.delta)
        request_id = str(request["add"])
        if request_id in self.keys:
            raise ValueError(f"request {request_id} is already in flight")
        self.engine.add_request(request_id, {"prompt_token_ids": request["prompt"]}, params)
        self.keys[request_id] = request["add"]

    def step(self) -> dict:
        self.verified.clear()
        outputs = [{"key": self.keys[o.request_id], "tokens": list(o.outputs[0].token_ids), "finished": o.finished}
                   for o in self.engine.step()]
        verified = [[self.keys[request_id.rsplit("-", 1)[0]], drafted, accepted]
                    for request_id, drafted, accepted in self.verified]
        for output in outputs:
            if output["finished"]:
                del self.keys[str(output["key"])]
        return {"outputs": outputs, "verified": verified}


def sampling_fields(fields: dict) -> dict:
    """SamplingParams' fields from a JSON line: logit_bias's keys arrive as text and are token ids.

    >>> sampling_fields({"temperature": 1.0, "logit_bias": {"7": 2.0}})
    {'temperature': 1.0, 'logit_bias': {7: 2.0}}
    """
    if "logit_bias" not in fields:
        return fields
    return fields | {"logit_bias": {int(token): bias for token, bias in fields["logit_bias"].items()}}


def generate_all(llm, sampling_params, requests: list[dict], verified: list[list]) -> dict:
    """The answer to a `generate` line: every request's tokens, or the refusal vLLM raised for
    a request (its validation of the parameters: a client error, before anything runs)."""
    from vllm.exceptions import VLLMClientError

    verified.clear()
    try:
        params = [sampling_params(max_tokens=r["max_tokens"], stop_token_ids=r["stop"], **sampling_fields(r["sampling"]))
                  for r in requests]
        results = llm.generate([{"prompt_token_ids": r["prompt"]} for r in requests], params, use_tqdm=False)
    except (VLLMClientError, ValueError) as error:
        return {"refused": f"{type(error).__name__}: {error}"}
    except Exception as error:  # noqa: BLE001 - whatever vLLM raised is the answer
        return {"crashed": f"{type(error).__name__}: {error}"}
    return {"tokens": [list(result.outputs[0].token_ids) for result in results],
            "drafted": sum(drafted for _, drafted, _ in verified), "accepted": sum(accepted for _, _, accepted in verified)}


def serve(lines, reply) -> None:
    config = json.loads(next(lines))
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import RequestOutputKind
    import vllm

    recorded: list[list[int]] = []
    watch_proposers(recorded)
    patches = [patch_medusa()] if (config.get("speculative_config") or {}).get("method") == "medusa" else []
    llm = LLM(model=config["target"], dtype=config["dtype"], max_model_len=config["max_model_len"],
              enforce_eager=config["eager"], seed=config["seed"], enable_prefix_caching=False,
              max_num_seqs=config.get("max_num_seqs", 1),
              speculative_config=config.get("speculative_config"))
    reply({"ready": True, "vllm": vllm.__version__, "patches": patches})
    loop = Loop(llm.llm_engine, SamplingParams, RequestOutputKind.DELTA)
    for line in lines:
        request = json.loads(line)
        if "add" in request:
            loop.add(request)
            continue
        if "generate" in request:
            recorded.clear()
            answer = generate_all(llm, SamplingParams, request["generate"], loop.verified)
            reply(answer)
            if "crashed" in answer:
                return
            continue
        if "step" in request:
            recorded.clear()  # drafts are read per request from vLLM's counters here
            reply(loop.step())
            continue
        greedy = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"], stop_token_ids=request["stop"])
        recorded.clear()
        start = time.perf_counter()
        result = llm.generate([{"prompt_token_ids": request["prompt"]}], greedy, use_tqdm=False)[0]
        seconds = time.perf_counter() - start
        reply({"tokens": list(result.outputs[0].token_ids), "drafts": [list(d) for d in recorded], "seconds": seconds})


def main() -> int:
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    protocol = os.fdopen(os.dup(1), "w")  # answers only: whatever vLLM prints goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    serve(iter(sys.stdin), reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
