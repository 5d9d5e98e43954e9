"""The files a sentence-transformers checkpoint ships beside its weights (as Qwen3-Embedding's:
modules.json, 1_Pooling/config.json, config_sentence_transformers.json), written into a tiny
model's directory."""

from __future__ import annotations

import json
from pathlib import Path

QWEN3_QUERY_PROMPT = (
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
)
_MODULE = "sentence_transformers.models."


def write_sentence_transformers(
    path: Path,
    modes: tuple[str, ...] = ("lasttoken",),
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
) -> Path:
    """``modes``: the Pooling module's ``pooling_mode_*`` flags turned on."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _MODULE + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": _MODULE + "Pooling"},
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": _MODULE + "Normalize"}
        )
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    pooling = {f"pooling_mode_{mode}": True for mode in modes}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if prompts is None:
        prompts = {"query": QWEN3_QUERY_PROMPT, "document": ""}
    st = {"prompts": prompts, "default_prompt_name": None}
    (path / "config_sentence_transformers.json").write_text(json.dumps(st))
    return path
