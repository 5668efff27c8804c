"""`/metrics`: the server's counters in the Prometheus text format, under vLLM's names.

Speculation: `verispec:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total` and `..._num_accepted_tokens_per_pos_total{position="i"}`, as
vLLM names them (with the `verispec:` prefix for `vllm:`). A request adds its counts when it
ends, all at once, so each counter is exactly the sum of the `speculative_decoding` blocks of
the replies (and of requests whose client left: their rounds ran too). Tokens:
`verispec:prompt_tokens_total` and `verispec:generation_tokens_total` (the `usage` of the
replies), requests by finish reason (`verispec:request_success_total`). Latency histograms:
time to first token, time per output token (a request's decode time over its tokens after the
first) and end to end, from the request's arrival. Gauges, read at scrape time: running and
waiting requests, KV slots in use and in all.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "verispec:"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The server's metrics in a registry of their own (several servers in one process, as in
    the tests, do not share counters). gauges: name -> a function read at each scrape."""

    def __init__(self, model_name: str, gauges: dict[str, Callable[[], float]]) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.model = model_name
        self.drafts = Counter(f"{PREFIX}spec_decode_num_drafts", "Rounds that drafted tokens.", labels, registry=r)
        self.draft_tokens = Counter(f"{PREFIX}spec_decode_num_draft_tokens", "Drafted tokens.", labels, registry=r)
        self.accepted_tokens = Counter(
            f"{PREFIX}spec_decode_num_accepted_tokens", "Accepted drafted tokens.", labels, registry=r
        )
        self.accepted_per_pos = Counter(
            f"{PREFIX}spec_decode_num_accepted_tokens_per_pos",
            "Accepted drafted tokens at each draft position (0 is the first).",
            [*labels, "position"],
            registry=r,
        )
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens", "Prompt tokens of finished requests.", labels, registry=r)
        self.generation_tokens = Counter(
            f"{PREFIX}generation_tokens", "Completion tokens of finished requests (their usage).", labels, registry=r
        )
        self.requests = Counter(
            f"{PREFIX}request_success", "Finished requests by finish reason.", [*labels, "finished_reason"], registry=r
        )
        self.ttft = Histogram(
            f"{PREFIX}time_to_first_token_seconds", "Arrival to first token.", labels, buckets=TTFT_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            f"{PREFIX}time_per_output_token_seconds",
            "A request's decode time per token after the first.",
            labels,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            f"{PREFIX}e2e_request_latency_seconds", "Arrival to last token.", labels, buckets=E2E_BUCKETS, registry=r
        )
        for name, read in gauges.items():
            Gauge(f"{PREFIX}{name}", name.replace("_", " ").capitalize() + ".", registry=r).set_function(read)

    def record(
        self,
        *,
        arrival: float,
        finished: object,  # engine_thread.Finished
        prompt_tokens: int,
        completion_tokens: int,
        finish_reason: str,
    ) -> None:
        """One request's end: its speculation, tokens and latencies (times in perf_counter s)."""
        m, spec = self.model, finished.speculation
        self.drafts.labels(m).inc(spec.num_drafts)
        self.draft_tokens.labels(m).inc(spec.num_draft_tokens)
        self.accepted_tokens.labels(m).inc(spec.num_accepted_tokens)
        for position, accepted in enumerate(spec.num_accepted_tokens_per_pos):
            self.accepted_per_pos.labels(m, str(position)).inc(accepted)
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.generation_tokens.labels(m).inc(completion_tokens)
        self.requests.labels(m, finish_reason).inc()
        if finished.first_token is not None:
            self.ttft.labels(m).observe(max(0.0, finished.first_token - arrival))
            if completion_tokens > 1:
                self.tpot.labels(m).observe(max(0.0, finished.finished - finished.first_token) / (completion_tokens - 1))
        self.e2e.labels(m).observe(max(0.0, finished.finished - arrival))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
