"""Every command's `--help` shows each option's help text as written: nothing read as markup
(`'.[llamacpp]'`, `[default: ...]`), nothing cut. The commands are read from the app, so a
command added later is checked too. Line wrapping is the terminal's business: whitespace is
left out of the comparison."""

from __future__ import annotations

import re

import pytest
import typer

from verispec.cli import app, main

COMMANDS = typer.main.get_command(app).commands


def squeezed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def shown_default(param) -> str | None:
    """A `show_default` text as click prints it: `(text)` inside `[default: ...]`."""
    return f"({param.show_default})" if isinstance(param.show_default, str) else None


def test_the_app_has_its_commands():
    assert {"generate", "bench", "demo", "audit", "train", "proposers"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_shows_every_option_text_verbatim(name, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main([name, "--help"]) == 0
    shown = squeezed(capsys.readouterr().out)
    command = COMMANDS[name]
    texts = [command.help or ""] if command.help else []
    for param in command.params:
        texts += [t for t in (getattr(param, "help", None), shown_default(param)) if t]
        texts += [opt for opt in (*param.opts, *param.secondary_opts) if opt.startswith("-")]
    missing = [t for t in texts if squeezed(t) not in shown]
    assert not missing, f"`verispec {name} --help` does not show {missing}"


def test_brackets_and_defaults_survive(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["bench", "--help"]) == 0
    shown = squeezed(capsys.readouterr().out)
    assert squeezed("pip install -e '.[llamacpp]'") in shown
    assert squeezed("[default: on with the fast, static and llama.cpp runtimes") in shown
    assert squeezed("lookup+medusa[:DIR][:weights=F]") in shown
