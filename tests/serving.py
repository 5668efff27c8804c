"""What the server tests share: a tiny real model on disk, a server on a free loopback port in a
thread (stopped by the test), raw HTTP for what the `openai` client will not send, and
/metrics read back as numbers."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from transformers.utils import logging as hf_logging

from verispec.batching import RegistryBuilder, Scheduler
from verispec.bench.quick import tiny_llama, tiny_tokenizer
from verispec.server import Limits, ServedModel, ServerApp
from verispec.server.run import Server, loopback_socket, make_server

NAME = "tiny"


def save_tiny_model(root: Path) -> Path:
    """A tiny Llama (context 2048, one token per byte, a chat template) saved as a checkpoint."""
    tokenizer = tiny_tokenizer()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tiny_llama(len(tokenizer)).save_pretrained(root)
        tokenizer.save_pretrained(root)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return root


@dataclass
class Running:
    app: ServerApp
    server: Server
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def connection(self, timeout: float = 30.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict | str]:
        """One request on a fresh connection; (status, the JSON body, or the text if not JSON)."""
        if isinstance(body, dict):
            body = json.dumps(body)
        connection = self.connection()
        try:
            connection.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
            response = connection.getresponse()
            raw = response.read().decode()
        finally:
            connection.close()
        try:
            return response.status, json.loads(raw)
        except json.JSONDecodeError:
            return response.status, raw

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics: (name, sorted labels but model_name) -> value."""
        status, text = self.request("GET", "/metrics")
        assert status == 200
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
                samples[sample.name, labels] = sample.value
        return samples

    def wait_idle(self, seconds: float = 20.0) -> None:
        """Until no request runs or waits and every slot is free (bounded)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = self.metrics()
            if m[("verispec:kv_slots_in_use", ())] == 0 and m[("verispec:num_requests_waiting", ())] == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"the server still holds requests after {seconds} s")


@contextlib.contextmanager
def running(loaded, *, proposer: str | None = "lookup", k: int | str = 3, max_slots: int = 4, max_waiting: int = 8,
            limits: Limits = Limits(), batch_costs=None, clock=time.perf_counter) -> Iterator[Running]:
    """A server for `loaded` (a `LoadedModel`) on a free loopback port, in a thread; stopped
    (drained) on leaving, within a bounded time. clock: the scheduler's (its requests' timings)."""
    served = ServedModel.of(loaded, NAME, proposer, k)
    scheduler = Scheduler(loaded.lm, RegistryBuilder(loaded), max_slots=max_slots, max_waiting=max_waiting,
                          batch_costs=batch_costs, max_context=served.context, clock=clock)
    app = ServerApp(served, scheduler, limits)
    server = make_server(app, log_level="warning", access_log=False)
    sock = loopback_socket()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield Running(app, server, sock.getsockname()[1])
    finally:
        server.stop()
        thread.join(timeout=limits.grace_seconds + 20)
        assert not thread.is_alive(), "the server did not stop"
        assert not app.engine.thread.is_alive(), "the engine thread did not stop"
