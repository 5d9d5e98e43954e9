"""The compute dtype on the CPU backend: a caller's model is never cast behind their back, a
loaded one is cast to float32 only when it fits, and the engine says which and why."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model import compute_dtype
from tests.support.oracle import mlx_lm_greedy
from tests.support.tiny import build_model, save_model

CONFIG = EngineConfig(num_blocks=16)


def _dtypes(model) -> set:
    return {v.dtype for _, v in tree_flatten(model.parameters())}


def test_callers_half_model_is_not_cast(tiny_tokenizer):
    model = build_model("qwen3")
    model.set_dtype(mx.bfloat16)
    engine = Engine(model, tiny_tokenizer, CONFIG)
    assert _dtypes(model) == {mx.bfloat16}
    assert engine.compute_dtype.dtype == "bfloat16"
    assert "EngineConfig(dtype='float32')" in engine.compute_dtype.reason
    prompt = [5, 6, 7, 8]
    [out] = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert out.token_ids == mlx_lm_greedy(model, prompt, 4)


def test_asked_for_dtype_casts_the_callers_model(tiny_tokenizer):
    model = build_model("qwen3")
    model.set_dtype(mx.bfloat16)
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=16, dtype="float32"))
    assert _dtypes(model) == {mx.float32}
    assert engine.compute_dtype.reason.startswith("EngineConfig.dtype asks for float32")


def test_loaded_half_model_is_cast_when_it_fits(tmp_path, monkeypatch):
    path = save_model(tmp_path / "float", "qwen3")
    engine = Engine.load(str(path), CONFIG)  # float32 on disk: nothing to cast
    assert engine.compute_dtype.dtype == "float32"
    from mlx_lm import convert

    convert(str(path), str(tmp_path / "half"), dtype="bfloat16")
    engine = Engine.load(str(tmp_path / "half"), CONFIG)
    assert engine.compute_dtype.dtype == "float32"
    assert (
        "BLAS" in engine.compute_dtype.reason
        and "cast from bfloat16" in engine.compute_dtype.reason
    )
    assert _dtypes(engine.runner.adapter.model) == {mx.float32}

    monkeypatch.setattr(compute_dtype, "available_memory_bytes", lambda: 1024)
    with pytest.raises(ValueError) as info:
        Engine.load(str(tmp_path / "half"), CONFIG)
    message = str(info.value)
    assert "casting the bfloat16 weights to float32" in message
    assert "GiB more memory" in message and "EngineConfig(dtype='bfloat16')" in message


def test_available_memory_without_a_free_page_count(monkeypatch):
    """macOS's sysconf has no SC_AVPHYS_PAGES (a glibc extension): physical memory is used."""
    import os

    from macbatch.engine.model.compute_dtype import available_memory_bytes

    names = {k: v for k, v in os.sysconf_names.items() if k != "SC_AVPHYS_PAGES"}
    monkeypatch.setattr(os, "sysconf_names", names)
    assert available_memory_bytes() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
