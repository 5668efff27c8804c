"""Checks on the paths a command reads and writes, run before any work: a long measurement
never ends in a write that fails, and earlier results are never overwritten without `--force`.

    check_output_file(Path("p.json"), "--out", force=False)           # refuses if p.json exists
    check_output_file(Path("v.png"), "--plot", force=False, suffix=".png")
    check_output_directory(Path("runs"), "--out", ("summary.json",), force=False)
    check_new_directory(Path("heads/ab.int8"), "--out")             # refuses if it exists
    check_input_file(Path("p.json"), "--profile", "a profile from `verispec profile --out`")
    check_not_an_input(Path("heads/ab"), "--out", [Path("heads/a"), Path("heads/b")])
    with nothing_left_on_failure(Path("runs"), ("summary.json", "quick-draft")):
        ...                                   # a refusal removes what the block created
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from verispec.cli import BadInput

FORCE_HELP = "Overwrite earlier outputs at the given paths instead of refusing."


def check_output_file(path: Path, option: str, force: bool, suffix: str | None = None) -> None:
    """`path` can be written as a file: not a directory, the required suffix (none is added
    silently), a writable parent directory that exists, and no file there yet unless `force`."""
    if path.is_dir():
        raise BadInput(f"{option} {path} is a directory; give the path of a file, for example inside it")
    if suffix is not None and path.suffix.lower() != suffix:
        raise BadInput(f"{option} {path} must end in {suffix}; no suffix is added for you")
    if not path.parent.is_dir():
        raise BadInput(f"{option} {path}: {path.parent} is not a directory; create it first or choose another path")
    if path.exists() and not force:
        raise BadInput(f"{option} {path} already exists; pass --force to overwrite it, or choose another path")
    check_writable(path.parent, option, path)


def check_output_directory(path: Path, option: str, names: Iterable[str], force: bool) -> None:
    """`path` is a directory, created now if missing, that can take a command's outputs
    `names` and holds none of them yet unless `force`."""
    if path.exists() and not path.is_dir():
        raise BadInput(f"{option} {path} is a file; give a directory for the results (a new one is created)")
    earlier = [name for name in names if (path / name).exists()]
    if earlier and not force:
        raise BadInput(
            f"{option} {path} already holds results ({', '.join(earlier)}); pass --force to overwrite them, "
            "or choose another directory"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BadInput(f"{option} {path}: cannot create the directory ({error.strerror}); choose another path") from None
    check_writable(path, option, path)


def check_new_directory(path: Path, option: str) -> None:
    """`path` does not exist yet and can be created as a directory: its parent is a writable
    directory (a command that never overwrites writes a new one)."""
    if path.exists():
        raise BadInput(f"{option} {path} already exists; give a new directory (nothing is overwritten)")
    if not path.parent.is_dir():
        raise BadInput(f"{option} {path}: {path.parent} is not a directory; create it first or choose another path")
    check_writable(path.parent, option, path)


def check_writable(directory: Path, option: str, path: Path) -> None:
    """A file can be created in `directory` (tried, then removed: permission bits do not
    bind root, and a read-only file system shows only on writing)."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".verispec-probe-"):
            pass
    except OSError as error:
        raise BadInput(f"{option} {path}: cannot write in {directory} ({error.strerror}); choose another path") from None


def check_input_file(path: Path, option: str, what: str) -> None:
    """`path` is a file that can be read; `what` names what the option expects."""
    if path.is_dir():
        raise BadInput(f"{option} {path} is a directory; give {what}")
    if not path.is_file():
        raise BadInput(f"{option} {path}: no such file; give {what}")


def check_not_an_input(path: Path, option: str, inputs: Sequence[Path]) -> None:
    """`path` (an output) is none of `inputs`, nor inside one, nor holds one, after resolving
    links: an output never overwrites what it is computed from, `--force` or not."""
    target = path.resolve()
    for source in inputs:
        resolved = source.resolve()
        if target == resolved or resolved in target.parents or target in resolved.parents:
            raise BadInput(
                f"{option} {path} is one of the inputs ({source}) or overlaps it; write the output to another directory"
            )


@contextmanager
def nothing_left_on_failure(directory: Path, names: Iterable[str]) -> Iterator[None]:
    """Run the block; if it raises, remove the entries `names` of `directory` that it created,
    and `directory` itself if it created that and left it empty: a refused command leaves
    nothing behind (earlier entries stay as they were)."""
    names = tuple(names)
    existed = directory.exists()
    before = {name for name in names if (directory / name).exists()}
    try:
        yield
    except BaseException:
        for name in names:
            entry = directory / name
            if name in before or not entry.exists():
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        if not existed and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
        raise
