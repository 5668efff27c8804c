"""verispec: exact speculative decoding for causal language models."""

from verispec.batching import Job, QueueFull, RegistryBuilder, Scheduler
from verispec.engine import Decoding, Generation, generate, stream
from verispec.randomness import Random, TorchRandom
from verispec.request import Request
from verispec.sampling import GREEDY, SamplingParams
from verispec.stats import Stats
from verispec.tokenizer_contract import TokenizerReport, check_tokenizers

__version__ = "0.1.0"

__all__ = [
    "GREEDY",
    "Decoding",
    "Generation",
    "Job",
    "QueueFull",
    "Random",
    "RegistryBuilder",
    "Request",
    "SamplingParams",
    "Scheduler",
    "Stats",
    "TokenizerReport",
    "TorchRandom",
    "__version__",
    "check_tokenizers",
    "generate",
    "load_model",
    "stream",
]


def __getattr__(name: str):
    # Loaded on first use: it imports transformers, which takes seconds.
    if name == "load_model":
        from verispec.models.loading.load import load_model

        return load_model
    raise AttributeError(f"module 'verispec' has no attribute {name!r}")
