"""Load on any OpenAI-compatible server: closed loops at concurrency 1, 4 and 8 over a prompt
file, reporting aggregate output tok/s, TTFT and TPOT percentiles per level. The same command
measures `verispec serve`, llama-cpp-python's server (`python -m llama_cpp.server`) and vLLM.

    .venv/bin/python benchmarks/serve_load.py --url http://127.0.0.1:8000/v1 --model NAME
        [--prompts FILE.jsonl ...] [--categories a,b] [--limit-per-category N]
        [--concurrency 1,4,8] [--max-new-tokens 128] [--repeats 1] [--max-seconds 300]
        [--api-key KEY] [--json OUT]

Prompts: Spec-Bench rows go to /v1/chat/completions as one user turn, HumanEval rows to
/v1/completions as raw text, greedy (temperature 0), the same rows `verispec bench --prompts`
reads (default: Spec-Bench's dev file in ../shared/data). Each level keeps exactly c requests
in flight while prompts remain (each prompt once per repeat, in file order), after one
discarded warm-up request; a level also stops starting requests after --max-seconds.

Per level: requests, output tokens (each reply's usage, from `stream_options.include_usage`;
where a server sends none, its content chunks are counted and the table says so), wall
seconds from the first request to the last reply, aggregate tok/s (tokens / wall), TTFT
(request sent to first content) and TPOT ((last content - first content) / (tokens - 1)) at
p50/p90/p99, and for verispec the mean tokens per round from its `speculative_decoding`.
Timings are only meaningful on a machine running nothing else; docs/serving.md has the
commands that compare a server with the library and with llama.cpp.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from verispec.bench.workloads import Workload, data_file, read_workloads, select

REPOSITORY = Path(__file__).resolve().parents[1]


@dataclass
class Sample:
    """One request: seconds from sending to its first and last content, its output tokens
    (counted: from usage, else content chunks), and verispec's tokens per round if given."""

    ttft: float
    last: float
    tokens: int
    usage_reported: bool
    tokens_per_round: float | None = None


@dataclass
class Level:
    concurrency: int
    requests: int = 0
    tokens: int = 0
    seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def summary(self) -> dict:
        ttft = [s.ttft for s in self.samples]
        tpot = [(s.last - s.ttft) / (s.tokens - 1) for s in self.samples if s.tokens > 1]
        rounds = [s.tokens_per_round for s in self.samples if s.tokens_per_round is not None]
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": len(self.errors),
            "output_tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "ttft_s": percentiles(ttft),
            "tpot_s": percentiles(tpot),
            "usage_reported": all(s.usage_reported for s in self.samples),
            "tokens_per_round": statistics.fmean(rounds) if rounds else None,
        }


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    ordered = sorted(values)

    def at(q: float) -> float:  # nearest rank
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99)}


async def one_request(client, model: str, workload: Workload, max_tokens: int) -> Sample:
    """Stream one greedy request; its timings and token count."""
    start = time.perf_counter()
    first = last = None
    chunks, usage, per_round = 0, None, None
    common = dict(model=model, max_tokens=max_tokens, temperature=0, stream=True,
                  stream_options={"include_usage": True})
    if workload.chat:
        stream = await client.chat.completions.create(messages=[{"role": "user", "content": workload.text}], **common)
    else:
        stream = await client.completions.create(prompt=workload.text, **common)
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        extra = chunk.model_extra or {}
        if isinstance(extra.get("speculative_decoding"), dict):
            per_round = extra["speculative_decoding"].get("tokens_per_round")
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text = (choice.delta.content if workload.chat else choice.text) or ""
        if text:
            chunks += 1
            first = now if first is None else first
            last = now
    if first is None:
        first = last = time.perf_counter()
    return Sample(first - start, last - start, usage if usage is not None else chunks, usage is not None, per_round)


async def run_level(client, model: str, prompts: list[Workload], concurrency: int, max_tokens: int,
                    max_seconds: float) -> Level:
    """A closed loop: c workers take the next prompt as each reply ends."""
    level = Level(concurrency)
    queue = list(reversed(prompts))
    start = time.perf_counter()

    async def worker() -> None:
        while queue and time.perf_counter() - start < max_seconds:
            workload = queue.pop()
            try:
                sample = await one_request(client, model, workload, max_tokens)
            except Exception as error:  # reported, never retried
                level.errors.append(f"{workload.id}: {type(error).__name__}: {error}")
                continue
            level.samples.append(sample)
            level.requests += 1
            level.tokens += sample.tokens

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    level.seconds = time.perf_counter() - start
    return level


def table(levels: list[dict]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f}"

    lines = ["| c | requests | errors | tokens | s | tok/s | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms | tokens/round |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in levels:
        t, p = s["ttft_s"], s["tpot_s"]
        tokens = f"{s['output_tokens']}" + ("" if s["usage_reported"] else " (chunks)")
        per_round = "-" if s["tokens_per_round"] is None else f"{s['tokens_per_round']:.2f}"
        lines.append(f"| {s['concurrency']} | {s['requests']} | {s['errors']} | {tokens} | {s['seconds']:.1f} | "
                     f"{s['tokens_per_second']:.1f} | {ms(t['p50'])}/{ms(t['p90'])}/{ms(t['p99'])} | "
                     f"{ms(p['p50'])}/{ms(p['p90'])}/{ms(p['p99'])} | {per_round} |")
    return "\n".join(lines)


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"--concurrency takes integers >= 1 separated by commas, got {text!r}")
    return levels


async def measure(args: argparse.Namespace, prompts: list[Workload]) -> list[dict]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=args.timeout)
    await one_request(client, args.model, prompts[0], min(8, args.max_new_tokens))  # warm-up, discarded
    summaries = []
    for concurrency in args.concurrency:
        level = await run_level(client, args.model, prompts * args.repeats, concurrency, args.max_new_tokens,
                                args.max_seconds)
        summaries.append(level.summary())
        for error in level.errors[:3]:
            print(f"c={concurrency}: {error}", file=sys.stderr)
        print(f"c={concurrency}: {level.requests} requests, {level.tokens_per_second:.1f} tok/s", file=sys.stderr)
    await client.close()
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's /v1 base URL")
    parser.add_argument("--model", required=True, help="the model name the server serves (GET /v1/models)")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--prompts", type=Path, action="append",
                        help="Spec-Bench or HumanEval .jsonl (repeatable) [default: ../shared/data/specbench_dev.jsonl]")
    parser.add_argument("--categories", default=None)
    parser.add_argument("--limit-per-category", type=int, default=None)
    parser.add_argument("--concurrency", type=parse_levels, default=[1, 4, 8])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="per level: no request starts after this")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("--json", type=Path, default=None, help="write the levels' summaries here")
    args = parser.parse_args(argv)
    files = args.prompts or [data_file("specbench_dev.jsonl", REPOSITORY)]
    categories = args.categories.split(",") if args.categories else None
    prompts = select([w for path in files for w in read_workloads(path)], categories, args.limit_per_category)
    if not prompts:
        parser.error("no prompts selected")
    summaries = asyncio.run(measure(args, prompts))
    print(table(summaries))
    if args.json:
        args.json.write_text(json.dumps({"url": args.url, "model": args.model, "prompts": [str(f) for f in files],
                                         "max_new_tokens": args.max_new_tokens, "levels": summaries}, indent=2))
    return 1 if any(s["errors"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
