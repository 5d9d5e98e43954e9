"""The house rule for test code (../shared/DESIGN.md): shared test helpers live in
``tests/support/``, and no test imports another test module, a conftest included. A helper
imported from a conftest or from a test file ties one test module to another (renaming or moving
the one breaks the other; importing a conftest by name runs it a second time under a second
name) and hides where the helpers are. So every import of the ``tests`` package, from a test, a
conftest, a helper or a benchmark, names ``tests.support`` or a module in it.

Imports are read from the source with ``ast`` at any level (inside functions too), relative ones
resolved against their package; a bare ``import conftest`` or ``from helpers import x`` (a module
of the file's own folder, reached through pytest's rootdir insertion) counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = "tests.support"


def _sources() -> list[Path]:
    return sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")])


def _package(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts if parts[-1] == "__init__" else parts[:-1]).removesuffix(".__init__")


def imports(source: str, path: Path) -> list[tuple[int, list[str]]]:
    """For each import statement in ``source`` (the text of the file at ``path``): its line and
    the modules it may name, absolute (``from a.b import c``: ``a.b`` and ``a.b.c``, since ``c``
    may be a module)."""
    package = _package(path)
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, [alias.name]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, [origin] + [f"{origin}.{a.name}" for a in node.names]))
    return found


def is_a_test_module(name: str, path: Path) -> bool:
    """Whether the module ``name``, imported by the file at ``path``, is one of the tests
    package's outside tests.support, or a module of ``path``'s folder imported bare."""
    top = name.split(".")[0]
    if top == "tests":
        return name != "tests" and name != ALLOWED and not name.startswith(ALLOWED + ".")
    return top == "conftest" or (path.parent / f"{top}.py").exists()


def layout_violations() -> list[str]:
    violations = []
    for path in _sources():
        for line, names in imports(path.read_text(), path):
            bad = [name for name in names if is_a_test_module(name, path)]
            if bad:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {bad[0]}")
    return violations


def test_tests_import_helpers_only_from_tests_support() -> None:
    violations = layout_violations()
    assert not violations, "move the helpers to tests/support/:\n" + "\n".join(violations)


def test_the_check_sees_every_way_to_import_a_test_module() -> None:
    here = ROOT / "tests" / "vision" / "test_example.py"
    for source in [
        "from tests.vision.conftest import TinyVlm",
        "from tests.vision import conftest",
        "from .test_vision_engine import chat",
        "from . import conftest",
        "import tests.tui.test_sessions",
        "import conftest",
        "from test_vision_engine import chat",
        "def later():\n    from tests.server.conftest import served\n",
    ]:
        [(_, names)] = imports(source, here)
        assert any(is_a_test_module(name, here) for name in names), source
    for source in [
        "from tests.support.tiny import save_model",
        "from tests.support import tiny_vlm",
        "import tests.support.msl.emulator",
        "from macbatch.engine import Engine",
        "import pytest",
    ]:
        [(_, names)] = imports(source, here)
        assert not any(is_a_test_module(name, here) for name in names), source
