"""Real tokenizers (vendored in tests/support/tokenizers/, where each SOURCE.txt says how it was
built) and a family of JSON schemas for structured-output tests."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

TOKENIZERS = Path(__file__).parent / "tokenizers"
QWEN3_VOCAB = 151936  # the model's vocabulary (the tokenizer has 151669 tokens)
MISTRAL_VOCAB = 32768


@functools.cache
def real_tokenizer(name: str) -> Any:
    """mlx-lm's TokenizerWrapper for a vendored tokenizer ("qwen3" or "mistral")."""
    from mlx_lm.tokenizer_utils import load

    return load(TOKENIZERS / name)


# Field building blocks: every string and array is bounded so a random-weight model, forced
# through the grammar, finishes its reply well within the tests' max_tokens.
_FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("id", {"type": "integer", "minimum": 0, "maximum": 999}),
    ("name", {"type": "string", "maxLength": 6}),
    ("kind", {"enum": ["cat", "dog", "fox"]}),
    ("score", {"type": "number", "minimum": -1, "maximum": 1, "multipleOf": 0.25}),
    ("code", {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}),
    ("ok", {"type": "boolean"}),
    ("tags", {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}),
    (
        "point",
        {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -9, "maximum": 9},
                "y": {"type": "integer", "minimum": -9, "maximum": 9},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
    ),
    ("level", {"type": "integer", "enum": [1, 2, 3]}),
    (
        "items",
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["n"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 2,
        },
    ),
]


def function_tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool whose arguments are exactly ``properties`` (all required)."""
    parameters = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


# Bounded arguments, so forced calls from a random-weight model finish within max_tokens.
WEATHER_TOOL = function_tool(
    "get_weather", {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}}
)
ADD_TOOL = function_tool(
    "add",
    {
        "a": {"type": "integer", "minimum": 0, "maximum": 99},
        "b": {"type": "integer", "minimum": 0, "maximum": 99},
    },
)


def schema_family(count: int = 32) -> list[dict[str, Any]]:
    """``count`` different object schemas: each takes three to five building blocks, some of
    them optional, some nested one level deeper."""
    schemas = []
    for i in range(count):
        picked = [_FIELDS[(i + k * (1 + i % 3)) % len(_FIELDS)] for k in range(3 + i % 3)]
        properties = dict(picked)
        required = [name for j, (name, _) in enumerate(picked) if (i + j) % 3 != 0]
        schema: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        if i % 4 == 3:  # nest it: {"data": {...}, "version": 1}
            schema = {
                "type": "object",
                "properties": {"data": schema, "version": {"const": i}},
                "required": ["data", "version"],
                "additionalProperties": False,
            }
        schemas.append(schema)
    return schemas


def save_model_with_tokenizer(path: Path, name: str, vocab_size: int, **overrides: Any) -> Path:
    """A tiny random qwen3-architecture model in Hugging Face layout (``overrides``: config
    fields, as ``save_model`` takes them), with a vendored real tokenizer (its files copied as
    they are) and that tokenizer's EOS ids in config.json."""
    import json
    import shutil

    from tests.support.tiny import save_model

    save_model(path, vocab_size=vocab_size, **overrides)
    source = TOKENIZERS / name
    for file in source.iterdir():
        if file.name != "SOURCE.txt":
            shutil.copy(file, path / file.name)
    config = json.loads((path / "config.json").read_text())
    generation = json.loads((source / "generation_config.json").read_text())
    config["eos_token_id"] = generation["eos_token_id"]
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


# A small answer schema the thinking-budget tests put after the reasoning.
SKY_SCHEMA = {
    "type": "object",
    "properties": {"sky": {"enum": ["blue", "grey"]}, "why": {"type": "integer"}},
    "required": ["sky", "why"],
    "additionalProperties": False,
}
