"""Grounded instructions: passages of text installed on this machine, each quoted in a user
turn under a task a user asks about a text (summarise it, list its main points, ...).

Magpie instructions (`prompts`) are short and carry no text to work on; a user who pastes a
text and asks about it makes the target copy from its context, which a draft head can learn
to predict. The texts come from what the machine already has, no download:
- Debian package documentation under /usr/share/doc: README*, *.txt, *.md, *.rst and NEWS*
  files, plain or gzipped; copyright and licence files, changelogs, release notes and html
  are skipped, and so is anything that is not UTF-8 text;
- the long descriptions of the installed Python distributions (the body of their METADATA
  after the headers), verispec's own excepted (it is this project's README).

Benchmark prompts must never become training data: nothing inside a directory named `shared`,
the repository's `data` directory or $VERISPEC_DATA is read (`forbidden`), a root there is
refused, and symbolic links are resolved before that check.

Each text is split at blank lines; consecutive paragraphs are joined into passages of
`min_chars..max_chars` characters. A passage is kept when it is printable, mostly letters (a
table of numbers is not), with little html markup, without long runs of symbols or
chat-template markers; at most
`max_per_source` per package or distribution (in sorted path order), deduplicated after case
and whitespace folding. Files are read in sorted path order, so a machine and a recipe give
the same passages; `Documents.as_dict` records their number and digest beside the data.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import importlib.metadata
import json
import os
import random
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from verispec.bench.workloads import data_file
from verispec.train.prompts import fold

REPOSITORY = Path(__file__).resolve().parents[3]

TEMPLATES = (
    "Summarise the following text in a few sentences.\n\n{text}",
    "{text}\n\nList the main points of the text above.",
    "What is this text about, and who is it written for?\n\n{text}",
    "Extract the names of the commands, programs, options and files this text mentions, as a list.\n\n{text}",
    "Rewrite this text for a beginner who has never used the software it describes.\n\n{text}",
    "{text}\n\nTurn the text above into a short FAQ of three to five questions with their answers.",
    "Translate the first two sentences of this text from English into French.\n\n{text}",
    "Translate the first two sentences of this text from English into Spanish.\n\n{text}",
)


@dataclass(frozen=True)
class DocumentRecipe:
    """Where passages come from, how they are cut and filtered, and the tasks put on them;
    recorded beside the data and the head."""

    doc_roots: tuple[str, ...] = ("/usr/share/doc",)
    python_distributions: bool = True
    metadata_paths: tuple[str, ...] | None = None  # where distributions are looked up; None: sys.path
    names: tuple[str, ...] = ("readme*", "*.txt", "*.md", "*.rst", "news*")  # file names (lower case, .gz removed)
    skip_words: tuple[str, ...] = ("copyright", "copying", "license", "licence", "changelog", "changes", "relnotes", "html")
    max_file_bytes: int = 1_000_000
    min_chars: int = 500
    max_chars: int = 2000
    min_letter_share: float = 0.6  # letters among the non-space characters
    max_symbol_run: int = 40  # longest run of characters that are neither word nor space
    max_markup_share: float = 0.1  # characters inside <...> tags (html badges, not prose)
    max_per_source: int = 40  # passages per package directory or distribution
    batch: int = 64  # instructions per round
    answer_batch_tokens: int = 32768  # rows x (prompt width + max_new_tokens) per answering call
    templates: tuple[str, ...] = TEMPLATES

    def as_dict(self) -> dict:
        method = "documents: local package texts (Debian /usr/share/doc, Python distribution metadata) with grounded task templates"
        return json.loads(json.dumps({"method": method, **asdict(self)}))  # tuples as the JSON lists stored


@dataclass(frozen=True)
class Passage:
    source: str  # the package directory or "python:<distribution>"
    text: str


def forbidden(path: Path) -> bool:
    """Whether `path` may hold benchmark data: it, or what it links to, lies inside a
    directory named `shared`, the repository's `data` directory or the benchmark data
    directory (`verispec.bench.workloads.data_file`)."""
    benchmark = (REPOSITORY / "data", data_file("", REPOSITORY))
    for p in (Path(os.path.abspath(path)), Path(path).resolve()):
        if "shared" in p.parts or any(p.is_relative_to(d) or p.is_relative_to(d.resolve()) for d in benchmark):
            return True
    return False


def wanted(relative: Path, recipe: DocumentRecipe) -> bool:
    """Whether a documentation file (path relative to its root) is read."""
    lowered = str(relative).lower()
    if any(word in lowered for word in recipe.skip_words):
        return False
    name = relative.name.lower().removesuffix(".gz")
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in recipe.names)


def read_text(path: Path, limit: int) -> str | None:
    """The file's text (gunzipped for .gz), or None when it is larger than `limit` bytes or
    not UTF-8 (a binary)."""
    try:
        with (gzip.open(path) if path.name.endswith(".gz") else path.open("rb")) as f:
            raw = f.read(limit + 1)
        return None if len(raw) > limit else raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def files_under(root: Path, skip_dirs: tuple[str, ...] = ()) -> Iterator[Path]:
    """Every file under `root` in sorted path order, outside directories named in `skip_dirs`;
    directories that may hold benchmark data are not entered and links into them are not
    returned. A `root` that may hold benchmark data is refused."""
    if forbidden(root):
        raise ValueError(f"{root} may hold benchmark data (a `shared` directory or the repository's `data`); verispec never trains on it")
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d not in skip_dirs and not forbidden(Path(directory) / d))
        for name in sorted(files):
            path = Path(directory) / name
            if not forbidden(path):
                yield path


def doc_texts(root: Path, recipe: DocumentRecipe) -> Iterator[tuple[str, str]]:
    """(package, text) of every wanted file under `root` (`files_under`), in sorted path order."""
    for path in files_under(root):
        relative = path.relative_to(root)
        if not wanted(relative, recipe):
            continue
        text = read_text(path, recipe.max_file_bytes)
        if text is not None:
            yield relative.parts[0] if len(relative.parts) > 1 else root.name, text


def distribution_texts(recipe: DocumentRecipe) -> Iterator[tuple[str, str]]:
    """("python:<name>", long description) of each installed distribution, by name."""
    found = importlib.metadata.distributions(**({} if recipe.metadata_paths is None else {"path": list(recipe.metadata_paths)}))
    by_name: dict[str, importlib.metadata.Distribution] = {}
    for dist in found:
        name = (dist.metadata["Name"] or "").lower()
        if name and name != "verispec" and not forbidden(Path(dist.locate_file(""))):
            by_name.setdefault(name, dist)  # the first on the path, as import would pick
    for name in sorted(by_name):
        body = (by_name[name].read_text("METADATA") or "").replace("\r\n", "\n").partition("\n\n")[2]
        if body.strip():
            yield f"python:{name}", body


def split_passages(text: str, min_chars: int, max_chars: int) -> list[str]:
    """Consecutive paragraphs (split at blank lines) joined into passages of min_chars..
    max_chars characters; a paragraph longer than max_chars is left out."""
    lines = [line.rstrip() for line in text.replace("\r", "").expandtabs(8).split("\n")]
    paragraphs = [p.strip("\n") for p in re.split(r"\n{2,}", "\n".join(lines)) if p.strip()]
    passages, current = [], ""
    for paragraph in paragraphs:
        joined = f"{current}\n\n{paragraph}" if current else paragraph
        if len(joined) <= max_chars:
            current = joined
            continue
        if len(current) >= min_chars:
            passages.append(current)
        current = paragraph if len(paragraph) <= max_chars else ""
    if len(current) >= min_chars:
        passages.append(current)
    return passages


def readable(passage: str, recipe: DocumentRecipe) -> bool:
    """Printable prose: mostly letters, little markup, no long run of symbols, no chat-template
    markers."""
    visible = [c for c in passage if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    markup = sum(map(len, re.findall(r"<[^<>\n]*>", passage)))
    return (
        "<|" not in passage
        and markup <= recipe.max_markup_share * len(passage)
        and all(line.isprintable() for line in passage.split("\n"))
        and letters >= recipe.min_letter_share * max(len(visible), 1)
        and re.search(rf"[^\w\s]{{{recipe.max_symbol_run + 1},}}", passage) is None
    )


def find_passages(recipe: DocumentRecipe) -> list[Passage]:
    """Every passage of the recipe's sources on this machine, in a fixed order."""
    texts = [pair for root in recipe.doc_roots if Path(root).is_dir() for pair in doc_texts(Path(root), recipe)]
    if recipe.python_distributions:
        texts.extend(distribution_texts(recipe))
    seen: set[str] = set()
    per_source: dict[str, int] = {}
    passages = []
    for source, text in texts:
        for passage in split_passages(text, recipe.min_chars, recipe.max_chars):
            key = fold(passage)
            if key in seen or per_source.get(source, 0) >= recipe.max_per_source or not readable(passage, recipe):
                continue
            seen.add(key)
            per_source[source] = per_source.get(source, 0) + 1
            passages.append(Passage(source, passage))
    return passages


def passages_digest(passages: list[Passage]) -> str:
    """SHA-256 of the passages' texts in order: what a data recipe records of its corpus."""
    return hashlib.sha256("\x00".join(p.text for p in passages).encode()).hexdigest()


def quoted(passage: str) -> str:
    return f'"""\n{passage}\n"""'


class Documents:
    """The passages of a recipe on this machine and the instructions built on them.

    Instruction k of a seed (round r holds k = r * batch .. (r + 1) * batch - 1) quotes
    passage order[k % P] under template (first[passage] + k // P) % T, where `order` (a
    permutation of the P passages) and `first` (a template per passage) are drawn from
    `random.Random(seed)`: every passage is used once before any is used again, and each
    (passage, template) pair at most once, so the data runs out after ceil(P * T / batch)
    rounds (`rounds`)."""

    def __init__(self, recipe: DocumentRecipe = DocumentRecipe(), passages: list[Passage] | None = None) -> None:
        self.recipe = recipe
        self.passages = find_passages(recipe) if passages is None else passages
        if not self.passages:
            raise ValueError(
                f"no passages of {recipe.min_chars}-{recipe.max_chars} characters under {', '.join(recipe.doc_roots)} "
                "or in the Python distributions; install documentation or use --prompts magpie"
            )
        self.rounds = -(-len(self.passages) * len(recipe.templates) // recipe.batch)

    def as_dict(self) -> dict:
        return {**self.recipe.as_dict(), "passages": len(self.passages), "passages_sha256": passages_digest(self.passages)}

    def instructions(self, seed: int, round: int) -> list[str]:
        """Round `round`'s instructions (empty once every pair was used)."""
        rng = random.Random(seed)
        count, templates = len(self.passages), self.recipe.templates
        order = rng.sample(range(count), count)
        first = [rng.randrange(len(templates)) for _ in range(count)]
        out = []
        for k in range(round * self.recipe.batch, min((round + 1) * self.recipe.batch, count * len(templates))):
            passage = order[k % count]
            template = templates[(first[passage] + k // count) % len(templates)]
            out.append(template.format(text=quoted(self.passages[passage].text)))
        return out
