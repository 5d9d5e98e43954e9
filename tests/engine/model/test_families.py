"""One home per model family: no module of the engine but the families table names a family.

Read from the source with ``ast``: a string constant equal to a ``model_type`` the table knows (a
refused one, or one with a quirk) anywhere else in ``macbatch/engine`` is a decision keyed on the
name that belongs in ``model/families.py`` as a capability. Tool-call syntax names are not model
types, though some are spelled alike ("gemma4", "deepseek_v32"): inside ``parsers/tool_formats``
the registered syntax names are allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from macbatch.engine.model import families
from macbatch.engine.parsers.tool_formats import SYNTAXES

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "macbatch" / "engine"
TOOL_FORMATS = ENGINE / "parsers" / "tool_formats"
KNOWN = frozenset(families.FAMILIES)


def family_literals(source: str) -> list[tuple[int, str]]:
    """Each string constant of ``source`` that is a known model type: (line, name)."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KNOWN
    ]


def test_no_engine_module_outside_the_families_table_names_a_family() -> None:
    found = []
    for path in sorted(ENGINE.rglob("*.py")):
        if path == Path(families.__file__).resolve():
            continue
        allowed = set(SYNTAXES) if TOOL_FORMATS in path.parents else set()
        found += [
            f"{path.relative_to(ROOT)}:{line}: {name!r}"
            for line, name in family_literals(path.read_text())
            if name not in allowed
        ]
    assert not found, "model types named outside engine/model/families.py:\n" + "\n".join(found)


def test_the_check_sees_a_branch_on_a_family_name() -> None:
    source = 'if config.model_type == "gemma4":\n    rows = scaled(rows)\nBOTH = ("qwen3_vl", x)\n'
    assert family_literals(source) == [(1, "gemma4"), (3, "qwen3_vl")]


def test_refused_known_and_unknown_types() -> None:
    assert families.unsupported_reason("deepseek_v3") is None  # MLA: latent pages
    assert families.unsupported_reason("bert") is None  # served by the encoder engine
    assert families.unsupported_reason("nomic_bert") is None  # a rotary encoder it runs
    assert "not a text generator" in (families.unsupported_reason("siglip") or "")
    assert families.unsupported_reason("falcon_h1") is None  # a quirk, not a refusal
    assert families.family("a_type_no_one_has_made") == families.Family()


def test_every_vision_family_is_consistent() -> None:
    """DeepStack features ride beside the tower's rows, and M-RoPE needs the tower's patch grid:
    both only where the tower encodes the images."""
    for name, family in families.FAMILIES.items():
        vision = family.vision
        assert vision is None or family.vision_refusal is None, name
        if vision is not None and (vision.deepstack or vision.mrope is not None):
            assert vision.features is families.ImageFeatures.TOWER, name
