"""The engine's public names (``macbatch/engine/__init__.py``): each is its module's own object,
the type checker's imports name the same (name, module) pairs as the lazy table, and importing
the package, or names whose modules need no MLX, loads no MLX (``--help`` and the request layer
stay fast)."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

import macbatch.engine as engine

# names the command line and the request layer read before any model loads
LIGHT = (
    "Tokenizer",
    "PromptInput",
    "ToolFormat",
    "FinishReason",
    "RequestOutput",
    "EngineInfo",
    "load_image",
    "resolve_model_path",
    "check_speculative",
    "DEFAULT_SPECULATIVE_TOKENS",
    "stored_models",
    "clear_stored",
)


def test_every_export_is_its_modules_object():
    for name, module in engine._EXPORTS.items():
        assert getattr(engine, name) is getattr(import_module(module), name), name
    assert set(engine.__all__) <= set(dir(engine))
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        engine.Nothing  # noqa: B018


def test_the_type_checkers_imports_are_the_table():
    tree = ast.parse(Path(engine.__file__).read_text())
    guarded = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    pairs = {
        (alias.name, node.module)
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert pairs == set(engine._EXPORTS.items())


def test_the_package_and_its_light_names_load_no_mlx():
    probe = (
        f"import sys; import macbatch.engine; print(sorted(m for m in sys.modules "
        f"if m.startswith('macbatch.engine.'))); from macbatch.engine import {', '.join(LIGHT)}; "
        f"print('mlx' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.split("\n")[:2] == ["[]", "False"]
