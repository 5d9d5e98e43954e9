"""The load-time self-check: a good model passes and leaves the engine as it was; a model whose
packed paged step is broken on purpose (one layer's attention output scaled) is refused at load,
naming that layer, and ``self_check=False`` serves it anyway."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig
from macbatch.engine.model.adapter import PagedLayerCache, UnsupportedModelError
from macbatch.engine.self_check import self_check
from tests.support.tiny import build_model, save_model

BROKEN_LAYER = 1


@pytest.fixture
def broken_attention(monkeypatch):
    """Layer ``BROKEN_LAYER``'s paged attention answers 1.5 times what it should."""
    attend = PagedLayerCache.attend

    def perturbed(self, queries, keys, values, scale, window, sinks):
        out = attend(self, queries, keys, values, scale, window, sinks)
        return out * 1.5 if self.layer == BROKEN_LAYER else out

    monkeypatch.setattr(PagedLayerCache, "attend", perturbed)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text"])
def test_a_good_model_passes_and_leaves_no_trace(arch, tiny_tokenizer):
    engine = Engine(build_model(arch), tiny_tokenizer, EngineConfig(num_blocks=64, block_size=8))
    check = self_check(engine)
    assert check.passed, check.describe()
    assert check.worst <= check.tolerance
    stats = engine.stats()
    assert (stats.steps, stats.prompt_tokens, stats.generated_tokens) == (0, 0, 0)
    assert engine.kv.pool.num_cached == 0  # its prompt is in no prefix cache
    assert engine.kv.prefix_root is not None  # and the prefix cache is back on


def test_a_broken_paged_forward_is_refused_naming_the_layer(tiny_tokenizer, broken_attention):
    model = build_model("llama", num_hidden_layers=3)
    check = self_check(Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64)))
    assert not check.passed
    assert f"the first layer whose output differs is layer {BROKEN_LAYER} " in check.problem


def test_load_refuses_it_and_no_self_check_serves_it(tmp_path, broken_attention):
    path = save_model(tmp_path / "m", arch="llama", num_hidden_layers=3)
    with pytest.raises(UnsupportedModelError, match=f"differs is layer {BROKEN_LAYER} "):
        Engine.load(str(path), EngineConfig(num_blocks=64))
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, self_check=False))
    assert engine.self_check is None


def test_load_records_a_passed_check(tmp_path):
    engine = Engine.load(str(save_model(tmp_path / "m")), EngineConfig(num_blocks=64))
    assert engine.self_check is not None and engine.self_check.passed
