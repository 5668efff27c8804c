"""Raw texts: passages of this machine's Python source and package documentation, each one
training sequence as it is, with no chat template around it and no answer to generate.

The chat sources (`prompts`, `documents`) pay one decoding step of the target per answer token.
Here the target only reads: its p at every position of a text is as exact a label as at its
own answers (the features' forward gives both), so data costs one forward per token, about
two orders of magnitude less. The texts are not the target's words, so they teach the head
the target's p in contexts drafting also meets: raw text to continue (a code prompt without a
chat template) and code or prose like that in its answers.

Sources, in a fixed order:
- Python source files under `python_roots` (default: the running interpreter's standard
  library), sorted by path, skipping test, site-packages and cache directories; each file is
  cut at blank lines into passages of `code_min_chars..code_max_chars` characters, at most
  `code_per_file` from each, kept when printable and free of chat-template markers;
- the prose passages of `documents.find_passages` (Debian package documentation and Python
  distribution descriptions), under `documents`' limits.
The same guard as `documents` applies: nothing inside a directory named `shared`, the
repository's `data` directory or $VERISPEC_DATA is read, and a root there is refused.

Round r of a seed holds passages order[r * batch : (r + 1) * batch], `order` a permutation of
all passages drawn from `random.Random(seed)`; the data runs out after ceil(P / batch) rounds.
"""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

from verispec.train.documents import (
    DocumentRecipe, Passage, files_under, find_passages, passages_digest, read_text, split_passages,
)


@dataclass(frozen=True)
class TextRecipe:
    """Where the raw texts come from and how they are cut; recorded beside the data and the head."""

    python_roots: tuple[str, ...] | None = None  # None: the running interpreter's standard library
    skip_dirs: tuple[str, ...] = ("test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__")
    code_min_chars: int = 300
    code_max_chars: int = 2000
    code_per_file: int = 8
    documents: DocumentRecipe | None = field(default_factory=DocumentRecipe)  # None: code only
    batch: int = 256  # passages per round

    def roots(self) -> tuple[str, ...]:
        return (sysconfig.get_paths()["stdlib"],) if self.python_roots is None else self.python_roots

    def as_dict(self) -> dict:
        method = "texts: local Python source and package documentation as they are, no chat template, no generated answers"
        return json.loads(json.dumps({"method": method, **asdict(self), "python_roots": list(self.roots())}))


def code_passages(recipe: TextRecipe) -> list[Passage]:
    """The Python source passages of the recipe on this machine, in a fixed order."""
    passages = []
    for root in recipe.roots():
        if not Path(root).is_dir():
            continue
        for path in files_under(Path(root), recipe.skip_dirs):
            if path.suffix != ".py":
                continue
            text = read_text(path, 1_000_000)
            if text is None:
                continue
            kept = [
                p for p in split_passages(text, recipe.code_min_chars, recipe.code_max_chars)
                if "<|" not in p and all(line.isprintable() for line in p.split("\n"))
            ]
            source = f"source:{path.relative_to(root)}"
            passages.extend(Passage(source, p) for p in kept[: recipe.code_per_file])
    return passages


class Texts:
    """The raw passages of a recipe on this machine, dealt out in rounds (module docstring)."""

    def __init__(self, recipe: TextRecipe = TextRecipe(), passages: list[Passage] | None = None) -> None:
        self.recipe = recipe
        if passages is None:
            passages = code_passages(recipe) + (find_passages(recipe.documents) if recipe.documents else [])
        self.passages = passages
        if not self.passages:
            raise ValueError(
                f"no Python source under {', '.join(recipe.roots())} and no documentation passages; "
                "install them or use --prompts magpie"
            )
        self.rounds = -(-len(self.passages) // recipe.batch)

    def as_dict(self) -> dict:
        code = sum(p.source.startswith("source:") for p in self.passages)
        return {
            **self.recipe.as_dict(), "passages": len(self.passages), "code_passages": code,
            "passages_sha256": passages_digest(self.passages),
        }

    def texts(self, seed: int, round: int) -> list[str]:
        """Round `round`'s passages (empty once every passage was dealt)."""
        order = random.Random(seed).sample(range(len(self.passages)), len(self.passages))
        return [self.passages[i].text for i in order[round * self.recipe.batch:(round + 1) * self.recipe.batch]]
