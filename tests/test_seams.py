"""The core's seams: what each module imports, directly or through the modules it imports,
read from the source (every `import verispec...` statement, lazy ones inside functions too;
the package's own `verispec/__init__`, which re-exports the public API, is left out)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import verispec

SOURCE = Path(verispec.__file__).parent


def module_path(module: str) -> Path | None:
    """The file of `verispec.a.b`: a/b.py or a/b/__init__.py (None for a name that is no module)."""
    parts = module.split(".")[1:]
    for path in (SOURCE.joinpath(*parts).with_suffix(".py"), SOURCE.joinpath(*parts, "__init__.py")):
        if path.exists():
            return path
    return None


def direct_imports(module: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(module_path(module).read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found |= {name for name in names if name.startswith("verispec.")}
    return found


def imported_by(module: str) -> set[str]:
    """Every verispec module `module` imports, transitively, with the packages on the way."""
    seen, todo = set(), [module]
    while todo:
        for name in direct_imports(todo.pop()):
            parts = name.split(".")
            for i in range(2, len(parts) + 1):  # verispec.a.b also runs verispec.a's __init__
                prefix = ".".join(parts[:i])
                if prefix not in seen and module_path(prefix) is not None:
                    seen.add(prefix)
                    todo.append(prefix)
    return seen


@pytest.mark.parametrize(
    ("module", "never"),
    [
        ("verispec.verify", {"verispec.proposers", "verispec.engine", "verispec.policies"}),
        ("verispec.drafts", {"verispec.proposers", "verispec.verify", "verispec.sampling"}),
        ("verispec.policies", {"verispec.profile", "verispec.engine", "verispec.proposers"}),
        ("verispec.engine", {"verispec.profile", "verispec.registry", "verispec.audit", "verispec.bench"}),
        ("verispec.cost", {"verispec.registry", "verispec.profile", "verispec.engine", "verispec.proposers"}),
    ],
)
def test_a_module_does_not_import_the_layers_it_must_not_know(module, never):
    assert not imported_by(module) & never


def test_the_check_sees_imports_through_other_modules():
    assert "verispec.profile" in imported_by("verispec.registry")
    assert "verispec.drafts" in imported_by("verispec.engine")
    assert "verispec.proposers" in imported_by("verispec.engine")  # through proposers.base
