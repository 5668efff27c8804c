"""The README and docs/ as a reader meets them: the README short, every page of docs/ one
click from it, every relative link and anchor resolving, and every results table equal to what
`benchmarks/results_tables.py` writes from the kept runs' summaries."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs" / "results" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def results_tables():
    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "benchmarks" / "results_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prose(page: Path) -> str:
    """The page without its fenced code blocks (a `# comment` there is no heading)."""
    return FENCE.sub("", page.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link texts kept, lower case, punctuation dropped, spaces
    to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for line in prose(page).splitlines():
        if match := re.match(r"#{1,6} (.*)", line):
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def test_results_tables_equal_the_kept_summaries():
    stale = results_tables().stale()
    assert not stale, f"results tables differ from docs/results/*.json in {[str(p.relative_to(ROOT)) for p in stale]}; run .venv/bin/python benchmarks/results_tables.py"


def test_every_results_table_names_kept_runs():
    tables = results_tables()
    for page in tables.documents():
        for names in re.findall(r"<!-- results: ([\w.,+-]+) -->", page.read_text()):
            for name in names.split(","):
                assert (tables.RESULTS / f"{name}.json").is_file(), f"{page.name} shows run {name}, which is not kept"


def test_the_check_finds_a_hand_edited_number():
    tables = results_tables()
    text = README.read_text()
    block = re.search(r"<!-- results: [^>]+ -->\n(.*?)<!-- /results -->", text, re.S)
    assert block, "the README shows no results table"
    edited = text.replace(block.group(1), re.sub(r"\d\.\d\dx", "9.99x", block.group(1), count=1))
    assert tables.render(edited) == text != edited


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_link_and_anchor_resolves(page):
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"


def test_every_page_of_docs_is_one_click_from_the_readme():
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(prose(README))}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")} | {(ROOT / "docs" / "results" / "README.md").resolve()}
    assert not pages - linked, f"not linked from the README: {sorted(p.name for p in pages - linked)}"


def test_the_readme_reads_in_ten_minutes():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    long = [line[:60] for line in lines if len(line) > 200 and not line.startswith("|")]
    assert not long, f"README lines over 200 characters (tables aside): {long}"


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_page_starts_with_what_it_gives(page):
    paragraphs = [p for p in page.read_text().split("\n\n") if p.strip()]
    assert paragraphs[0].startswith("# ") and "\n" not in paragraphs[0].strip(), "a page opens with one title"
    assert len(paragraphs) > 1 and not paragraphs[1].startswith(("#", "|", "```")), "then says what a reader gets"


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)


def unbound_names(source: str) -> set[str]:
    """Names the code reads that nothing in it binds (assignment, import, def, loop or
    comprehension variable) and that are no builtin: a NameError when the reader runs it."""
    import ast
    import builtins

    tree = ast.parse(source)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def test_the_readmes_python_runs_without_an_undefined_name():
    """The README's Python blocks read as one session (each builds on the ones above)."""
    assert unbound_names("\n".join(python_blocks(README))) == set()
    assert unbound_names("print(prompts)") == {"prompts"}
