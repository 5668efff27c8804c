"""`verispec serve`: one model behind an OpenAI-compatible HTTP server (`verispec.server`)."""

from __future__ import annotations

import ipaddress
import socket
import sys
import time
from typing import Annotated, Optional

import typer

from verispec.cli import BadInput, app
from verispec.cli.runtime_options import CacheTypeVOption, ConcurrencyOption, DeterministicOption, DeviceOption, RuntimeOption
from verispec.logprobs import MAX_TOP
from verispec.models import DEFAULT_MODEL
from verispec.proposers.trained import DEFAULT_PROPOSER_HELP
from verispec.registry import K_HELP, proposer_help
from verispec.runner import NO_PROPOSER, load_plan, specs


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="Embedded name, HF checkpoint directory or .gguf file.")] = DEFAULT_MODEL,
    proposer: Annotated[
        Optional[str],
        typer.Option(help=f"{proposer_help()} `none` decodes plainly.", show_default=DEFAULT_PROPOSER_HELP),
    ] = None,
    k: Annotated[str, typer.Option("--k", help=K_HELP)] = "auto",
    dtype: Annotated[
        str, typer.Option(help="auto, float32, bfloat16 or q4, as for `verispec generate`.")
    ] = "auto",
    runtime: RuntimeOption = "auto",
    deterministic: DeterministicOption = None,
    cache_type_v: CacheTypeVOption = None,
    device: DeviceOption = "auto",
    host: Annotated[
        str, typer.Option(help="Address to listen on; 127.0.0.1 keeps the server on this machine.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535)] = 8000,
    max_slots: Annotated[int, typer.Option("--max-slots", min=1, help="Requests decoded at once.")] = 8,
    concurrency: ConcurrencyOption = 1,
    max_waiting: Annotated[
        int, typer.Option("--max-waiting", min=0, help="Requests queued beyond the slots; past them, 429.")
    ] = 64,
    api_key: Annotated[
        Optional[str],
        typer.Option("--api-key", envvar="VERISPEC_API_KEY", show_default=False,
                     help="Require 'Authorization: Bearer KEY' on /v1/ (or set VERISPEC_API_KEY)."),
    ] = None,
    served_model_name: Annotated[
        Optional[str], typer.Option("--served-model-name", help="The name requests give as `model` [default: --model].")
    ] = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, help="The budget of a request that sets no max_tokens.")
    ] = 256,
    batch_costs: Annotated[
        bool,
        typer.Option("--batch-costs/--no-batch-costs",
                     help="With --k auto: measure the batched forward's cost at start, so each step's k "
                     "suits the batch (a seeded sampled request keeps its profile's k, so it reproduces)."),
    ] = True,
    grace: Annotated[
        float, typer.Option(min=0, help="Seconds requests in flight may run after SIGINT/SIGTERM.")
    ] = 10.0,
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes", min=1024)] = 1 << 20,
    max_logprobs: Annotated[
        int, typer.Option("--max-logprobs", min=-1,
                          help="vLLM's: the most alternatives a position's logprobs may list; -1 the whole "
                          "vocabulary, so that requests may ask for all of it (-1).")
    ] = MAX_TOP,
    access_log: Annotated[bool, typer.Option("--access-log/--no-access-log")] = False,
) -> int:
    """Serve MODEL over HTTP with OpenAI's completions and chat completions API, speculative
    decoding and continuous batching behind it; /metrics for Prometheus. Stops, draining the
    requests in flight, on Ctrl-C or SIGTERM. See docs/serving.md."""
    try:
        from verispec.server import Limits, ServedModel, ServerApp
        from verispec.server.run import make_server, serve_with_engine_here
        from verispec.server.start import started_scheduler
    except ImportError as error:
        raise BadInput(f"verispec serve needs the serve extra ({error.name} is missing): "
                       "pip install 'verispec[serve]'") from None
    if proposer == NO_PROPOSER:
        proposer_spec, k_spec = None, 0
    else:  # parsed once, here; the server and its requests keep the parsed specs
        proposer_spec, k_spec = specs(model, proposer, k)
    # the files, device, runtime and dtype (as generate weighs them unless --concurrency says more), before the port
    plan = load_plan(model, dtype, runtime, deterministic, device, proposer_spec, k_spec, concurrency, cache_type_v=cache_type_v)
    listener = listen(host, port)  # before loading: a taken port is reported at once
    from verispec.models.loading.load import build

    start = time.perf_counter()
    loaded = build(plan)
    print(f"loaded {model} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    if loaded.target_note:
        print(f"note: {loaded.target_note}", file=sys.stderr)
    served = ServedModel.of(loaded, served_model_name or model, proposer_spec, k_spec)
    scheduler = started_scheduler(loaded, served, max_slots=max_slots, max_waiting=max_waiting, batch_costs=batch_costs)
    limits = Limits(api_key=api_key, max_body_bytes=max_body_bytes, default_max_tokens=max_tokens,
                    grace_seconds=grace, max_logprobs=max_logprobs)
    server_app = ServerApp(served, scheduler, limits, engine_thread=False)  # forwards on the main thread
    where = f"http://{bracketed(host)}:{listener.getsockname()[1]}"
    reach = ("loopback only: other machines cannot reach it" if is_loopback(host)
             else "reachable from other machines; set --api-key and put TLS in front")
    print(f"verispec serve: {served.name} ({loaded.dtype_name}, {loaded.runtime} runtime), proposer "
          f"{proposer_spec or 'none'}, k {served.k_label}, {max_slots} slots", file=sys.stderr)
    print(f"listening on {where}/v1 ({reach}); metrics at {where}/metrics; Ctrl-C stops", file=sys.stderr, flush=True)
    server = make_server(server_app, log_level="info", access_log=access_log)
    serve_with_engine_here(server, [listener])
    return 0 if server.started else 1


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (an IPv4 or IPv6 address, or a name), or BadInput."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as error:
        raise BadInput(f"cannot listen on {host}:{port}: {error.strerror or error}; choose another --host or --port") from None
    return sock


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
