"""verispec: exact speculative decoding for causal language models."""

from verispec.engine import Decoding, Generation, generate, stream
from verispec.randomness import Random, TorchRandom
from verispec.sampling import GREEDY, SamplingParams
from verispec.stats import Stats

__version__ = "0.1.0"

__all__ = [
    "GREEDY",
    "Decoding",
    "Generation",
    "Random",
    "SamplingParams",
    "Stats",
    "TorchRandom",
    "__version__",
    "generate",
    "stream",
]
