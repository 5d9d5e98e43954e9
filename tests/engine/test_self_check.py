"""The load-time self-check: a good model passes and leaves the engine as it was; a model whose
packed paged step is broken on purpose (one layer's attention output scaled) is refused at load,
naming that layer, and ``self_check=False`` serves it anyway; with fp8 indexer keys the tiny
GLM-5 loads (the library's keys rounded as the pages' are) and a broken one is still refused;
Qwen4-exp's and GLM5-next's library caches round theirs too."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig
from macbatch.engine import self_check as self_check_module
from macbatch.engine.model.adapter import PagedLayerCache, UnsupportedModelError
from macbatch.engine.self_check import check_prompt, self_check
from tests.support.oracle import mlx_lm_greedy
from tests.support.sparse_attention import selection_changes
from tests.support.tiny import build_model, save_model
from tests.support.tiny_glm5_next import save_glm5_next
from tests.support.tiny_qwen4_exp import save_qwen4_exp

BROKEN_LAYER = 1


def _break(monkeypatch, method: str) -> None:
    """Layer ``BROKEN_LAYER``'s paged ``method`` answers 1.5 times what it should."""
    attend = getattr(PagedLayerCache, method)

    def perturbed(self, *args, **kwargs):
        out = attend(self, *args, **kwargs)
        return out * 1.5 if self.layer == BROKEN_LAYER else out

    monkeypatch.setattr(PagedLayerCache, method, perturbed)


@pytest.fixture
def broken_attention(monkeypatch):
    _break(monkeypatch, "attend")


@pytest.fixture
def broken_latent_attention(monkeypatch):
    _break(monkeypatch, "attend_latent")


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


def test_fp8_indexer_keys_load_the_sparse_model(tmp_path):
    """The tiny GLM-5 with ``indexer_keys="fp8"``: its check's decode steps select otherwise
    over rounded keys than over float ones (checked, so a library forward over float keys
    refuses it: 0.212 off, as it did), and the check passes to float32 tolerance."""
    path = save_model(tmp_path / "m", arch="glm_moe_dsa")
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, indexer_keys="fp8"))
    assert engine.self_check is not None and engine.self_check.passed
    assert engine.self_check.worst < 1e-4
    model = engine.runner.adapter.model
    prompt = check_prompt(engine.runner.vocab_size)
    tokens = mlx_lm_greedy(model, prompt, 3, indexer_keys="fp8")
    assert selection_changes(model, prompt + tokens), "fp8 keys select as float keys here"


def test_fp8_indexer_keys_still_refuse_a_broken_step(tmp_path, broken_latent_attention):
    """Rounding the library's keys hides no broken layer: one latent attention answering 1.5
    times its output refuses the model (its greedy tokens differ; on this tiny model the
    refusal names no layer, so the message is not held to one)."""
    path = save_model(tmp_path / "m", arch="glm_moe_dsa")
    with pytest.raises(UnsupportedModelError, match="does not reproduce glm_moe_dsa's own"):
        Engine.load(str(path), EngineConfig(num_blocks=64, indexer_keys="fp8"))


# tiny configs whose check prompt (12 tokens, contexts to 16) the fp8 rounding selects otherwise:
# QSA blocks of two tokens, two kept, eight heads (the tiny test model's two often tie at zero);
# GLM5-next pools of two, two kept
SELECTING = [
    (save_qwen4_exp, dict(indexer_n_heads=8, indexer_budget=4, indexer_compress_ratio=2)),
    (save_glm5_next, dict(index_topk=4, index_kpool=2)),
]


@pytest.mark.parametrize(("save", "config"), SELECTING, ids=["qwen4_exp", "glm5_next"])
def test_fp8_indexer_keys_rounded_in_the_mlx_vlm_caches_too(save, config, tmp_path, monkeypatch):
    """Qwen4-exp's ``QSAKVCache`` raw keys and GLM5-next's pooling keys and gates are rounded in
    the library's caches as well: the check passes to float32 tolerance, and the same check with
    the library's keys left float refuses the model (its indexer selects otherwise)."""
    pytest.importorskip("mlx_vlm")
    path = save(tmp_path / "m", **config)
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, indexer_keys="fp8"))
    assert engine.self_check is not None and engine.self_check.passed
    assert engine.self_check.worst < 1e-4
    monkeypatch.setattr(self_check_module, "round_indexer_keys", lambda *args: None)
    assert not self_check(engine).passed
