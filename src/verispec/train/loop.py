"""Fitting a head to the target: vocabulary, batches, the loss with its unroll, checkpoints.

Loss. At every scored position u (the answer's; with `score="turns"` the user's turn's too,
text the target reads, whose p is as exact a label as its answers') the target's next-token
distribution is p_u = softmax(FINAL_u @ W^T) (W the target's output weight). The head drafts
only its vocabulary d2t, so its q is zero elsewhere; among such q the acceptance
sum_x min(p, q) is largest (= p(d2t)) exactly when q >= p on d2t, and p renormalised on d2t is
the one such q that is also the target's own shape. The loss is therefore the soft
cross-entropy H(p|d2t, q) over the N head tokens, whose minimiser is q = p|d2t: no "outside"
bucket, which q could not spend anyway.

EAGLE's unroll (training-time test, Li et al. 2503.01840). Step 0 is teacher forcing: pair
(feature t, token t + 1) -> logits for token t + 2 and a predicted feature of t + 1. Step j
feeds step j - 1's predicted features back, as drafting does, and predicts token t + 2 + j.
The query of anchor t at step j sits at position t + j and attends to the true pairs 0..t
(step 0) and to its own earlier steps (anchor t of steps 1..j), the keys drafting would have
cached; the mask is causal over step 0 and diagonal over each later step.

Medusa: head i at row t predicts token t + 2 + i from the feature of t alone (no unroll).

Determinism: the batches are a function of the seed (epoch e uses the permutation of
`torch.Generator().manual_seed(seed * 1000 + e)`), the learning rate of the step count only
(a decay is planned over `--steps`, never over the time budget),
so a run stopped by its time budget at step s equals every other run with that seed at step
s, and a resumed run continues exactly where the checkpoint left off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from verispec.heads import Eagle3Head, EagleHead, HeadConfig, HeadKind, MedusaHead, TargetInfo, default_layer, eagle3_layers, new_head
from verispec.models.base import FINAL, Tap

Head = EagleHead | Eagle3Head | MedusaHead
EAGLES = (EagleHead, Eagle3Head)  # the heads that draft autoregressively in feature space (unrolled)


@dataclass(frozen=True)
class TrainSettings:
    """What a training run is a function of, besides the data and the time it gets."""

    kind: HeadKind  # eagle, eagle3 (the standard EAGLE-3 layer, `heads.eagle3`) or medusa
    seed: int = 0
    taps: str = "eagle3"  # "eagle3": FINAL-free low/mid/high fused (EAGLE-3); "final": FINAL only (EAGLE-1, Medusa)
    vocab_size: int = 8192  # N, the head vocabulary (most frequent tokens of the data)
    unroll: int = 3  # EAGLE: training-time test steps; Medusa: its K heads
    depth: int = 1  # EAGLE: decoder layers
    lr: float = 1e-3
    warmup_steps: int = 20
    steps: int | None = None  # the run's planned length (--steps), which `decay` needs
    decay: float = 0.0  # share of `steps` at the end over which the learning rate falls linearly to 0
    weight_decay: float = 0.0
    batch_tokens: int = 4096  # padded tokens per batch
    sort_window: int = 256  # an epoch's sequences are sorted by length in windows of this many, so a batch pads little
    feature_weight: float = 0.1  # EAGLE on FINAL only: weight of the predicted-feature regression
    holdout: float = 0.05  # share of sequences held back to measure draft accuracy
    eval_every: int = 100  # steps between held-back evaluations; the best evaluated head is kept
    bf16: bool = False  # matrix products under bfloat16 autocast (weights and optimizer stay float32)
    score: str = "answers"  # fitted positions: "answers" (the target's answers) or "turns" (the user's words too)
    init: str | None = None  # the head directory fitting started from (its weights and d2t); None: fresh weights

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", HeadKind(self.kind))
        if not 0 <= self.decay <= 1 or (self.decay > 0 and self.steps is None):
            raise ValueError(f"decay {self.decay} needs 0 <= decay <= 1 and, when above 0, the planned steps")

    def head_taps(self, num_layers: int) -> tuple[Tap, ...]:
        return taps_for(self.kind, self.taps, num_layers)

    def as_dict(self) -> dict:
        return {**asdict(self), "kind": str(self.kind)}  # plain values: a checkpoint loads with weights_only


def taps_for(kind: HeadKind, taps: str, num_layers: int) -> tuple[Tap, ...]:
    """The features a `kind` head reads with `--taps taps` on a target of `num_layers` layers."""
    if kind == HeadKind.EAGLE3:  # vLLM feeds an EAGLE-3 head its low, middle and high layers
        return eagle3_layers(num_layers)
    if taps == "final" or kind == HeadKind.MEDUSA:
        return (FINAL,)
    return eagle3_layers(num_layers)


def choose_vocab(tokens: torch.Tensor, size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """d2t: the `size` most frequent ids of `tokens` [N] (ties to the lower id), plus `always`
    (the end-of-turn ids), sorted; fewer when the data holds fewer distinct ids."""
    counts = torch.bincount(tokens.long(), minlength=max(always, default=-1) + 1)
    if always:
        counts[list(always)] = counts.max() + 1
    seen = int((counts > 0).sum())
    # A stable sort of -counts keeps lower ids first among equal counts.
    order = torch.sort(-counts, stable=True).indices[: min(size, seen)]
    return order.sort().values


@dataclass
class Batch:
    """Right-padded sequences and what the loss needs of them.

    ids [B, T] long; features [B, T, F] float32 (the head's taps, concatenated); final [B, T, H]
    float32 (FINAL: the target's logits are final @ W^T); argmax [B, T] long (the target's top
    token after each position); logsumexp [B, T] float32 (of the target's full logits); scored [B, T] bool (p_u is a
    loss target: the next token belongs to the answer, or with `positions="turns"` to the user's turn too);
    valid [B, T] bool (a real position)."""

    ids: torch.Tensor
    features: torch.Tensor
    final: torch.Tensor
    argmax: torch.Tensor
    logsumexp: torch.Tensor
    scored: torch.Tensor
    valid: torch.Tensor

    @property
    def tokens(self) -> int:
        return int(self.valid.sum())


def heldout_split(count: int, seed: int, holdout: float) -> tuple[list[int], list[int]]:
    """(held back, trained on): indices of `count` sequences, each list ascending. The first
    round(holdout * count) of a permutation drawn from `seed` are held back (at least one when
    there are two or more sequences)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    held = max(1, round(holdout * count)) if count > 1 else 0
    return sorted(order[:held].tolist()), sorted(order[held:].tolist())


def heldout_split_by_part(parts: Sequence[tuple[int, int]], holdout: float) -> tuple[list[int], list[int]]:
    """`heldout_split` within each part, a data directory's (sequences, seed that made them), in
    order. A directory holds back the same sequences whatever is fitted beside it and whatever
    the fitting's seed: a head fitted on directory A and continued (`--init`) on A and B is
    never scored on a sequence of A that it fitted."""
    heldout: list[int] = []
    train: list[int] = []
    offset = 0
    for count, seed in parts:
        held, rest = heldout_split(count, seed, holdout)
        heldout += [offset + i for i in held]
        train += [offset + i for i in rest]
        offset += count
    return heldout, train


class TrainingData:
    """Cached features (`verispec.train.data`) split into training and held-back sequences.
    `turn_start`: where a user's words start in every sequence (the chat template's fixed
    system turn and user header before it are never scored). `parts`: (sequences, data seed) of
    the data directories concatenated in `stored` (default: one, with the fitting's seed), each
    split on its own (`heldout_split_by_part`)."""

    def __init__(
        self, stored: dict[str, torch.Tensor], stored_taps: Sequence[Tap], head_taps: Sequence[Tap], settings: TrainSettings,
        turn_start: int = 0, parts: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        stored_taps = [tap if tap == FINAL else int(tap) for tap in stored_taps]
        missing = [tap for tap in head_taps if tap not in stored_taps]
        if missing:
            raise ValueError(f"the cached features lack the taps {missing}; delete features.safetensors to recompute them")
        self.columns = [stored_taps.index(tap) for tap in head_taps]
        self.final_column = stored_taps.index(FINAL)
        self.stored = stored
        starts = stored["starts"]
        self.lengths = (starts[1:] - starts[:-1]).tolist()
        parts = [(len(self.lengths), settings.seed)] if parts is None else list(parts)
        sequences = sum(count for count, _ in parts)
        if sequences != len(self.lengths):
            raise ValueError(f"the data's parts hold {sequences} sequences, its features {len(self.lengths)}")
        self.heldout, self.train = heldout_split_by_part(parts, settings.holdout)
        self.settings = settings
        self.turn_start = turn_start

    def batch(self, indices: Sequence[int], positions: str = "answers") -> Batch:
        """The sequences `indices`, right-padded; `positions` ("answers" or "turns") says which
        are scored."""
        starts, answer_starts = self.stored["starts"], self.stored["answer_starts"]
        width = max(self.lengths[i] for i in indices)
        B, F, H = len(indices), len(self.columns), self.stored["features"].shape[-1]
        ids = torch.zeros(B, width, dtype=torch.long)
        features = torch.zeros(B, width, F * H)
        final = torch.zeros(B, width, H)
        argmax = torch.zeros(B, width, dtype=torch.long)
        logsumexp = torch.zeros(B, width)
        scored = torch.zeros(B, width, dtype=torch.bool)
        valid = torch.zeros(B, width, dtype=torch.bool)
        for row, i in enumerate(indices):
            a, b = int(starts[i]), int(starts[i + 1])
            n = b - a
            rows = self.stored["features"][a:b]  # [n, stored taps, H]
            ids[row, :n] = self.stored["tokens"][a:b].long()
            features[row, :n] = rows[:, self.columns].reshape(n, F * H).float()
            final[row, :n] = rows[:, self.final_column].float()
            argmax[row, :n] = self.stored["argmax"][a:b].long()
            logsumexp[row, :n] = self.stored["logsumexp"][a:b]
            # p_u predicts token u + 1, an answer token when u + 1 >= the answer's start.
            first = int(answer_starts[i]) if positions == "answers" else min(self.turn_start, int(answer_starts[i]))
            scored[row, max(0, first - 1):n] = True
            valid[row, :n] = True
        return Batch(ids, features, final, argmax, logsumexp, scored, valid)

    def epoch(self, epoch: int) -> list[list[int]]:
        """The training batches of epoch `epoch`: a seeded permutation, sorted by length within
        consecutive windows of `sort_window` sequences, cut into groups whose padded size stays
        within `batch_tokens`, the groups then in a seeded order (sequences of like length
        share a batch: on 2,419 of the target's Magpie conversations, 5 % of an epoch's padded
        tokens are padding against 22 % for the permutation cut as it is)."""
        generator = torch.Generator().manual_seed(self.settings.seed * 1000 + epoch)
        order = [self.train[i] for i in torch.randperm(len(self.train), generator=generator).tolist()]
        window = self.settings.sort_window
        order = [i for w in range(0, len(order), window) for i in sorted(order[w : w + window], key=self.lengths.__getitem__)]
        groups = list(padded_groups(order, self.lengths, self.settings.batch_tokens))
        return [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]

    def heldout_batches(self) -> list[list[int]]:
        return list(padded_groups(self.heldout, self.lengths, self.settings.batch_tokens))


def padded_groups(order: Sequence[int], lengths: Sequence[int], budget: int) -> Iterator[list[int]]:
    """`order` cut into consecutive groups whose rows, padded to the group's longest
    (`lengths[i]`), hold at most `budget` tokens (a longer row alone)."""
    group: list[int] = []
    for i in order:
        if group and (len(group) + 1) * max(lengths[j] for j in [*group, i]) > budget:
            yield group
            group = []
        group.append(i)
    if group:
        yield group


def target_probabilities(final: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """p renormalised on the head vocabulary: softmax(final [B, T, H] @ rows[N, H]^T) -> [B, T, N]."""
    return torch.softmax(final @ rows.T, dim=-1)


@dataclass
class StepResult:
    """loss: the mean over steps of the masked soft cross-entropy (plus feature loss);
    correct[j], counted[j]: positions where the head's top token at step j equals the target's
    top token (over the full vocabulary), and positions scored."""

    loss: torch.Tensor
    correct: list[int]
    counted: list[int]


def eagle_steps(
    head: EagleHead | Eagle3Head, ids: torch.Tensor, hidden: torch.Tensor, steps: int, logits_at: Sequence[torch.Tensor] | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The unrolled head over anchors t = 0..T-1: per step j, logits [B, T, N] (token t + 2 + j;
    [M_j, N] of the anchors where the bool mask logits_at[j] [B, T] holds, when given) and
    predicted features [B, T, H] (of position t + 1 + j). ids [B, T], hidden [B, T, H] (fused
    features of positions 0..T-1). Step j runs `EagleHead.forward` at positions t + j with the
    training-time-test mask: causal over step 0, diagonal over each later step."""
    B, T = ids.shape
    cache = DynamicCache()  # concatenating layers: every step's keys stay in the autograd graph
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    diagonal = torch.eye(T, dtype=torch.bool)
    outputs = []
    for j in range(steps):
        tokens = torch.zeros_like(ids)
        tokens[:, : T - 1 - j] = ids[:, 1 + j :]  # token t + 1 + j, zero past the end
        positions = (torch.arange(T) + j).expand(B, T)
        allowed = torch.cat([causal, *[diagonal] * j], dim=1)  # [T, (j + 1) T]
        at = None if logits_at is None else logits_at[j]
        logits, hidden = head(tokens, hidden, cache, positions=positions, allowed=allowed, logits_at=at)
        outputs.append((logits, hidden))
    return outputs


def shifted(x: torch.Tensor, by: int, fill: float | bool = 0) -> torch.Tensor:
    """x[:, t + by] at row t along dim 1, `fill` past the end."""
    out = torch.full_like(x, fill)
    out[:, : x.shape[1] - by] = x[:, by:]
    return out


def head_loss(head: Head, batch: Batch, rows: torch.Tensor, settings: TrainSettings) -> StepResult:
    """The loss of one batch (see the module docstring). rows [N, H]: the target's output rows
    for d2t, so p|d2t is softmax(final @ rows^T). With settings.bf16 the head's products run
    under bfloat16 autocast (faster per step on a CPU with native bfloat16: docs/results/implementation-choices.md); p and the
    cross-entropy stay float32."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
        return _head_loss(head, batch, rows, settings)


def _head_loss(head: Head, batch: Batch, rows: torch.Tensor, settings: TrainSettings) -> StepResult:
    # The output layer over N tokens and the cross-entropy run over the scored rows only, not
    # over a batch's padding and the prompt it does not score.
    scored = batch.scored & batch.valid  # [B, T]
    shifts = range(1, (settings.unroll if isinstance(head, EAGLES) else head.config.heads) + 1)
    masks = [shifted(scored, by, False) for by in shifts]  # [B, T]: anchor t's target row t + by is scored
    with torch.autocast("cpu", enabled=False):
        p = target_probabilities(batch.final[scored], rows)  # [M, N], the scored rows in row-major order
    column = scored.nonzero()[:, 1]  # [M]: u of each scored row, whose anchor at shift `by` is u - by
    top = batch.argmax[scored]  # [M]: the target's top token after each scored row
    if isinstance(head, EAGLES):
        per_step = eagle_steps(head, batch.ids, head.fuse(batch.features), len(masks), logits_at=masks)  # [M_j, N], [B, T, H]
    else:
        anchors = torch.stack(masks).any(0)  # [B, T]
        logits = head(batch.features[anchors])  # [A, K, N]
        per_step = [(logits[:, i][mask[anchors]], None) for i, mask in enumerate(masks)]  # [M_i, N]
    losses, correct, counted = [], [], []
    for (logits, predicted), by, mask in zip(per_step, shifts, masks):
        count = int(mask.sum())
        keep = column >= by  # [M]
        target = p if bool(keep.all()) else p[keep]  # [M_j, N]
        logits = logits.float()  # argmax over bfloat16 is several times slower on the CPU
        cross = -(target * torch.log_softmax(logits, -1)).sum(-1)  # [M_j]
        loss = cross.sum() / max(count, 1)
        if predicted is not None and settings.feature_weight and head.config.feature_layers == (FINAL,):
            regression = nn.functional.smooth_l1_loss(predicted.float(), shifted(batch.final, by), reduction="none").mean(-1)
            loss = loss + settings.feature_weight * regression[mask].sum() / max(count, 1)
        losses.append(loss)
        guess = head.d2t[logits.detach().argmax(-1)]  # [M_j]
        correct.append(int((guess == top[keep]).sum()))
        counted.append(count)
    return StepResult(torch.stack(losses).mean(), correct, counted)


def build_head(kind: str, settings: TrainSettings, target, target_config, name: str, d2t: torch.Tensor) -> Head:
    """A fresh head for `target` (an HFCausalLM with a feature channel)."""
    info = TargetInfo(
        name=name, vocab_size=int(target.input_embeddings().shape[0]), hidden_size=target.hidden_size,
        num_layers=target.num_layers,
    )
    layer = {}
    if kind == HeadKind.EAGLE:
        layer = default_layer(target_config)
    elif kind == HeadKind.EAGLE3:  # vLLM tabulates the head's rope up to the target's context
        layer = {**default_layer(target_config), "max_position_embeddings": getattr(target_config, "max_position_embeddings", 8192)}
    config = HeadConfig(
        kind=kind, target=info, feature_layers=settings.head_taps(target.num_layers), vocab_size=int(d2t.numel()),
        layer=layer, heads=settings.unroll if kind == HeadKind.MEDUSA else 0,
        depth=settings.depth if kind == HeadKind.EAGLE else 1, trained_output=kind == HeadKind.EAGLE3,
    )
    torch.manual_seed(settings.seed)
    return new_head(config, d2t, target).float()


def learning_rate(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, constant, then (with `decay` > 0) a linear fall to 0 over the last
    decay * steps steps (warm-up, stable, decay): a function of the step alone (see Determinism)."""
    rate = settings.lr * min(1.0, (step + 1) / settings.warmup_steps)
    if settings.decay > 0:
        rate *= min(1.0, max(0, settings.steps - step) / (settings.decay * settings.steps))
    return rate


@torch.no_grad()
def evaluate(head: Head, data: TrainingData, rows: torch.Tensor, settings: TrainSettings) -> list[float]:
    """Held-back top-1 agreement with the target by draft step (teacher-forced history), over
    answer positions, where drafting happens, whatever positions the fitting scores."""
    correct = counted = None
    for group in data.heldout_batches():
        result = head_loss(head, data.batch(group), rows, settings)
        correct = result.correct if correct is None else [a + b for a, b in zip(correct, result.correct)]
        counted = result.counted if counted is None else [a + b for a, b in zip(counted, result.counted)]
    if not counted:
        return []
    return [c / max(n, 1) for c, n in zip(correct, counted)]


@torch.no_grad()
def vocab_coverage(data: TrainingData, rows: torch.Tensor, d2t: torch.Tensor) -> tuple[float, float]:
    """Over held-back answer positions: the share whose target top token lies in d2t (the
    ceiling of greedy acceptance) and the mean p(d2t) (the ceiling of sampled acceptance)."""
    top = mass = count = 0.0
    for group in data.heldout_batches():
        batch = data.batch(group)
        scored = batch.scored & batch.valid
        inside = torch.logsumexp(batch.final @ rows.T, -1) - batch.logsumexp  # log p(d2t) [B, T]
        top += float((torch.isin(batch.argmax, d2t) & scored).sum())
        mass += float((inside.exp() * scored).sum())
        count += float(scored.sum())
    return top / max(count, 1.0), mass / max(count, 1.0)


def expected_tokens(accuracy: Sequence[float]) -> float:
    """Tokens per greedy round with a chain of len(accuracy) drafts, if step j is accepted
    with probability accuracy[j] once the steps before it were: 1 + sum_i prod_{j<=i} a_j."""
    total, survive = 1.0, 1.0
    for a in accuracy:
        survive *= a
        total += survive
    return total


@dataclass
class Progress:
    """Where a run stands; saved in checkpoints. `position` is the next batch of `epoch`."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    tokens_seen: int = 0
    seconds: float = 0.0
    best_step: int = 0  # the step of the best held-back evaluation so far (0: none yet)
    best_score: float = 0.0  # its expected tokens per round (`expected_tokens`)
    kept_step: int = 0  # the step whose weights `fit` returned
    evaluations: list[list[float]] = field(default_factory=list)  # [step, expected tokens, top-1 by step...]


def save_checkpoint(
    path: os.PathLike, head: Head, optimizer: torch.optim.Optimizer, progress: Progress, settings: TrainSettings,
    best: dict[str, torch.Tensor] | None,
) -> None:
    """Written to a temporary file and renamed, so an interruption never leaves half a checkpoint."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    partial = f"{path}.partial"
    torch.save(
        {"head": head.state_dict(), "optimizer": optimizer.state_dict(), "progress": asdict(progress),
         "settings": settings.as_dict(), "best": best},
        partial,
    )
    os.replace(partial, path)


def load_checkpoint(
    path: os.PathLike, head: Head, optimizer: torch.optim.Optimizer, settings: TrainSettings
) -> tuple[Progress, dict[str, torch.Tensor] | None]:
    state = torch.load(path, weights_only=True)
    # A setting added since the checkpoint was written had its default then.
    saved = {**{f.name: f.default for f in fields(TrainSettings) if f.default is not MISSING}, **state["settings"]}
    if saved != settings.as_dict():
        changed = sorted(k for k, v in settings.as_dict().items() if saved.get(k) != v)
        raise ValueError(f"the checkpoint {path} was made with other settings ({', '.join(changed)}); resume with the same ones or drop --resume")
    head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    return Progress(**state["progress"]), state["best"]


def fit(
    head: Head,
    data: TrainingData,
    rows: torch.Tensor,
    settings: TrainSettings,
    deadline: float,
    checkpoint: os.PathLike,
    resume: bool,
    max_steps: int | None = None,
    checkpoint_seconds: float = 120.0,
    report: Callable[[Progress, list[float]], None] | None = None,
) -> Progress:
    """Train `head` until `time.monotonic()` passes `deadline` or `max_steps` steps are done;
    checkpoint every `checkpoint_seconds` and at the end. Every `settings.eval_every` steps and
    at the end the head is scored on the held-back sequences (`expected_tokens` of its top-1
    agreement by step); the head left in `head` is the best scored, so a run that overfits its
    small data keeps its best point. `report(progress, accuracy)` is called after each step
    with the running top-1 agreement by draft step (the last 50 steps)."""
    trainable = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=settings.weight_decay)
    progress, best = load_checkpoint(checkpoint, head, optimizer, settings) if resume else (Progress(), None)

    def score() -> None:
        nonlocal best
        accuracy = evaluate(head, data, rows, settings)
        value = expected_tokens(accuracy)
        progress.evaluations.append([progress.step, round(value, 4), *[round(a, 4) for a in accuracy]])
        if best is None or value > progress.best_score:
            best = {name: tensor.detach().clone() for name, tensor in head.state_dict().items()}
            progress.best_step, progress.best_score = progress.step, value
        head.train()

    head.train()
    recent: list[StepResult] = []
    started = time.monotonic()
    last_save = started
    batches = data.epoch(progress.epoch)
    while time.monotonic() < deadline and (max_steps is None or progress.step < max_steps):
        if progress.position >= len(batches):
            progress.epoch += 1
            progress.position = 0
            batches = data.epoch(progress.epoch)
        batch = data.batch(batches[progress.position], settings.score)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(progress.step, settings)
        result = head_loss(head, batch, rows, settings)
        optimizer.zero_grad(set_to_none=True)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        progress.step += 1
        progress.position += 1
        progress.tokens_seen += batch.tokens
        now = time.monotonic()
        progress.seconds += now - started
        started = now
        recent = [*recent[-49:], result]
        if report is not None:
            report(progress, _agreement(recent))
        if progress.step % settings.eval_every == 0:
            score()
        if now - last_save > checkpoint_seconds:
            save_checkpoint(checkpoint, head, optimizer, progress, settings, best)
            last_save = now
    save_checkpoint(checkpoint, head, optimizer, progress, settings, best)
    # The last state competes with the best evaluated one, but is not recorded as an
    # evaluation point, so a run resumed from here picks exactly as an uninterrupted one.
    progress.kept_step = progress.step
    if best is not None and progress.best_step != progress.step:
        if expected_tokens(evaluate(head, data, rows, settings)) < progress.best_score:
            head.load_state_dict(best)
            progress.kept_step = progress.best_step
    head.eval()
    return progress


def _agreement(results: Sequence[StepResult]) -> list[float]:
    correct = [sum(r.correct[j] for r in results) for j in range(len(results[0].correct))]
    counted = [sum(r.counted[j] for r in results) for j in range(len(results[0].counted))]
    return [c / max(n, 1) for c, n in zip(correct, counted)]
