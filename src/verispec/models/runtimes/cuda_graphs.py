"""`ShapeGraphs`: one CUDA graph per forward shape, captured on first use and replayed after.

A decoding step on a GPU is a few hundred small kernels; launched one at a time from Python
the host, not the GPU, sets the pace (verispec's transformers runtime ran every Llama shape from
135M to 8B at 55-60 tokens/s on an H200). A CUDA graph records the launches of one forward once
and replays them as one: the static runtime's forward has a fixed set of shapes (row and slot
buckets over a static cache), so one graph per shape covers every step.

`run(tokens, *inputs)` must be capturable: no host synchronisation (no `.item()`, no
shape that depends on values), inputs read only from the tensors given, outputs a tuple of
tensors. Each graph keeps static copies of its inputs; a call copies the new inputs into
them, replays, and returns the graph's own output tensors, which the next replay of the same
shape overwrites (callers copy what they keep). All graphs share one memory pool.
The first call of a shape runs `run` twice eagerly on a side stream (cuBLAS and the attention
kernels allocate their workspaces outside the capture), then captures; whatever `run` writes
besides its outputs (the KV cache) it writes three times with the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Run = Callable[..., tuple[torch.Tensor, ...]]


@dataclass
class Captured:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]  # the graph's own inputs: tokens [B, R] first
    outputs: tuple[torch.Tensor, ...]


class ShapeGraphs:
    """Graphs of `run` keyed by (the inputs' shapes, key): `key` names what else fixes the
    captured work (the feature taps a forward returns)."""

    def __init__(self) -> None:
        self.graphs: dict[tuple, Captured] = {}
        self.pool = None

    def clear(self) -> None:
        """Forget every graph (the buffers they read were reallocated)."""
        self.graphs.clear()

    def __call__(self, run: Run, *inputs: torch.Tensor, key: tuple = ()) -> tuple[torch.Tensor, ...]:
        """`run(*inputs)` replayed from the graph of the inputs' shapes."""
        index = (tuple(tuple(given.shape) for given in inputs), key)
        captured = self.graphs.get(index)
        if captured is None:
            captured = self.graphs[index] = self._capture(run, inputs)
        for static, given in zip(captured.inputs, inputs):
            static.copy_(given)
        captured.graph.replay()
        return captured.outputs

    def _capture(self, run: Run, inputs: tuple[torch.Tensor, ...]) -> Captured:
        inputs = tuple(given.clone() for given in inputs)
        device = inputs[0].device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                run(*inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = run(*inputs)
        return Captured(graph, inputs, outputs)
