"""The one check that a family the families table refuses is refused at load, with its reason."""

from __future__ import annotations

import re

import pytest

from macbatch.engine import Engine, EngineConfig, UnsupportedModelError
from macbatch.engine.model.families import unsupported_reason
from tests.support.tiny import build_model


def assert_refused_at_load(arch: str, tokenizer) -> None:
    """A tiny ``arch`` model is refused before its forward runs, with the table's reason."""
    reason = unsupported_reason(arch)
    assert reason
    with pytest.raises(
        UnsupportedModelError,
        match=re.escape(f"'{arch}' is not supported by macbatch's paged engine: {reason}"),
    ):
        Engine(build_model(arch), tokenizer, EngineConfig(num_blocks=16))
