"""`verispec check-tokenizers TARGET DRAFT`: may these two models serve as target and draft?"""

from __future__ import annotations

import typer

from verispec.cli import app


@app.command("check-tokenizers")
def check_tokenizers_command(
    target: str = typer.Argument(..., help="Target: a model name, a .gguf file, a model or tokenizer directory."),
    draft: str = typer.Argument(..., help="Draft: same forms as TARGET."),
    trust_remote_code: bool = typer.Option(False, help="Run tokenizer code shipped in a directory."),
) -> None:
    """Compare the two tokenizers id by id, with their special tokens, pipeline and chat
    template. Exit 0 when they match (a differing chat template is only a note), 1 when not."""
    # Imported here: transformers takes seconds to import, and every command loads this module.
    from verispec.models.loading.load import load_tokenizer
    from verispec.tokenizer_contract import check_tokenizers

    report = check_tokenizers(
        load_tokenizer(target, trust_remote_code=trust_remote_code),
        load_tokenizer(draft, trust_remote_code=trust_remote_code),
    )
    typer.echo(report)
    raise typer.Exit(0 if report.ok else 1)
