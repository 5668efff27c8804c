"""The core's seams: every import rule that docs/design.md states, read from its table and
checked against the source (every `import verispec...` statement, lazy ones inside functions
too). A package's rule covers every module in it; `verispec.*` in a rule forbids every verispec
module, the root included (a leaf). Importing any `verispec.x` runs the package root's
`__init__` first; that implicit step is left out, but a module that names the root (`import
verispec`, `from verispec import __version__`) imports it, and with it everything the root
re-exports (the engine, and through it the models)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import verispec

SOURCE = Path(verispec.__file__).parent
DESIGN = SOURCE.parents[1] / "docs" / "design.md"
ROOT = "verispec"
ANY = f"{ROOT}.*"


def module_path(module: str) -> Path | None:
    """The file of `verispec.a.b`: a/b.py or a/b/__init__.py (None for a name that is no module)."""
    parts = module.split(".")[1:]
    for path in (SOURCE.joinpath(*parts).with_suffix(".py"), SOURCE.joinpath(*parts, "__init__.py")):
        if path.exists():
            return path
    return None


def imports_in(source: str) -> set[str]:
    """The verispec modules a source text names in its import statements; `from verispec import
    verify` names the module verispec.verify, `from verispec import __version__` the root."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name == ROOT or a.name.startswith(ROOT + ".")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == ROOT:
                for alias in node.names:
                    sub = f"{ROOT}.{alias.name}"
                    found.add(sub if module_path(sub) is not None else ROOT)
            elif node.module.startswith(ROOT + "."):
                found.add(node.module)
                # `from verispec.proposers import lookahead` names the module verispec.proposers.lookahead too
                found |= {f"{node.module}.{a.name}" for a in node.names if module_path(f"{node.module}.{a.name}") is not None}
    return found


def files_of(module: str) -> list[Path]:
    """The files a rule about `module` covers: its own, or for a package every module in it
    (the root: its __init__ only)."""
    path = module_path(module)
    if path is None:
        return []
    if path.name == "__init__.py" and module != ROOT:
        return sorted(path.parent.rglob("*.py"))
    return [path]


def imported_by(module: str) -> set[str]:
    """Every verispec module `module` (or any module of the package) imports, transitively,
    with the packages on the way."""
    seen: set[str] = set()
    todo = list(files_of(module))
    done: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in done:
            continue
        done.add(path)
        for name in imports_in(path.read_text()):
            parts = name.split(".")
            first = 1 if name == ROOT else 2  # verispec.a.b also runs verispec.a's __init__
            for i in range(first, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix not in seen and module_path(prefix) is not None:
                    seen.add(prefix)
                    todo.append(module_path(prefix))
    return seen


def covers(imported: set[str], forbidden: str) -> bool:
    """Whether `imported` holds `forbidden` or a module inside it (the root only by name;
    `verispec.*`: any verispec module)."""
    if forbidden == ANY:
        return bool(imported)
    if forbidden == ROOT:
        return ROOT in imported
    return any(name == forbidden or name.startswith(forbidden + ".") for name in imported)


def design_rules() -> list[tuple[str, list[str]]]:
    """The rows of docs/design.md's import table: (module, the modules it never imports)."""
    text = DESIGN.read_text()
    table = text[text.index("<!-- import rules -->") : text.index("<!-- /import rules -->")]
    rules = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        rules.append((cells[0].strip("`"), re.findall(r"`([\w.*]+)`", cells[1])))
    return rules


RULES = design_rules()


def test_design_states_the_rules_that_keep_the_loops_out():
    by_module = dict(RULES)
    assert {ROOT, "verispec.engine"} <= set(by_module["verispec.models"])
    assert "verispec.audit" in by_module["verispec.registry"]
    assert "verispec.batching" in by_module["verispec.engine"] and "verispec.batching" in by_module["verispec.models"]
    assert by_module["verispec.checks"] == [ANY]  # the argument checks are a leaf
    assert {"verispec.bench", "verispec.runtime_check"} <= set(by_module["verispec.peers"])  # below both
    assert "verispec.bench.methods" in by_module["verispec.runtime_check"]  # the adapters are the peers'
    assert by_module["verispec.statistics"] == [ANY]
    assert "verispec.models.loading" in by_module["verispec.models.runtimes"]  # formats < runtimes < loading
    assert {"verispec.models.runtimes", "verispec.models.loading"} <= set(by_module["verispec.models.formats"])
    assert len(RULES) >= 10


@pytest.mark.parametrize(("module", "never"), RULES, ids=[module for module, _ in RULES])
def test_a_module_does_not_import_the_layers_it_must_not_know(module, never):
    if module_path(module) is None:
        pytest.skip(f"{module} does not exist (yet)")
    imported = imported_by(module)
    broken = [name for name in never if covers(imported, name)]
    assert not broken, f"{module} imports {broken} (directly or through what it imports); docs/design.md forbids it"


def test_every_module_named_in_the_rules_is_a_module_or_one_to_come():
    upcoming = {"verispec.batching", "verispec.server"}  # named so nothing below may import them
    named = ({module for module, never in RULES} | {name for _, never in RULES for name in never}) - {ANY}
    assert {name for name in named if module_path(name) is None} <= upcoming


def test_the_check_sees_imports_through_other_modules():
    assert "verispec.profile" in imported_by("verispec.registry")
    assert "verispec.drafts" in imported_by("verispec.engine")
    assert "verispec.proposers" in imported_by("verispec.engine")  # through proposers.base
    assert "verispec.machine" in imported_by("verispec.models")  # a package's rule covers its modules
    assert covers({"verispec.drafts"}, ANY) and covers({ROOT}, ANY) and not covers(set(), ANY)


def test_the_check_sees_the_package_root_and_what_it_re_exports():
    assert imports_in("import verispec") == {ROOT}
    assert imports_in("from verispec import __version__") == {ROOT}
    assert imports_in("from verispec import verify") == {"verispec.verify"}
    assert imports_in("from verispec.proposers import lookahead, Proposer") == {"verispec.proposers", "verispec.proposers.lookahead"}
    assert imports_in("def f():\n    from verispec.engine import generate\n") == {"verispec.engine"}
    assert "verispec.engine" in imported_by(ROOT)  # so models -> root would close a loop


def test_the_registry_imports_every_builder_it_registers():
    """Each proposer kind's entry lives beside its builder, and the registry imports that module
    by name (no module named in a string), so the rules above see every edge to a builder."""
    from verispec.registry import PROPOSERS

    imported = imported_by("verispec.registry")
    for kind in PROPOSERS.values():
        for function in (kind.build, kind.audit, kind.parse):
            if function is not None:
                module = getattr(function, "func", function).__module__  # a family's entry binds its kind
                assert module in imported, f"{kind.name}: {module} is not imported by the registry"
    assert "importlib" not in (SOURCE / "registry.py").read_text()


def test_runtime_weight_format_and_head_kind_are_enums_where_they_cross():
    import torch

    from verispec.head_kind import HeadKind
    from verispec.heads.untrained import tiny_head
    from verispec.models.loading.load import LoadedModel
    from verispec.models.runtime import Runtime
    from verispec.models.tables import random_table
    from verispec.models.weight_format import WeightFormat

    loaded = LoadedModel("m", None, None, None, (), torch.float32, Path("m"), runtime="fast", weight_format="q4")
    assert loaded.runtime is Runtime.FAST and loaded.weight_format is WeightFormat.Q4 and loaded.dtype_name == "q4"
    with pytest.raises(ValueError):
        LoadedModel("m", None, None, None, (), torch.float32, Path("m"), runtime="gpu")
    assert tiny_head("medusa", random_table(4, 1, seed=0)).config.kind is HeadKind.MEDUSA
    from verispec.models.loading.format_costs import DEFAULT_BF16, FormatCost
    from verispec.proposers.self_draft import SelfDraft
    from verispec.proposers.trained import HeadSpec, parse

    assert FormatCost.from_dict(DEFAULT_BF16.to_dict()).runtime is Runtime.FAST  # a JSON file's name read once
    assert DEFAULT_BF16.to_dict()["runtime"] == "fast"  # the text users type and JSON holds, unchanged
    with pytest.raises(ValueError, match="unknown runtime 'gpu'; choose auto, fast, hf"):
        SelfDraft(None, "q4", runtime="gpu")
    assert parse(HeadKind.EAGLE, "").kind is HeadKind.EAGLE and HeadSpec("medusa").kind is HeadKind.MEDUSA


def test_policies_models_and_requests_meet_at_their_protocols():
    """What the engine and the scheduler ask is declared where it is asked: a policy's `trees`,
    a slot model's `reserve_slots`, a request's parsed proposer."""
    from verispec.models.base import SlotScoring
    from verispec.models.tables import random_table
    from verispec.policies import AutoK, ConstantK, ConstantTree, HeuristicK, KPolicy
    from verispec.registry import parse_spec
    from verispec.request import ParsedProposer, Request
    from verispec.tree_policy import TreePolicy

    assert not any(policy.trees for policy in (ConstantK, HeuristicK, AutoK)) and KPolicy.trees is False
    assert ConstantTree.trees and TreePolicy.trees
    table = random_table(4, 1, seed=0)
    assert isinstance(table, SlotScoring) and table.reserve_slots(3) is None  # each slot owns its cache
    spec = parse_spec("lookup")
    assert isinstance(spec, ParsedProposer) and not isinstance("lookup", ParsedProposer)
    assert Request((1, 2), 4, proposer=spec, k=2).proposer is spec
    with pytest.raises(ValueError, match="proposer must be a registry spec"):
        Request((1, 2), 4, proposer=object(), k=2)


def module_level_imports(source: str) -> set[str]:
    """The verispec modules a source names in its module-level imports: its top-level
    statements and those inside module-level `if` (`TYPE_CHECKING` included: a type's circle is
    a design's circle too) and `try` blocks; not the lazy ones inside functions."""
    body, statements = list(ast.parse(source).body), []
    while body:
        node = body.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            statements.append(node)
        elif isinstance(node, (ast.If, ast.Try)):
            body += node.body + node.orelse + getattr(node, "finalbody", []) + [
                line for handler in getattr(node, "handlers", []) for line in handler.body]
    found: set[str] = set()
    for node in statements:
        named = imports_in(ast.unparse(node))
        if isinstance(node, ast.ImportFrom) and all(module_path(f"{node.module}.{a.name}") for a in node.names):
            named.discard(node.module)  # `from package import module, ...` waits on the modules only
        found |= named
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join((ROOT, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def import_graph() -> dict[str, set[str]]:
    """verispec module -> the verispec modules it imports at module level (a package: its
    __init__; the implicit import of a module's parent packages left out, as Python runs a
    package's __init__ before the module but the package never waits on the module unless it
    names it)."""
    return {module_name(path): module_level_imports(path.read_text()) - {module_name(path)} for path in SOURCE.rglob("*.py")}


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports in `graph` (its modules in order, the first again at the end), or None."""
    state: dict[str, str] = {}  # module -> "open" while on the path, "done" after

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for name in sorted(graph.get(module, ())):
            if state.get(name) == "open":
                return [*path[path.index(name):], name]
            if name not in state and (found := visit(name, [*path, name])):
                return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def test_the_module_level_import_graph_has_no_circle():
    found = circle(import_graph())
    assert found is None, f"an import circle: {' -> '.join(found)}"


def test_the_circle_check_sees_a_circle_and_module_level_imports_only():
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    source = ("from typing import TYPE_CHECKING\nfrom verispec import verify\nif TYPE_CHECKING:\n"
              "    from verispec.engine import Decoding\ndef f():\n    from verispec.bench import suite\n")
    assert module_level_imports(source) == {"verispec.verify", "verispec.engine"}
    assert module_level_imports("from verispec.runtime_check import greedy, law") == {
        "verispec.runtime_check.greedy", "verispec.runtime_check.law"}
    assert "verispec.bench.sweep" in import_graph()["verispec.bench.suite"]
