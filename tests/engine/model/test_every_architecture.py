"""Every model module of mlx-lm's ``mlx_lm/models/`` is served with mlx-lm's own greedy tokens
(several requests batched, chunked prefill, preemption, a prefix hit: one engine per module) or
refused at load with the reason the families table gives; anything else fails, so a module an
mlx-lm upgrade brings fails here until it is served or refused. mlx-vlm's language models that
mlx-lm lacks are held to the same rule by test_vlm_only_text.py."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macbatch.engine.model.families import unsupported_reason
from tests.support.architectures import import_problem, model_modules
from tests.support.every_architecture import assert_refused_at_load, assert_served_like_mlx_lm

# modules whose layers run a kernel MLX has only on Metal: nothing to compare on another device
METAL_ONLY = {"bitnet": "its BitLinear layers run a Metal kernel"}


def _case(name: str) -> object:
    marks = []
    if name in METAL_ONLY:
        marks.append(pytest.mark.skipif(not mx.metal.is_available(), reason=METAL_ONLY[name]))
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_case(name) for name in model_modules()])
def test_served_identically_or_refused(name, tiny_tokenizer, tmp_path):
    problem = import_problem(name)
    if problem is not None:
        pytest.skip(f"mlx-lm's module needs what is not installed here: {problem}")
    if unsupported_reason(name) is not None:
        assert_refused_at_load(name, tmp_path / name)
    else:
        assert_served_like_mlx_lm(name, tiny_tokenizer)
