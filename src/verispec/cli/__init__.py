"""The `verispec` command line.

Each command lives in its own module of this package and registers itself on `app`;
`paths` holds the checks commands run on the files they read and write. Bad input (a
usage error, a ValueError, a missing file, an output that would be overwritten) is reported as
one `error: ...` line on stderr with exit status 2, never a traceback.

The commands never reach a model hub: the loaders pass `local_files_only=True` on every read
(`verispec.models.loading.sources`), and this package sets `HF_HUB_OFFLINE=1` (unless the environment
already says otherwise) before any command module imports transformers, which read it at import.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import typer

# typer >= 0.29 carries its own copy of click; its usage errors live here (pinned in pyproject).
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

PROG = "verispec"

app = typer.Typer(
    help="Exact speculative decoding: generate, audit, profile, predict and benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help is printed as written: rich markup would read `'.[llamacpp]'` or `[default: ...]` in a
    # help text as a style tag and drop it.
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


class BadInput(Exception):
    """A command was given something it cannot use; the message says what and what to do."""


# Before a command module imports transformers and huggingface_hub, which read it at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; its exit status: 0 done, 1 a check failed, 2 bad input."""
    argv = sys.argv[1:] if argv is None else argv
    if (empty := empty_value(argv)) is not None:
        return fail(empty)
    try:
        result = app(args=argv, prog_name=PROG, standalone_mode=False)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except NoArgsIsHelpError as error:
        print(error.format_message())  # the help; the error line below goes to stderr
        return fail(f"no command given; run `{PROG} COMMAND ...` with a command from `{PROG} --help`")
    except UsageError as error:
        command = error.ctx.command_path if error.ctx is not None else PROG
        return fail(f"{error.format_message().rstrip('.')}; see `{command} --help`")
    except ClickException as error:
        return fail(error.format_message())
    except (BadInput, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError) as error:
        return fail(str(error))
    return result if isinstance(result, int) else 0


def empty_value(argv: list[str]) -> str | None:
    """What is wrong with an empty option value on the command line (`--out ""`, `--model=`),
    else None: no option of any command means something by an empty value (an empty path would
    be the current directory, an empty name nothing)."""
    for i, word in enumerate(argv):
        if word.startswith("--") and word.endswith("="):
            return f"{word[:-1]} is empty; give it a value, or leave the option out for its default"
        if word == "" and i and argv[i - 1].startswith("--") and "=" not in argv[i - 1]:
            return f"{argv[i - 1]} is empty; give it a value, or leave the option out for its default"
    return None  # an empty argument (a prompt) is the command's to judge


def fail(message: str) -> int:
    """Print `message` after `error: ` on stderr; the exit status for bad input. (A report,
    such as a tokenizer mismatch's, may list its items on lines of their own below.)"""
    print(f"error: {message}", file=sys.stderr)
    return 2
