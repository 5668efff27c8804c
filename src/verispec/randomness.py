"""The one door through which randomness enters verispec.

Every random decision of the engine, the proposers and the verification rules is a call on an
injected `Random`:
- `bernoulli(prob)` and `categorical(probs)`: draws from the request's own stream, in the order
  the engine makes them (the token, block and point-mass rules; drafts verified by them);
- `race(position, probs, choice)`: the keyed sample at an absolute position of the sequence,
  the winner of the exponential race argmin_x E_x / probs[x] (the Gumbel-max trick,
  argmax_x log probs[x] + G_x with G = -log E), where E [V] is i.i.d. Exp(1) noise keyed by
  (seed, position, choice) alone. Two races at one key share their noise: a draft sampled from
  q and the target's sample from p at the same position are coupled, and a position's sample
  does not depend on how many draws came before it, so a seeded request's tokens are a pure
  function of (model, prompt, parameters, seed) (the coupled rule, `verispec.verify.coupled`);
- `draw(position, probs, choice)`: a proposer's sampled draft token: the stream's categorical,
  or the keyed race where the round's rule is the coupled one (`Round`).

`TorchRandom` is the seeded default; the exhaustive audit substitutes a `ScriptedRandom`
(`verispec.audit.enumerate`) that walks every outcome of every call, weighing each by its exact
probability (a race's by the joint law of races sharing their noise).

Keyed noise, exactly and cheaply (`keyed_race`): the vocabulary is cut into blocks of
`BLOCK` ids. Block b's smallest E, M_b ~ Exp(|b|), comes from one generator keyed by (seed,
position, choice); the id that holds it is uniform in the block, and every other id's E is
M_b + Exp(1), drawn from a generator keyed by (seed, position, choice, b) (the minimum of n
Exp(1) is Exp(n), its place uniform and independent, and Exp(1) is memoryless, so these E are
i.i.d. Exp(1) whatever the probabilities). No id of block b can win when M_b / max_b probs >=
the best ratio found so far, so only the blocks that can hold the winner are expanded: the
noise is a function of the key alone, yet its cost is a pass over the probabilities and a few
blocks. The generators are SplitMix64 counters (output i a function of the key and i alone),
run on the host, so a keyed sample replays on any device.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import torch

BLOCK = 64
"""Ids per block of keyed noise (`keyed_race`)."""

_WORD = 2**64


class Random(Protocol):
    def bernoulli(self, prob: float) -> bool:
        """True with probability `prob` (0 <= prob <= 1)."""
        ...

    def categorical(self, probs: torch.Tensor) -> int:
        """An index drawn from `probs` (float64 [V], non-negative, summing to 1)."""
        ...

    def race(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        """The keyed sample from `probs` (float64 [V]) at absolute `position`: argmin_x
        E_x / probs[x], E the noise keyed by (seed, position, choice)."""
        ...

    def draw(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        """A proposer's sampled token at `position`: `categorical(probs)` here, the keyed race
        within a coupled round (`Round`)."""
        ...


class TorchRandom:
    """Seeded default. The stream: one float64 uniform u per call from a seeded
    `torch.Generator`; `bernoulli` is u < prob; `categorical` inverts the CDF: the first index
    whose cumulative mass exceeds u * total, never an index of probability 0 (far faster than
    torch.multinomial over a large vocabulary: docs/results/implementation-choices.md). `race` draws nothing from the stream: its noise
    is keyed by (seed, position, choice) (`keyed_race`)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def bernoulli(self, prob: float) -> bool:
        return float(torch.rand((), generator=self.generator, dtype=torch.float64)) < prob

    def categorical(self, probs: torch.Tensor) -> int:
        cdf = torch.cumsum(probs, dim=0)
        total = float(cdf[-1])
        if not 0 < total < math.inf:
            # NaN or no mass: the search would return len(probs), which is no token at all.
            raise ValueError(_no_mass(total))
        u = float(torch.rand((), generator=self.generator, dtype=torch.float64))
        return int(torch.searchsorted(cdf, u * total, right=True))

    def race(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return keyed_race(self.seed, position, choice, probs)

    def draw(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.categorical(probs)


def keyed_race(seed: int, position: int, choice: int, probs: torch.Tensor) -> int:
    """argmin_x E_x / probs[x] over float64 probs [V] (on the host), E i.i.d. Exp(1) keyed by
    (seed, position, choice) (`keyed_noise`): block minima first, then only the blocks that
    can hold the winner (module docstring). Ties (probability 0) go to the lower id."""
    vocab = probs.shape[0]
    blocks = -(-vocab // BLOCK)
    padded = probs if vocab == blocks * BLOCK else torch.nn.functional.pad(probs, (0, blocks * BLOCK - vocab))
    peaks = padded.view(blocks, BLOCK).amax(dim=1).numpy()  # [blocks] (torch's reduction: faster than numpy's, docs/results/implementation-choices.md)
    total = float(peaks.sum())
    if not 0 < total < math.inf:
        raise ValueError(_no_mass(total))
    padded = padded.numpy()
    noise = _Noise(seed, position, choice, vocab)
    bounds = np.divide(noise.minima, peaks, out=np.full(blocks, math.inf), where=peaks > 0)  # [blocks]

    def best(chosen: np.ndarray) -> tuple[float, int]:
        """The least (ratio, id) within blocks `chosen` [n] (ascending)."""
        ids, values = noise.blocks(chosen)
        mass = padded[ids]
        ratios = np.divide(values, mass, out=np.full(len(ids), math.inf), where=mass > 0)
        j = int(np.argmin(ratios))  # the lower id on a tie: ids ascend
        return float(ratios[j]), int(ids[j])

    first = int(np.argmin(bounds))
    ratio, winner = best(np.array([first]))
    rest = np.flatnonzero(bounds <= ratio)
    rest = rest[rest != first]
    if len(rest):
        other, candidate = best(rest)
        if other < ratio or (other == ratio and candidate < winner):
            winner = candidate
    return winner


def keyed_noise(seed: int, position: int, choice: int, vocab: int) -> np.ndarray:
    """The whole noise E [vocab] of one key, float64 Exp(1): what `keyed_race` reads of it
    lazily, so that argmin_x E_x / probs[x] is its winner for every probs."""
    noise = _Noise(seed, position, choice, vocab)
    ids, values = noise.blocks(np.arange(len(noise.minima)))
    return values[ids < vocab]


class _Noise:
    """One key's noise by blocks: `minima` [blocks], M_b ~ Exp(|b|), and `blocks` for the
    values of chosen blocks (the minimum at a uniform place, M_b + Exp(1) elsewhere)."""

    def __init__(self, seed: int, position: int, choice: int, vocab: int) -> None:
        self.minima_stream, self.place_stream, self.noise_stream = (
            _stream(seed, position, choice, part) for part in range(3)
        )
        blocks = -(-vocab // BLOCK)
        self.sizes = np.full(blocks, BLOCK, dtype=np.float64)  # [blocks]
        self.sizes[-1] = vocab - (blocks - 1) * BLOCK
        self.minima = _exponential(self.minima_stream, np.arange(blocks, dtype=np.uint64)) / self.sizes

    def blocks(self, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n * BLOCK], values [n * BLOCK]) of blocks `chosen` [n]; ids past the vocabulary
        (the last block's padding) carry values that no id of the vocabulary is given."""
        ids = (chosen[:, None] * BLOCK + np.arange(BLOCK)).ravel()
        values = self.minima[chosen][:, None] + _exponential(self.noise_stream, ids.astype(np.uint64)).reshape(-1, BLOCK)
        places = (_uniform(self.place_stream, chosen.astype(np.uint64)) * self.sizes[chosen]).astype(np.int64)
        values[np.arange(len(chosen)), places] = self.minima[chosen]
        return ids, values.ravel()


_GAMMA_INT = 0x9E3779B97F4A7C15
_GAMMA = np.uint64(_GAMMA_INT)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea and Flood 2014), on uint64 arrays (wrapping)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _stream(seed: int, position: int, choice: int, part: int) -> np.uint64:
    """The SplitMix64 seed of one key's stream: (seed, position, choice, part) mixed in turn."""
    z = 0
    for word in (seed, position, choice, part):
        z = (z + (word % _WORD) * _GAMMA_INT + _GAMMA_INT) % _WORD
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % _WORD
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % _WORD
        z ^= z >> 31
    return np.uint64(z)


def _uniform(stream: np.uint64, counters: np.ndarray) -> np.ndarray:
    """Float64 uniforms in [0, 1): SplitMix64's outputs number `counters` [n] of `stream`
    (counter-based: output i is the finaliser of stream + (i + 1) * gamma), 53 bits each."""
    bits = _mix(stream + (counters + np.uint64(1)) * _GAMMA)  # uint64 arrays wrap silently
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _exponential(stream: np.uint64, counters: np.ndarray) -> np.ndarray:
    """Exp(1) noise -log(1 - u) from the uniforms of `_uniform` (1 - u lies in (0, 1])."""
    return -np.log1p(-_uniform(stream, counters))


def _no_mass(total: float) -> str:
    return (f"cannot draw from probabilities summing to {total}; they must be non-negative with a "
            "positive finite sum (check the logits and the sampling transforms)")


class Round:
    """One round's view of a request's `Random`, for its proposer and its rule: positions are
    counted from the round's first new token (`start`, the absolute position of row 0), so
    row i's keyed sample is `race(i, p[i])` at absolute position start + i. `keyed`: whether
    proposers' sampled drafts are keyed races (the coupled rule's rounds) or stream draws."""

    def __init__(self, base: Random, start: int, keyed: bool) -> None:
        self.base, self.start, self.keyed = base, start, keyed

    def bernoulli(self, prob: float) -> bool:
        return self.base.bernoulli(prob)

    def categorical(self, probs: torch.Tensor) -> int:
        return self.base.categorical(probs)

    def race(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.base.race(self.start + position, probs, choice)

    def draw(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.race(position, probs, choice) if self.keyed else self.base.categorical(probs)


class NoDraws:
    """A `Random` for a call that must not draw, such as a deterministic copy proposer asked
    which source will draft (`CopyOrHead.source`): a draw there would shift the request's
    random stream, so it is refused."""

    def bernoulli(self, prob: float) -> bool:
        raise RuntimeError("this call must not draw randomness (bernoulli was called)")

    def categorical(self, probs: torch.Tensor) -> int:
        raise RuntimeError("this call must not draw randomness (categorical was called)")

    def race(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        raise RuntimeError("this call must not draw randomness (race was called)")

    def draw(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        raise RuntimeError("this call must not draw randomness (draw was called)")


NO_DRAWS = NoDraws()
