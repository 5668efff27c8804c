"""Benchmark prompts: Spec-Bench and HumanEval rows, read by path, turned into token ids.

Spec-Bench rows (`question_id`, `category`, `turns`) are chat questions: the FIRST turn goes
through the model's chat template with the assistant's generation prompt appended. HumanEval
rows (`task_id`, `prompt`) are raw code completions, tokenised as they are, in the category
"humaneval". Files are read where they lie; nothing is copied.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from verispec.models.loading.load import LoadedModel

HUMANEVAL = "humaneval"
# Where the tests and benchmarks/ scripts find the benchmark data when it is not beside the
# repository (../shared/data).
DATA_VARIABLE = "VERISPEC_DATA"


def data_file(name: str, repository: Path) -> Path:
    """The benchmark data file `name`: in $VERISPEC_DATA when that is set, else in
    ../shared/data beside the `repository` root. It may not exist; callers say so or skip."""
    directory = os.environ.get(DATA_VARIABLE)
    return Path(directory) / name if directory else repository.resolve().parent / "shared" / "data" / name


@dataclass(frozen=True)
class Workload:
    """One benchmark prompt.

    id: the row's question_id or task_id, as text. chat: True when `text` is a user turn for
    the chat template, False when it is raw text to continue.
    """

    id: str
    category: str
    text: str
    chat: bool

    def token_ids(self, loaded: LoadedModel) -> list[int]:
        """The prompt's token ids as the target sees them."""
        ids = loaded.encode(self.text, chat=self.chat)
        if not ids:
            raise ValueError(f"prompt {self.id} ({self.category}) tokenises to nothing; drop that row")
        return [int(t) for t in ids]


def parse_row(row: dict, where: str) -> Workload:
    """A Spec-Bench or HumanEval row as a `Workload`; `where` names the row in errors."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError(f"{where}: 'turns' must be a non-empty list of strings")
        for key in ("question_id", "category"):
            if key not in row:
                raise ValueError(f"{where}: a Spec-Bench row needs '{key}' beside 'turns'")
        return Workload(str(row["question_id"]), str(row["category"]), turns[0], chat=True)
    if "prompt" in row:
        if "task_id" not in row or not isinstance(row["prompt"], str):
            raise ValueError(f"{where}: a HumanEval row needs 'task_id' and a string 'prompt'")
        return Workload(str(row["task_id"]), str(row.get("category", HUMANEVAL)), row["prompt"], chat=False)
    raise ValueError(
        f"{where}: neither a Spec-Bench row (question_id, category, turns) "
        f"nor a HumanEval row (task_id, prompt); keys are {sorted(row)}"
    )


def read_workloads(path: str | Path) -> list[Workload]:
    """Every row of a JSONL file (blank lines skipped)."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"prompt file {path} is a directory; give a Spec-Bench or HumanEval .jsonl file")
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist; give a Spec-Bench or HumanEval .jsonl")
    workloads = []
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path}:{number}: not UTF-8 text (byte 0x{raw[error.start]:02x} at column "
                                 f"{error.start + 1}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            workloads.append(parse_row(row, f"{path}:{number}"))
    if not workloads:
        raise ValueError(f"{path} holds no rows")
    return workloads


def select(
    workloads: Iterable[Workload], categories: Sequence[str] | None = None, limit_per_category: int | None = None
) -> list[Workload]:
    """The first `limit_per_category` workloads of each wanted category, in file order."""
    workloads = list(workloads)
    present = {w.category for w in workloads}
    if categories:
        missing = [c for c in categories if c not in present]
        if missing:
            raise ValueError(f"no prompts in categories {missing}; the files hold {sorted(present)}")
    if limit_per_category is not None and limit_per_category < 1:
        raise ValueError(f"--limit-per-category must be >= 1, got {limit_per_category}")
    taken: dict[str, int] = {}
    chosen = []
    for workload in workloads:
        if categories and workload.category not in categories:
            continue
        if limit_per_category is not None and taken.get(workload.category, 0) >= limit_per_category:
            continue
        taken[workload.category] = taken.get(workload.category, 0) + 1
        chosen.append(workload)
    return chosen
