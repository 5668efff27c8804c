"""`verispec generate`: speculative generation on a real model, streamed as it is committed."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from verispec.cli import app
from verispec.cli.runtime_options import CacheTypeVOption, DeterministicOption, DeviceOption, RuntimeOption
from verispec import runner
from verispec.engine import check_request
from verispec.identity import explain
from verispec.logprobs import TokenLogprob
from verispec.models import DEFAULT_MODEL
from verispec.proposers.trained import DEFAULT_PROPOSER_HELP
from verispec.registry import K_HELP, proposer_help
from verispec.request import Request
from verispec.runner import specs
from verispec.sampling import SamplingParams
from verispec.textstream import TextStream

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel


@app.command()
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; read from stdin when omitted.")] = None,
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    proposer: Annotated[
        Optional[str], typer.Option(help=proposer_help(), show_default=DEFAULT_PROPOSER_HELP)
    ] = None,
    k: Annotated[str, typer.Option("--k", help=K_HELP)] = "auto",
    temperature: Annotated[float, typer.Option(help="0 is greedy.")] = 0.0,
    top_k: Annotated[Optional[int], typer.Option("--top-k")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p")] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens")] = 128,
    json_schema: Annotated[Optional[str], typer.Option(
        "--json-schema", help="Constrain the output to JSON following this schema (its text, or a .json file)."),
    ] = None,
    regex: Annotated[Optional[str], typer.Option(help="Constrain the output to this regular expression.")] = None,
    choice: Annotated[Optional[list[str]], typer.Option(
        help="Constrain the output to one of these strings (repeat the option for each).")] = None,
    grammar: Annotated[Optional[Path], typer.Option(
        metavar="FILE", help="Constrain the output to this grammar file: Lark (start: ...) or GBNF (root ::= ...)."),
    ] = None,
    seed: int = 0,
    chat: Annotated[bool, typer.Option("--chat/--no-chat", help="Wrap the prompt in the chat template.")] = True,
    dtype: Annotated[
        str,
        typer.Option(help="auto (bf16 where the CPU has it natively), float32, bfloat16, or q4 (int4 kernels: "
                     "exact for a Q4 GGUF, a different model otherwise)."),
    ] = "auto",
    runtime: RuntimeOption = "auto",
    deterministic: DeterministicOption = None,
    cache_type_v: CacheTypeVOption = None,
    device: DeviceOption = "auto",
    logprobs: Annotated[Optional[int], typer.Option(
        "--logprobs", min=-1, metavar="N",
        help="Report each new token's log probability under the target with the N most likely tokens at its "
             "position (-1: the whole vocabulary); plain decoding's, whatever the speculation."),
    ] = None,
    prompt_logprobs: Annotated[Optional[int], typer.Option(
        "--prompt-logprobs", min=-1, metavar="N",
        help="Report each prompt token's log probability under the target with the N most likely tokens at its "
             "position (-1: the whole vocabulary), from one more forward over the prompt."),
    ] = None,
    compare: Annotated[bool, typer.Option("--compare", help="Also decode plainly; report speedup and identity.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming text.")] = False,
) -> None:
    """Generate from PROMPT with speculative decoding, streaming the text as tokens are committed."""
    text = prompt_text(prompt)
    if not text.strip():
        raise ValueError("the prompt is empty; pass it as an argument or on stdin")
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    proposer_spec, k_spec = specs(model, proposer, k)
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    from verispec.models.loading.load import build  # transformers: imported when needed

    loaded = build(runner.load_plan(model, dtype, runtime, deterministic, device, proposer_spec, k_spec,
                                     cache_type_v=cache_type_v))
    if loaded.target_note:
        print(f"note: {loaded.target_note}", file=sys.stderr)
    sampling = constrained(sampling, loaded, json_schema, regex, choice, grammar)
    prompt_ids = loaded.encode(text, chat=chat and loaded.chat_template is not None)
    check_context(loaded, len(prompt_ids), max_new_tokens)
    request = Request(tuple(prompt_ids), max_new_tokens, sampling, loaded.eos_token_ids, seed=seed, proposer=proposer_spec,
                      k=k_spec, logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    check_request(request, loaded.lm.vocab_size)  # before the k policy's profile: a count past the vocabulary
    text_stream = TextStream(loaded.decode)
    echo = None if as_json else lambda token: print(text_stream.push(token), end="", flush=True)
    done = runner.run(loaded, request, on_token=echo, compare=compare)
    spec = done.speculative
    if not as_json:
        print(text_stream.flush(), end="")
    report = {
        "text": loaded.decode(spec.tokens),
        "new_tokens": len(spec.tokens),
        "tokens_per_s": spec.tokens_per_s,
        "mean_accepted": spec.stats.mean_accepted,
        "acceptance_rate": spec.stats.acceptance_rate,
        "rounds": spec.stats.rounds,
        "seconds": spec.wall_seconds,
        "model": loaded.name,
        "dtype": loaded.dtype_name,
        "runtime": str(loaded.runtime),
        "device": loaded.device,
        "weight_format": str(loaded.weight_format),
        "exact_weights": loaded.exact_weights,
        "proposer": proposer_spec.text,
        "k": k,
        "seed": seed,
        "plans": spec.stats.plan_counts(),  # the tree shapes, chains and plain steps chosen
        "by_source": spec.stats.as_dict()["by_source"],  # lookup+eagle: the copy and head rounds apart
        **loaded.memory(),  # weights_bytes, kv_bytes_per_token
    }
    text_of = functools.lru_cache(maxsize=None)(lambda token: loaded.tokenizer.decode([token]))  # -1: V a position
    if prompt_logprobs is not None:
        report["prompt_logprobs"] = [None if t is None else t.as_dict(text_of) for t in done.prompt_logprobs]
    if logprobs is not None:
        report["logprobs"] = [t.as_dict(text_of) for t in done.logprobs]
    if compare:
        report["plain_tokens_per_s"] = done.plain.tokens_per_s
        report["speedup"] = report["tokens_per_s"] / report["plain_tokens_per_s"]
        report["identical"] = done.identical
        report["mismatch"] = done.mismatch
        report["first_difference"] = done.first_difference
    if as_json:
        print(json.dumps(report))
        return
    print(flush=True)
    if prompt_logprobs is not None:
        print_logprobs("prompt", prompt_ids, done.prompt_logprobs, text_of)
    if logprobs is not None:
        print_logprobs("new", spec.tokens, done.logprobs, text_of)
    line = (
        f"{report['new_tokens']} tokens in {report['seconds']:.2f} s: {report['tokens_per_s']:.1f} tok/s, "
        f"{report['mean_accepted']:.2f} tokens/round over {report['rounds']} rounds, "
        f"acceptance {report['acceptance_rate']:.0%}"
    )
    if compare:
        if not sampling.greedy:
            at = report["first_difference"]
            same = (f"output identical to plain decoding with seed {seed}" if at is None else
                    f"output differs from plain decoding with seed {seed} from token {at} on (the target's rows moved "
                    "between speculative and plain forwards in this dtype; in float32 they do not)")
        elif report["mismatch"] is None:
            same = "output identical to plain decoding"
        else:
            same = f"output {explain(report['mismatch'])}"
        line += f"; plain {report['plain_tokens_per_s']:.1f} tok/s, speedup {report['speedup']:.2f}x, {same}"
    print(line, file=sys.stderr)


def print_logprobs(where: str, tokens: Sequence[int], entries: Sequence[TokenLogprob | None],
                   text_of: Callable[[int], str]) -> None:
    """One line a token on stderr: where it is (`prompt` or `new`) and its index there, its
    text, log probability and rank, and the most likely tokens at its position with theirs."""
    quoted = lambda token: json.dumps(text_of(token), ensure_ascii=False)  # noqa: E731
    for i, (token, entry) in enumerate(zip(tokens, entries)):
        if entry is None:
            print(f"{where} {i}: {quoted(token)} (the first token: nothing before it to score it)", file=sys.stderr)
            continue
        top = "; top: " + ", ".join(f"{quoted(t)} {v:.4f}" for t, v in entry.top) if entry.top else ""
        print(f"{where} {i}: {quoted(token)} logprob {entry.logprob:.4f}, rank {entry.rank}{top}", file=sys.stderr)


def constrained(sampling: SamplingParams, loaded: LoadedModel, json_schema: str | None, regex: str | None,
                choice: list[str] | None, grammar_file: Path | None = None) -> SamplingParams:
    """`sampling` with the grammar of at most one of --json-schema, --regex, --choice, --grammar
    (`verispec.grammar`); ValueError with the reason for one that cannot compile or be read."""
    given = [(name, value) for name, value in (("--json-schema", json_schema), ("--regex", regex),
                                                ("--choice", choice), ("--grammar", grammar_file)) if value]
    if not given:
        return sampling
    if len(given) > 1:
        raise ValueError(f"give one of --json-schema, --regex, --choice and --grammar, got "
                         f"{' and '.join(n for n, _ in given)}")
    from verispec.grammar import GrammarCompiler

    compiler = GrammarCompiler(loaded.tokenizer, loaded.lm.vocab_size)
    name, value = given[0]
    try:
        if name == "--json-schema":
            path = Path(value)
            grammar = compiler.json_schema(path.read_text(encoding="utf-8") if path.suffix == ".json" else value)
        elif name == "--grammar":
            grammar = compiler.grammar(value.read_text(encoding="utf-8"))
        else:
            grammar = compiler.regex(value) if name == "--regex" else compiler.choice(value)
    except OSError as error:
        raise ValueError(f"{name}: cannot read {error.filename}: {error.strerror}") from None
    except ValueError as error:  # UnicodeDecodeError included
        raise ValueError(f"{name}: {error}") from None
    return replace(sampling, grammar=grammar)


def prompt_text(prompt: str | None) -> str:
    """The prompt as text: the argument, or standard input read as UTF-8. Bytes that are not
    UTF-8 (on standard input, or in an argument, where Python keeps them as lone surrogates)
    are refused with where they are, never passed to the tokenizer."""
    if prompt is not None:
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"the prompt is not UTF-8 text (an invalid byte at character {error.start + 1}); "
                             "give it as UTF-8") from None
        return prompt
    if not hasattr(sys.stdin, "buffer"):  # a text stream with no bytes below it: already decoded
        return sys.stdin.read()
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"standard input is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
                         f"{error.start}); convert it to UTF-8, e.g. with iconv -t UTF-8") from None


def check_context(loaded: LoadedModel, prompt_tokens: int, max_new_tokens: int) -> None:
    limit = loaded.context_limit
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ValueError(
            f"the prompt ({prompt_tokens} tokens) plus --max-new-tokens {max_new_tokens} exceeds the "
            f"model's context of {limit} tokens; shorten the prompt or ask for fewer tokens"
        )
