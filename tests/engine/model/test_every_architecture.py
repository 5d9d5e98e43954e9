"""Every model module of mlx-lm's ``mlx_lm/models/`` is served with mlx-lm's own greedy tokens
(several requests batched, chunked prefill, preemption, a prefix hit: one engine per module) or
refused at load with the reason the families table gives; anything else fails, so a module an
mlx-lm upgrade brings fails here until it is served or refused. mlx-vlm's language models that
mlx-lm lacks are listed by the second test, each expected to fail until it is served."""

from __future__ import annotations

import mlx.core as mx
import pytest

from macbatch.engine.model.families import unsupported_reason
from tests.support.architectures import import_problem, model_modules, vlm_language_models
from tests.support.every_architecture import assert_refused_at_load, assert_served_like_mlx_lm

# Known crashes and the one wrong answer of issue 60, fixed on branch i60-crashes: the merge
# deletes this set.
FIXED_ON_I60_CRASHES = frozenset({
    "plamo", "afm7", "gemma3n", "llama4", "minimax_m3_vl", "iquestloopcoder", "phixtral",
    "baichuan_m1", "bailing_moe_linear", "recurrent_gemma", "gpt_bigcode", "bailing_hybrid",
    "mamba", "mamba2", "rwkv7", "bailing_moe_v3",
})  # fmt: skip
# modules whose layers run a kernel MLX has only on Metal: nothing to compare on another device
METAL_ONLY = {"bitnet": "its BitLinear layers run a Metal kernel"}


def _case(name: str) -> object:
    marks = []
    if name in FIXED_ON_I60_CRASHES:
        marks.append(pytest.mark.xfail(strict=False, reason="fixed on branch i60-crashes"))
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


@pytest.mark.parametrize("name", vlm_language_models())
@pytest.mark.xfail(strict=False, reason="served on branch i60-vlm")
def test_every_vlm_language_model(name):
    pytest.fail(f"mlx-vlm's {name} language model is not served through the packed step yet")
