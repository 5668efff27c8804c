"""Running a `ServerApp` on uvicorn: graceful shutdown on SIGINT/SIGTERM with exit status 0,
and clients that never finish their request's head are dropped.

uvicorn already stops accepting on a signal, lets open responses finish and then runs the
app's shutdown. Three things are changed: the signal also starts the app's drain at once (in
flight requests get `grace_seconds` before they end with finish_reason "abort", so a stream
ends with its last chunk, not a cut connection); the server goes on listening until the drain
has ended, so a client arriving meanwhile gets the app's 503 rather than a refused connection;
and the signal is not raised again once the server has stopped (uvicorn does, so the process
would end by the signal rather than exit 0).

    >>> server = make_server(app, host="127.0.0.1", port=8000)
    >>> server.run()                         # until SIGINT or SIGTERM; returns once drained
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Iterator

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from verispec.server.app import ServerApp

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class HeadTimeoutH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection that has not sent a whole request head
    within `head_seconds` (the app's `Limits`) of opening or of its last response (a slowloris client holds a
    connection open by sending its head a byte at a time; uvicorn would wait forever)."""

    head_seconds = 10.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self) -> None:
        cycle = self.cycle
        self.loop.call_later(self.head_seconds, self._drop_if_no_head, cycle)

    def _drop_if_no_head(self, cycle: object) -> None:
        waiting = self.cycle is cycle and (cycle is None or cycle.response_complete)
        if waiting and not self.transport.is_closing():
            self.transport.close()


class Server(uvicorn.Server):
    """uvicorn's server, draining `app` as soon as a signal (or `stop`) asks it to exit."""

    def __init__(self, config: uvicorn.Config, app: ServerApp) -> None:
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig: int, frame: object) -> None:
        self.app.begin_shutdown()
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Listen on while the app drains: a new request is answered with 503 ("shutting down").
        await self.app.drained()
        await super().shutdown(sockets)

    def stop(self) -> None:
        """Ask the server to drain and exit (from any thread)."""
        self.handle_exit(signal.SIGTERM, None)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # As uvicorn's, without raising the caught signal again after the shutdown.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def serve_with_engine_here(server: Server, sockets: list[socket.socket]) -> None:
    """Run `server` (uvicorn, its event loop) on a thread of its own and the app's engine on
    this one, the main thread (`EngineThread.run_here` says why); SIGINT and SIGTERM drain it
    as `Server` does, and this returns once both have stopped."""
    original = {sig: signal.signal(sig, server.handle_exit) for sig in SIGNALS}
    ended = threading.Event()

    def run() -> None:
        try:
            server.run(sockets=sockets)
        finally:
            ended.set()

    loop_thread = threading.Thread(target=run, name="verispec-http", daemon=True)
    loop_thread.start()
    try:
        server.app.engine.run_here(until=ended)
        loop_thread.join()
    finally:
        for sig, handler in original.items():
            signal.signal(sig, handler)


def make_server(app: ServerApp, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
                access_log: bool = True, limit_concurrency: int | None = 1024) -> Server:
    """A uvicorn server for `app`; its graceful-shutdown backstop is the app's grace period
    and a little more (requests are cancelled by then, so their connections close)."""
    config = uvicorn.Config(
        app.asgi,
        host=host,
        port=port,
        interface="asgi3",  # `app.asgi` is a bound method, which uvicorn would take for ASGI 2
        http=type("HeadTimeoutH11", (HeadTimeoutH11,), {"head_seconds": app.limits.head_seconds}),
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        limit_concurrency=limit_concurrency,
        timeout_graceful_shutdown=int(app.limits.grace_seconds) + 5,
    )
    return Server(config, app)


def loopback_socket() -> socket.socket:
    """A listening socket on 127.0.0.1 at a free port (for tests: no race for the port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock
