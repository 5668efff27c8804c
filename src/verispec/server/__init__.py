"""`verispec serve`: an OpenAI-compatible HTTP server over the batched engine.

    schemas        the request bodies, validated by pydantic where they enter
    engine_thread  the batch `Scheduler` stepped on a thread of its own
    output         one request's text as tokens arrive, cut at a stop string
    metrics        /metrics in the Prometheus format, under vLLM's names
    app            the Starlette application: endpoints, errors, streaming
    run            uvicorn with a graceful shutdown on SIGINT/SIGTERM

Needs the `serve` extra (`pip install 'verispec[serve]'`). docs/serving.md shows how to start
it, call it and read its metrics.
"""

from verispec.server.app import Limits, ServedModel, ServerApp

__all__ = ["Limits", "ServedModel", "ServerApp"]
