"""The `verispec` command line.

Each command lives in its own module of this package and registers itself on `app`. Bad input
(a ValueError, a missing file) is reported as one line on stderr with exit status 2, never a
traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click
import typer

app = typer.Typer(
    help="Exact speculative decoding: generate, audit, profile, predict and benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class BadInput(Exception):
    """A command was given something it cannot use; the message says what and what to do."""


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")


def main(argv: list[str] | None = None) -> int:
    try:
        result = app(args=argv, standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.exceptions.Abort:
        print("aborted", file=sys.stderr)
        return 1
    except click.ClickException as error:
        error.show()
        return 2
    except (BadInput, ValueError, FileNotFoundError, NotADirectoryError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0
