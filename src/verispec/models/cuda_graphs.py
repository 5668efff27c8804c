"""`ShapeGraphs`: one CUDA graph per forward shape, captured on first use and replayed after.

A decoding step on a GPU is a few hundred small kernels; launched one at a time from Python
the host, not the GPU, sets the pace (verispec's transformers runtime ran every Llama shape from
135M to 8B at 55-60 tokens/s on an H200). A CUDA graph records the launches of one forward once
and replays them as one: the static runtime's forward has a fixed set of shapes (row and slot
buckets over a static cache), so one graph per shape covers every step.

`run(tokens, positions)` must be capturable: no host synchronisation (no `.item()`, no
shape that depends on values), inputs read only from the two tensors given, outputs a tuple
of tensors. Each graph keeps static copies of its inputs; a call copies the new inputs into
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

Run = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]


@dataclass
class Captured:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor  # [B, R] the graph's own input
    positions: torch.Tensor  # [B, R]
    outputs: tuple[torch.Tensor, ...]


class ShapeGraphs:
    """Graphs of `run` keyed by (shape, key): `key` names what else fixes the captured work
    (the feature taps a forward returns)."""

    def __init__(self) -> None:
        self.graphs: dict[tuple, Captured] = {}
        self.pool = None

    def clear(self) -> None:
        """Forget every graph (the buffers they read were reallocated)."""
        self.graphs.clear()

    def __call__(self, run: Run, tokens: torch.Tensor, positions: torch.Tensor, key: tuple = ()) -> tuple[torch.Tensor, ...]:
        index = (tuple(tokens.shape), key)
        captured = self.graphs.get(index)
        if captured is None:
            captured = self.graphs[index] = self._capture(run, tokens, positions)
        captured.tokens.copy_(tokens)
        captured.positions.copy_(positions)
        captured.graph.replay()
        return captured.outputs

    def _capture(self, run: Run, tokens: torch.Tensor, positions: torch.Tensor) -> Captured:
        tokens, positions = tokens.clone(), positions.clone()
        side = torch.cuda.Stream(device=tokens.device)
        side.wait_stream(torch.cuda.current_stream(tokens.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                run(tokens, positions)
        torch.cuda.current_stream(tokens.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = run(tokens, positions)
        return Captured(graph, tokens, positions, outputs)
