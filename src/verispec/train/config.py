"""`TrainConfig`: every setting of a training run, checked when it is made, before any model
loads or any data grows. The options of `verispec train` are its fields; `verispec.train.run`
runs one.

    config = TrainConfig(head="eagle3", out=Path("heads/e3"), minutes=60, data_conversations=2000)
    run(config)

What needs the model (the vocabulary against the target's, the chat template for `score =
"turns"`) is checked by `run` right after loading it, still before the data; that the data
holds `vocab` distinct tokens, before fitting.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from verispec.checks import is_int, is_number
from verispec.heads.config import HeadConfig, HeadKind, head_kind
from verispec.models import DEFAULT_MODEL
from verispec.models.loading.parts import cache_root

if TYPE_CHECKING:
    from verispec.train.data import DataCache

PROMPT_SOURCES = ("magpie", "openers", "documents", "texts")
VOCAB = 8192  # the head vocabulary N when `vocab` is not given, or fewer where the model or data holds fewer
TAPS = ("eagle3", "final")
DATA_DTYPES = ("auto", "float32", "bfloat16")  # the target's, for data and features: a float dtype, never q4
TRAIN_DTYPES = ("auto", "float32", "bfloat16")
SCORES = ("answers", "turns")


@dataclass(frozen=True)
class TrainConfig:
    """A training run, each field as `verispec train`'s option of the same name (`--help` says
    what each means); `also` is `--also` repeated, `command` what the head records as the
    command that made it. Made only if every value is usable: a ValueError says which is not."""

    head: HeadKind
    out: Path
    minutes: float
    model: str = DEFAULT_MODEL
    seed: int = 0
    data_minutes: float | None = None
    data_conversations: int | None = None
    data_only: bool = False
    work: Path | None = None
    resume: bool = False
    force: bool = False
    steps: int | None = None
    vocab: int | None = None  # None: up to `VOCAB` tokens, as many as the model and the data hold
    taps: str = "eagle3"
    unroll: int = 3
    depth: int = 1
    lr: float = 1e-3
    decay: float = 0.0
    batch_tokens: int = 4096
    max_sequences: int | None = None
    prompts: str = "magpie"
    also: tuple[Path, ...] = ()
    threads: int = 2
    dtype: str = "auto"
    score: str = "answers"
    train_dtype: str = "auto"
    init: Path | None = None
    command: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "head", head_kind(self.head, "--head"))
        object.__setattr__(self, "also", tuple(Path(p) for p in self.also))
        self._check_values()
        self._check_combinations()
        self._check_paths()

    def _check_values(self) -> None:
        for option, value, choices in (
            ("--taps", self.taps, TAPS), ("--prompts", self.prompts, PROMPT_SOURCES), ("--dtype", self.dtype, DATA_DTYPES),
            ("--train-dtype", self.train_dtype, TRAIN_DTYPES), ("--score", self.score, SCORES),
        ):
            if value not in choices:
                more = "; the data's features are computed in a float dtype" if option == "--dtype" else ""
                raise ValueError(f"{option} must be {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}{more}")
        if not is_number(self.minutes, least=0, open_least=True):
            raise ValueError(f"--minutes must be a finite number > 0, got {self.minutes}")
        if self.data_minutes is not None and not is_number(self.data_minutes, 0, self.minutes):
            raise ValueError(f"--data-minutes must lie in [0, --minutes = {self.minutes}], got {self.data_minutes}")
        if not is_number(self.lr, 0, 1, open_least=True):
            raise ValueError(f"--lr must be a finite number in (0, 1], got {self.lr}")
        if not is_number(self.decay, 0, 1):
            raise ValueError(f"--decay must lie in [0, 1], got {self.decay}")
        if not is_int(self.seed):
            raise ValueError(f"--seed must be an integer, got {self.seed!r}")
        counts = (
            ("--vocab", self.vocab), ("--unroll", self.unroll), ("--depth", self.depth), ("--batch-tokens", self.batch_tokens),
            ("--threads", self.threads), ("--steps", self.steps), ("--data-conversations", self.data_conversations),
            ("--max-sequences", self.max_sequences),
        )
        for option, value in counts:
            if value is not None and not is_int(value, least=1):
                raise ValueError(f"{option} must be an integer >= 1, got {value!r}")

    def _check_combinations(self) -> None:
        if self.head == HeadKind.EAGLE3 and self.taps != "eagle3":
            raise ValueError("an eagle3 head reads the low, middle and high layers, as vLLM feeds it; drop --taps final")
        if self.data_conversations is not None and self.data_minutes is not None:
            raise ValueError("--data-conversations bounds the data stage by count, --data-minutes by the clock; give one of them")
        if self.data_conversations is not None and self.max_sequences is not None:
            raise ValueError("--data-conversations sets the data's size exactly, --max-sequences at least; give one of them")
        if self.also and self.data_only:
            raise ValueError("--also adds data to the fitting, which --data-only skips; drop one of them")
        if self.init is not None and self.data_only:
            raise ValueError("--init starts the fitting from a head, which --data-only skips; drop one of them")
        if self.depth != 1 and self.head != HeadKind.EAGLE:
            raise ValueError(f"--depth stacks an EAGLE head's decoder layers; a {self.head} head has one or none, drop --depth")
        if self.decay > 0 and self.steps is None:
            raise ValueError("--decay plans the learning rate over --steps, which is missing; give --steps N (--minutes still bounds the run)")

    def _check_paths(self) -> None:
        for option, path in (("--out", self.out), ("--work", self.work_dir)):
            if path.exists() and not path.is_dir():
                raise ValueError(f"{option} {path} exists and is not a directory; give a directory")
            above = next((p for p in path.parents if p.exists()), None)
            if above is not None and not above.is_dir():
                raise ValueError(f"{option} {path}: {above} is a file, not a directory; choose another path")
        out = self.out
        if not self.data_only and (out / "config.json").exists() and not self.force:
            raise ValueError(f"{out} already holds a head (config.json); pass --force to overwrite it or choose another --out")
        if self.resume and not self.checkpoint.is_file():
            raise ValueError(f"--resume: no checkpoint at {self.checkpoint}; run without --resume to start")
        if self.init is not None:
            self.check_init(init_config(self.init))
        self.also_data()

    @property
    def work_dir(self) -> Path:
        """Where the data, features and checkpoints live (`--work`, default under the cache)."""
        suffix = "" if self.prompts == "magpie" else f"-{self.prompts}"
        return self.work or cache_root() / "train" / f"{Path(str(self.model)).name}-seed{self.seed}{suffix}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def checkpoint(self) -> Path:
        return self.work_dir / f"{self.head}-checkpoint.pt"

    @property
    def data_budget_minutes(self) -> float:
        """Of `minutes`, the data stage's clock budget: 0 where `data_conversations` bounds it by
        count, else `data_minutes` (default: half)."""
        if self.data_conversations is not None:
            return 0.0
        return self.minutes / 2 if self.data_minutes is None else self.data_minutes

    def check_init(self, config: HeadConfig) -> None:
        """The `--init` head is one this run could have made: same model, kind, taps, N and K,
        and no more decoder layers than `depth`."""
        from verispec.train.loop import taps_for

        wanted = {
            "kind (--head)": (config.kind, self.head),
            "model (--model)": (config.target.name, self.model),
            "taps (--taps)": (list(config.feature_layers), list(taps_for(self.head, self.taps, config.target.num_layers))),
            **({"vocabulary N (--vocab)": (config.vocab_size, self.vocab)} if self.vocab is not None else {}),
            **({"heads K (--unroll)": (config.heads, self.unroll)} if config.kind == HeadKind.MEDUSA else {}),
        }
        wrong = [f"{name} {have} where this run has {want}" for name, (have, want) in wanted.items() if have != want]
        if config.depth > self.depth:
            wrong.append(f"depth (--depth) {config.depth} where this run has {self.depth}, fewer")
        if wrong:
            raise ValueError(f"--init {self.init} holds a head of another {'; '.join(wrong)}; give the settings it was trained with")


    def also_data(self) -> list[DataCache]:
        """The data directories `also` names (each PATH or PATH/data), checked: features cached,
        made for this model, not this run's own data, none twice."""
        from verispec.train.data import DataCache

        caches = []
        for path in self.also:
            hint = "give a work directory made by `verispec train --data-only --work W`"
            if not path.is_dir():
                raise ValueError(f"--also {path}: no such directory; {hint}")
            cache = next((DataCache(p) for p in (path, path / "data") if (p / "recipe.json").is_file()), None)
            if cache is None:
                raise ValueError(f"--also {path}: no recipe.json in it or in its data/; {hint}")
            if cache.root.resolve() == self.data_dir.resolve():
                raise ValueError(f"--also {path} is this run's own data directory; give another one")
            made_for = cache.recipe().get("model")
            if made_for != self.model:
                raise ValueError(f"--also {path} holds data of the model {made_for!r}, not {self.model!r}; give data made for the same --model")
            if not cache.features_path.is_file():
                raise ValueError(no_features(cache))
            caches.append(cache)
        if len({cache.root.resolve() for cache in caches}) < len(caches):
            raise ValueError("--also names one data directory twice, which would count its sequences twice; give each once")
        return caches


def no_features(cache: DataCache) -> str:
    return f"--also {cache.root} has no features for its sequences; run `verispec train --data-only` on it with its settings first"


def init_config(directory: Path) -> HeadConfig:
    from verispec.heads.checkpoint import read_config

    if not directory.is_dir():
        raise ValueError(f"--init {directory} is not a directory; give a head directory written by `verispec train --out`")
    return read_config(directory)
