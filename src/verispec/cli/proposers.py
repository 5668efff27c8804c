"""`verispec proposers`: every proposer kind and k policy the other commands accept."""

from __future__ import annotations

import json
import textwrap

import typer
from verispec.cli import app
from verispec.registry import K_POLICIES, proposer_kinds


@app.command()
def proposers(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
) -> None:
    """List each proposer (its spec for --proposer and bench's verispec-<spec>-kN, chosen or
    sampled drafts, the verification rules exact for them, whether the exhaustive audit covers
    it) and each k policy."""
    kinds = [kind.as_dict() for kind in proposer_kinds()]
    if as_json:
        print(json.dumps({"proposers": kinds, "k_policies": K_POLICIES}))
        return
    width = max(len(kind["grammar"]) for kind in kinds)
    print("Proposers: --proposer SPEC; bench methods verispec-SPEC-kN, -auto, -heuristic, -tree, -tree:W1xW2x....")
    for kind in kinds:
        print(f"  {kind['grammar']:<{width}}  {kind['drafts']} drafts; rules {', '.join(kind['rules'])}")
        print(textwrap.fill(kind["description"], 78, initial_indent=" " * 4, subsequent_indent=" " * 4))
        audited = f"audited: verispec audit --proposer {kind['name']}" if kind["audited"] else f"not audited: {kind['not_audited']}"
        print(textwrap.fill(audited, 78, initial_indent=" " * 4, subsequent_indent=" " * 6))
    print("\nk policies: --k SPEC; in bench method names kN, auto, heuristic, tree or tree:W1xW2x....")
    width = max(len(spec) for spec in K_POLICIES)
    for spec, meaning in K_POLICIES.items():
        print(f"  {spec:<{width}}  {meaning}")
