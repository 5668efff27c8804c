"""`verispec serve` under faults, on loopback only, every loop bounded in count and time: a
client killed mid-stream and one that leaves a whole reply free their slots; slow clients are
dropped while the others are served; a burst of 200 requests gets only replies and 429s; SIGINT
and SIGTERM under load drain the requests in flight and exit 0 with no traceback."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from serving import NAME, running, save_tiny_model
from verispec.models.loading.load import load_model
from verispec.batching import RegistryBuilder, Scheduler
from verispec.server import Limits, ServedModel, ServerApp
from verispec.server.run import loopback_socket, make_server

LONG = 1900  # tokens: the tiny model's context is 2048


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(model_dir)


def aborted(server) -> float:
    return server.metrics().get(("verispec:request_success_total", (("finished_reason", "abort"),)), 0.0)


def stream_head(port: int, body: dict) -> socket.socket:
    """A socket that sent a streamed request and read the start of its reply."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    received = b""
    while b"data:" not in received:
        received += sock.recv(4096)
    return sock


def test_a_client_killed_mid_stream_frees_its_slot(loaded):
    """A client process killed (SIGKILL) while its reply streams, and a socket closed the same way
    in this process: both requests end as aborted and their slots are free at once."""
    with running(loaded) as server:
        client = (
            "import openai, sys\n"
            f"c = openai.OpenAI(base_url='{server.base_url}', api_key='none', max_retries=0)\n"
            f"s = c.completions.create(model='{NAME}', prompt='Hello', max_tokens={LONG}, temperature=0, stream=True)\n"
            "for chunk in s:\n"
            "    print('streaming', flush=True)\n"
            "    sys.stdin.readline()\n"  # and wait to be killed
        )
        child = subprocess.Popen([sys.executable, "-c", client], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline() == "streaming\n"
        finally:
            child.kill()
            child.wait(timeout=10)
        stream_head(server.port, {"model": NAME, "prompt": "Hi", "max_tokens": LONG, "stream": True}).close()
        server.wait_idle(seconds=10)
        assert aborted(server) == 2


def test_a_client_that_leaves_a_whole_reply_frees_its_slot(loaded):
    with running(loaded) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        data = json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": LONG}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        deadline = time.monotonic() + 10
        while server.metrics()[("verispec:kv_slots_in_use", ())] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        sock.close()
        server.wait_idle(seconds=10)
        assert aborted(server) == 1


def test_slow_clients_are_dropped_and_the_others_served(loaded):
    """Ten connections sending their heads a byte at a time (slowloris), one whose body stalls:
    the heads are cut after head_seconds (2 s), the body gets 408, and requests meanwhile succeed."""
    limits = Limits(head_seconds=2.0, body_seconds=1.0)
    with running(loaded, limits=limits) as server:
        slow = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(10)]
        head = b"POST /v1/completions HTTP/1.1\r\nHost: slow\r\nX-Padding: " + b"a" * 100
        stalled = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"model\"")
        client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=10)
        dropped, served, start = set(), 0, time.monotonic()
        for i, byte in enumerate(head):  # one byte per connection per 30 ms: ~3 s, bounded by the head's length
            if len(dropped) == len(slow) or time.monotonic() - start > 5:
                break
            for n, sock in enumerate(slow):
                if n not in dropped:
                    try:
                        sock.sendall(bytes([byte]))
                    except OSError:
                        dropped.add(n)
            if i % 4 == 0:
                served += client.completions.create(model=NAME, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
            time.sleep(0.03)
        for n, sock in enumerate(slow):
            sock.settimeout(2)
            try:
                if sock.recv(100) == b"":
                    dropped.add(n)
            except OSError:
                dropped.add(n)
            sock.close()
        reply = stalled.recv(4096).decode()
        stalled.close()
    assert len(dropped) == len(slow) and served >= 3
    assert reply.startswith("HTTP/1.1 408") and "did not arrive within 1 s" in reply


def test_a_burst_of_200_requests_gets_replies_and_429s(loaded):
    with running(loaded, max_slots=2, max_waiting=4) as server:
        body = {"model": NAME, "prompt": "Hello", "max_tokens": 8, "temperature": 0}
        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(lambda _: server.request("POST", "/v1/completions", body), range(200)))
        statuses = [status for status, _ in results]
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(200) >= 6 and statuses.count(429) >= 1
        texts = {reply["choices"][0]["text"] for status, reply in results if status == 200}
        assert len(texts) == 1  # greedy: every reply the same
        busy = next(reply for status, reply in results if status == 429)["error"]
        assert busy["type"] == "rate_limit_error" and "retry later" in busy["message"]
        server.wait_idle()
        assert server.request("POST", "/v1/completions", body)[0] == 200
        m = server.metrics()
        assert m[("verispec:request_success_total", (("finished_reason", "length"),))] == statuses.count(200) + 1


def load_clients(base_url: str, n: int, started: threading.Barrier) -> tuple[list, list[threading.Thread]]:
    """n streaming clients of long replies; each records its finish reason or its error."""
    outcomes: list = [None] * n

    def stream(i: int) -> None:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=60)
        try:
            chunks = client.completions.create(model=NAME, prompt=f"Hello {i}", max_tokens=LONG, temperature=0,
                                               stream=True)
            reason = None
            for j, chunk in enumerate(chunks):
                if j == 0:
                    started.wait(timeout=60)
                reason = chunk.choices[0].finish_reason or reason
            outcomes[i] = reason
        except Exception as error:  # recorded, and the test fails on it
            outcomes[i] = error
            started.abort()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    return outcomes, threads


def test_sigint_under_load_drains_and_returns(loaded):
    """The server in this process's main thread, SIGINT sent to the process while 4 replies
    stream: the server returns, each stream ends with its last chunk ("abort" past the grace)."""
    served = ServedModel.of(loaded, NAME, "lookup", 3)
    app = ServerApp(served, Scheduler(loaded.lm, RegistryBuilder(loaded), max_slots=4, max_context=served.context),
                    Limits(grace_seconds=0.5))
    server = make_server(app, log_level="warning", access_log=False)
    sock = loopback_socket()
    started = threading.Barrier(5)
    outcomes, threads = [], []

    def when_streaming() -> None:
        while not server.started:
            time.sleep(0.02)
        nonlocal outcomes, threads
        outcomes, threads = load_clients(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", 4, started)
        started.wait(timeout=60)
        os.kill(os.getpid(), signal.SIGINT)

    trigger = threading.Thread(target=when_streaming, daemon=True)
    trigger.start()
    timer = threading.Timer(60, lambda: server.stop())  # a bound, should the signal be lost
    timer.start()
    try:
        server.run(sockets=[sock])  # returns once drained; a KeyboardInterrupt here fails the test
    finally:
        timer.cancel()
    trigger.join(timeout=10)
    for thread in threads:
        thread.join(timeout=10)
    assert all(reason in ("length", "abort") for reason in outcomes), outcomes
    assert not app.engine.thread.is_alive()


def test_sigterm_under_load_exits_0_without_a_traceback(model_dir):
    """`verispec serve` in a process of its own, SIGTERM while 4 replies stream."""
    command = [sys.executable, "-m", "verispec", "serve", "--model", str(model_dir), "--served-model-name", NAME,
               "--port", "0", "--k", "3",
               "--max-slots", "4", "--grace", "0.5"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while not any("listening on" in line for line in lines):
            line = process.stderr.readline()
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
        announced = "".join(lines)
        assert "loopback only" in announced
        port = re.search(r"http://127\.0\.0\.1:(\d+)/v1", announced).group(1)
        started = threading.Barrier(5)
        deadline = time.monotonic() + 30
        while True:  # uvicorn starts serving just after the announcement
            try:
                socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        outcomes, threads = load_clients(f"http://127.0.0.1:{port}/v1", 4, started)
        started.wait(timeout=60)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    for thread in threads:
        thread.join(timeout=10)
    assert process.returncode == 0, err
    assert "Traceback" not in err and "Error" not in err, err
    assert all(reason in ("length", "abort") for reason in outcomes), outcomes


def test_a_client_arriving_while_the_server_drains_gets_503(loaded):
    """After the stop signal the server listens on while a long reply drains: a new client
    gets the documented 503 in OpenAI's shape, not a refused connection; the stream in flight
    ends with its last chunk and [DONE]."""
    with running(loaded, limits=Limits(grace_seconds=1.5)) as server:
        sock = stream_head(server.port, {"model": NAME, "prompt": "Hi", "max_tokens": LONG, "stream": True})
        try:
            server.server.stop()
            deadline = time.monotonic() + 5
            while server.app.engine.accepting:  # the drain begins on the event loop
                assert time.monotonic() < deadline
                time.sleep(0.01)
            status, reply = server.request("POST", "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2})
            assert status == 503 and reply["error"]["code"] == "shutting_down", reply
            assert server.request("GET", "/health") == (503, {"status": "shutting down"})
            received = b""
            sock.settimeout(10)
            while b"[DONE]" not in received:
                chunk = sock.recv(65536)
                assert chunk, received[-300:]
                received += chunk
            reasons = re.findall(rb'"finish_reason":"(\w+)"', received)
            assert reasons and reasons[-1] in (b"abort", b"length", b"stop"), received[-300:]
        finally:
            sock.close()
