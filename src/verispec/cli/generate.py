"""`verispec generate`: speculative generation on a real model, streamed as it is committed."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from verispec.cli import app
from verispec.engine import Decoding
from verispec.models import DEFAULT_MODEL
from verispec.policies import policy_from_spec
from verispec.sampling import SamplingParams
from verispec.textstream import TextStream

if TYPE_CHECKING:
    from verispec.models.load import LoadedModel


@app.command()
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; read from stdin when omitted.")] = None,
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    proposer: Annotated[str, typer.Option(help="lookup | suffix | draft:PATH | layerskip:L[:N] | eagle[:DIR] | medusa[:DIR] | random")] = "lookup",
    k: Annotated[str, typer.Option("--k", help="Tokens drafted per round: an integer >= 1, auto or heuristic.")] = "auto",
    temperature: Annotated[float, typer.Option(help="0 is greedy.")] = 0.0,
    top_k: Annotated[Optional[int], typer.Option("--top-k")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p")] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens")] = 128,
    seed: int = 0,
    chat: Annotated[bool, typer.Option("--chat/--no-chat", help="Wrap the prompt in the chat template.")] = True,
    dtype: Annotated[str, typer.Option(help="auto (bf16 where the CPU has it natively), float32, bfloat16.")] = "auto",
    compare: Annotated[bool, typer.Option("--compare", help="Also decode plainly; report speedup and identity.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming text.")] = False,
) -> None:
    """Generate from PROMPT with speculative decoding, streaming the text as tokens are committed."""
    text = prompt if prompt is not None else sys.stdin.read()
    if not text.strip():
        raise ValueError("the prompt is empty; pass it as an argument or on stdin")
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    check_k(k)
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    from verispec.models.load import load_model  # transformers: imported when needed
    from verispec.proposers.spec import parse_proposer

    loaded = load_model(model, dtype=dtype)
    prompt_ids = loaded.encode(text, chat=chat and loaded.chat_template is not None)
    check_context(loaded, len(prompt_ids), max_new_tokens)
    drafter = parse_proposer(proposer, loaded)
    policy = policy_from_spec(k, loaded.lm, drafter, prompt_ids, sampling)
    options = dict(max_new_tokens=max_new_tokens, sampling=sampling, eos_token_id=loaded.eos_token_id, seed=seed)

    warm_up(loaded, prompt_ids)
    spec = timed_run(Decoding(loaded.lm, drafter, prompt_ids, k=policy, **options), loaded, echo=not as_json)
    report = {
        "text": loaded.decode(spec["tokens"]),
        "new_tokens": len(spec["tokens"]),
        "tokens_per_s": spec["tokens_per_s"],
        "mean_accepted": spec["stats"].mean_accepted,
        "acceptance_rate": spec["stats"].acceptance_rate,
        "rounds": spec["stats"].rounds,
        "seconds": spec["seconds"],
        "model": loaded.name,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "proposer": proposer,
        "k": k,
    }
    if compare:
        plain = timed_run(Decoding(loaded.lm, None, prompt_ids, k=0, **options), loaded, echo=False)
        report["plain_tokens_per_s"] = plain["tokens_per_s"]
        report["speedup"] = spec["tokens_per_s"] / plain["tokens_per_s"]
        report["identical"] = plain["tokens"] == spec["tokens"]
    if as_json:
        print(json.dumps(report))
        return
    print(flush=True)
    line = (
        f"{report['new_tokens']} tokens in {report['seconds']:.2f} s: {report['tokens_per_s']:.1f} tok/s, "
        f"{report['mean_accepted']:.2f} tokens/round over {report['rounds']} rounds, "
        f"acceptance {report['acceptance_rate']:.0%}"
    )
    if compare:
        same = "identical to" if report["identical"] else "DIFFERENT from"
        if not sampling.greedy:
            same = "sampled, so not comparable token for token with"
        line += (
            f"; plain {report['plain_tokens_per_s']:.1f} tok/s, speedup {report['speedup']:.2f}x, "
            f"output {same} plain decoding"
        )
    print(line, file=sys.stderr)


def check_k(k: str) -> None:
    """Refuse k < 1 in any spelling ("0", "00", "+0", "-1"): k = 0 would decode plainly while
    reporting itself as speculative."""
    try:
        number = int(k)
    except ValueError:
        return  # a policy name; policy_from_spec says what it accepts
    if number < 1:
        raise ValueError(
            f"--k must be an integer >= 1, auto or heuristic, got {k!r}; plain decoding is --compare's baseline"
        )


def check_context(loaded: LoadedModel, prompt_tokens: int, max_new_tokens: int) -> None:
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ValueError(
            f"the prompt ({prompt_tokens} tokens) plus --max-new-tokens {max_new_tokens} exceeds the "
            f"model's context of {limit} tokens; shorten the prompt or ask for fewer tokens"
        )


def warm_up(loaded: LoadedModel, prompt_ids: list[int]) -> None:
    """One short plain run, so the first timed run does not pay for lazy initialisation."""
    for _ in Decoding(loaded.lm, None, prompt_ids, k=0, max_new_tokens=2, sampling=SamplingParams(temperature=0)):
        pass


def timed_run(run: Decoding, loaded: LoadedModel, echo: bool) -> dict:
    stream = TextStream(loaded.decode)
    start = time.perf_counter()
    for token in run:
        if echo:
            sys.stdout.write(stream.push(token))
            sys.stdout.flush()
    seconds = time.perf_counter() - start
    if echo:
        sys.stdout.write(stream.flush())
    return {
        "tokens": run.tokens,
        "stats": run.stats,
        "seconds": seconds,
        "tokens_per_s": len(run.tokens) / seconds if seconds > 0 else float("inf"),
    }
