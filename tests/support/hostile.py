"""Hostile inputs the reliability tests share (issue 32): schemas and grammars that chain deep
enough to overflow llguidance's stack, and an OpenAPI-sized schema that must still compile."""

from __future__ import annotations

import random
from typing import Any


def ref_chain_schema(links: int) -> dict[str, Any]:
    """An object whose one property is the next definition, ``links`` definitions deep (1,000
    links: 75 KB of JSON, which killed the server with SIGSEGV)."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "properties": {"next": {"$ref": f"#/$defs/d{i + 1}"}},
            "required": ["next"],
        }
        for i in range(links)
    }
    defs[f"d{links}"] = {"type": "string", "maxLength": 3}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def rule_chain_grammar(rules: int) -> str:
    """A Lark grammar of ``rules`` rules, each pointing to the next (3,000 killed the server)."""
    lines = ["start: r0", *(f"r{i}: r{i + 1}" for i in range(rules - 2)), f'r{rules - 2}: "x"']
    return "\n".join(lines)


def openapi_sized_schema(definitions: int = 400, seed: int = 0) -> dict[str, Any]:
    """An OpenAPI-sized schema: ``definitions`` objects of ten typed properties, each referring
    to later ones (chains up to ~50 definitions long), plus one recursive type; about 22,000
    lines pretty-printed."""
    rnd = random.Random(seed)
    defs: dict[str, Any] = {}
    for i in range(definitions):
        properties: dict[str, Any] = {}
        for j in range(10):
            kind = rnd.choice(["string", "integer", "number", "boolean", "enum", "array", "ref"])
            if kind == "enum":
                properties[f"p{j}"] = {"enum": ["alpha", "beta", "gamma"]}
            elif kind == "array":
                properties[f"p{j}"] = {"type": "array", "items": {"type": "string"}}
            elif kind == "ref" and i % 50 and i + 1 < definitions:
                target = rnd.randrange(i + 1, min(definitions, i + 20))
                properties[f"p{j}"] = {"$ref": f"#/$defs/D{target}"}
            else:
                kind = "string" if kind == "ref" else kind
                properties[f"p{j}"] = {"type": kind, "description": f"field {j} of D{i}"}
        defs[f"D{i}"] = {
            "type": "object",
            "properties": properties,
            "required": list(properties)[:3],
            "additionalProperties": False,
        }
    defs["Tree"] = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
        },
    }
    return {
        "$defs": defs,
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/D0"}, "tree": {"$ref": "#/$defs/Tree"}},
        "required": ["root"],
    }
