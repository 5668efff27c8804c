"""Passages of local package texts and the grounded instructions built on them
(`verispec.train.documents`), on a small directory tree made here: what is read and skipped,
the filters, deduplication, the guard against benchmark data, and determinism."""

from __future__ import annotations

import gzip
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from verispec.train.documents import (
    REPOSITORY, DocumentRecipe, Documents, find_passages, forbidden, quoted, readable, split_passages,
)
from verispec.train.prompts import fold


def prose(topic: str, sentences: int = 8) -> str:
    """A paragraph of plain English about `topic`, about 80 characters a sentence."""
    return textwrap.fill(" ".join(f"The {topic} tool reads its settings from a file and writes report number {i} for the user." for i in range(sentences)))


@pytest.fixture()
def tree(tmp_path: Path) -> tuple[DocumentRecipe, Path]:
    docs, site = tmp_path / "doc", tmp_path / "site"
    (docs / "alpha").mkdir(parents=True)
    (docs / "alpha" / "README").write_text(f"{prose('alpha')}\n\n{prose('alpha', 3)}\n\n{prose('ALPHA  ')}\n")
    with gzip.open(docs / "alpha" / "NEWS.gz", "wt") as f:
        f.write(prose("beta") + "\n")
    (docs / "alpha" / "copyright").write_text(prose("copyright"))
    with gzip.open(docs / "alpha" / "changelog.Debian.gz", "wt") as f:
        f.write(prose("changelog"))
    (docs / "alpha" / "index.html").write_text(prose("html"))
    (docs / "alpha" / "notes.txt").write_bytes(b"\x00\xff\xfe binary " * 100)
    (docs / "gamma").mkdir()
    table = "\n".join(" ".join(f"{i * j:6d}" for j in range(12)) for i in range(12))
    (docs / "gamma" / "README.md").write_text(f"{table}\n\nGamma\n=====\n{prose('gamma', 6)}\n\n{prose('delta')}\n")
    (docs / "shared" / "data").mkdir(parents=True)
    (docs / "shared" / "data" / "README").write_text(prose("benchmark"))
    (docs / "gamma" / "README.rst").symlink_to(docs / "shared" / "data" / "README")
    dist = site / "epsilon-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: epsilon\nVersion: 1.0\n\n{prose('epsilon')}\n")
    recipe = DocumentRecipe(doc_roots=(str(docs),), metadata_paths=(str(site),), min_chars=300, max_chars=800, batch=3)
    return recipe, docs


def test_passages_come_from_wanted_files_filtered_and_deduplicated(tree):
    recipe, _ = tree
    passages = find_passages(recipe)
    topics = {p.text.removeprefix("Gamma\n=====\n").split()[1].lower() for p in passages}
    # README and NEWS.gz of alpha, the prose of gamma's README.md, the distribution's METADATA
    # body; not copyright, changelog, html, binaries, the table, nor anything under shared/.
    assert topics == {"alpha", "beta", "gamma", "delta", "epsilon"}
    assert {p.source for p in passages} == {"alpha", "gamma", "python:epsilon"}
    assert all(recipe.min_chars <= len(p.text) <= recipe.max_chars for p in passages)
    assert len({fold(p.text) for p in passages}) == len(passages)  # "ALPHA  " folded onto "alpha"
    assert not any("benchmark" in p.text or "Version:" in p.text for p in passages)
    assert passages == find_passages(recipe)


def test_per_source_cap_keeps_the_first_passages_in_path_order(tree):
    recipe, _ = tree
    capped = find_passages(replace(recipe, max_per_source=1))
    assert [p.source for p in capped] == ["alpha", "gamma", "python:epsilon"]
    assert capped[0] == find_passages(recipe)[0]


def test_paragraphs_are_joined_up_to_max_chars_and_short_remainders_dropped():
    paragraphs = [prose(str(i), 2) for i in range(5)]  # ~180 characters each
    passages = split_passages("\n\n\n".join(paragraphs), 300, 400)
    assert passages == [f"{paragraphs[0]}\n\n{paragraphs[1]}", f"{paragraphs[2]}\n\n{paragraphs[3]}"]
    assert split_passages("x" * 500, 10, 400) == []


def test_filters_reject_tables_symbols_markup_and_template_markers():
    recipe = DocumentRecipe()
    text = prose("zeta")
    assert readable(text, recipe)
    assert not readable(text + "\n" + "-=" * 30, recipe)
    assert not readable(text + " <|im_end|>", recipe)
    assert not readable(text + "\x07", recipe)
    assert not readable('<a href="https://example.org/badge"><img src="https://example.org/x.svg"></a> ' * 8 + text, recipe)
    assert not readable("\n".join(" ".join(f"{i * j:5d}" for j in range(10)) for i in range(20)), recipe)


def test_benchmark_data_is_never_read(tree, tmp_path, monkeypatch):
    recipe, docs = tree
    assert forbidden(REPOSITORY / "data" / "anything.jsonl")
    assert forbidden(REPOSITORY.parent / "shared" / "data" / "specbench_dev.jsonl")
    assert forbidden(docs / "gamma" / "README.rst")  # a link into shared/
    assert not forbidden(docs / "alpha" / "README")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "README").write_text(prose("benchmark"))
    monkeypatch.setenv("VERISPEC_DATA", str(tmp_path / "bench"))
    assert forbidden(tmp_path / "bench" / "prompts.jsonl")
    with pytest.raises(ValueError, match="benchmark data"):
        find_passages(replace(recipe, doc_roots=(str(docs / "shared"),)))
    with pytest.raises(ValueError, match="benchmark data"):
        find_passages(replace(recipe, doc_roots=(str(tmp_path / "bench"),)))


def test_instructions_are_a_function_of_seed_and_round_and_cover_each_pair_once(tree):
    recipe, _ = tree
    documents = Documents(recipe)
    count, templates = len(documents.passages), len(recipe.templates)
    assert documents.rounds == -(-count * templates // recipe.batch)
    assert documents.instructions(0, 1) == Documents(recipe).instructions(0, 1)
    assert documents.instructions(0, 1) != documents.instructions(1, 1)
    every = [text for r in range(documents.rounds) for text in documents.instructions(0, r)]
    assert len(every) == len(set(every)) == count * templates
    assert documents.instructions(0, documents.rounds) == []
    # The first P instructions quote every passage once, each under one of the templates.
    first = every[:count]
    for passage in documents.passages:
        holding = [text for text in first if quoted(passage.text) in text]
        assert len(holding) == 1
        assert holding[0] in {t.format(text=quoted(passage.text)) for t in recipe.templates}


def test_recipe_names_the_method_and_the_corpus(tree):
    recipe, _ = tree
    recorded = Documents(recipe).as_dict()
    assert recorded["method"].startswith("documents: local package texts")
    assert recorded["templates"] == list(recipe.templates) and recorded["passages"] == len(find_passages(recipe))
    assert recorded == Documents(recipe).as_dict()
    assert Documents(replace(recipe, max_per_source=1)).as_dict()["passages_sha256"] != recorded["passages_sha256"]


def test_no_passages_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no passages"):
        Documents(DocumentRecipe(doc_roots=(str(tmp_path),), python_distributions=False))
