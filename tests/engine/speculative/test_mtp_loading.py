"""Loading a checkpoint's MTP layer beside its target: Hugging Face layout (names under ``mtp.``,
zero-centred norms, unstacked or fused experts) and mlx-community's converted, quantized layout;
``--speculative auto`` drafts with it where it exists; the doctor says whether it is there;
block-fp8 weights dequantize block by block, DeepSeek V4's (ue8m0 scales) load as mxfp8 layers
of the same values. Oracles: the MTP weights the test wrote (as MLX
holds them), mlx-lm's generation of the target it loads itself, the float64 numpy oracle of
block fp8 (tests/support/fp8_weights_numpy.py)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.speculative.mtp_fp8 import as_mx_layers, dequantized_blocks
from macbatch.models.check import check_model
from tests.support.fp8_weights_numpy import block_fp8, ue8m0_block_fp8
from tests.support.mtp import (
    MTP_ARCHS,
    assert_mtp_weights,
    save_hf_checkpoint,
    save_mlx_checkpoint,
    without_mtp,
)
from tests.support.mtp_fp8 import BLOCK_FP8_CONFIG
from tests.support.oracle import mlx_lm_greedy
from tests.support.tiny import save_model

PROMPTS = [[40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 40, 41], [200, 17, 33, 250, 8, 300, 120]]
CONFIG = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16)


def _load(path: Path, speculative: str) -> Engine:
    return Engine.load(str(path), EngineConfig(speculative=speculative, **CONFIG))


def _assert_loaded(engine: Engine, expected: dict[str, mx.array], path: Path) -> None:
    """The engine drafts with exactly the weights written, and its replies are mlx-lm's (of the
    same checkpoint without its MTP weights)."""
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, expected)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = [o.token_ids for o in engine.generate(PROMPTS, params)]
    model = mlx_lm.load(str(without_mtp(path)))[0]
    assert outs == [mlx_lm_greedy(model, p, 12) for p in PROMPTS]
    assert engine.stats().speculation.verifications > 0


@pytest.mark.parametrize("arch", sorted(MTP_ARCHS))
def test_hugging_face_layout(arch, tmp_path):
    expected = save_hf_checkpoint(tmp_path / arch, arch)
    _assert_loaded(_load(tmp_path / arch, "mtp"), expected, tmp_path / arch)


@pytest.mark.parametrize(
    ("arch", "bits"), [("qwen3_5", 4), ("qwen3_5_moe", 4), ("qwen3_next", 4), ("qwen3_next", None)]
)
def test_mlx_community_converted_layout(arch, bits, tmp_path):
    """The MTP layer under ``language_model.mtp.`` (qwen3_5's wrapper) or ``mtp.``; qwen3_next's
    experts stacked, so mlx-lm's own sanitize keeps the MTP weights and its strict load refuses
    them: the loader drops them first."""
    expected = save_mlx_checkpoint(tmp_path / arch, arch, bits)
    _assert_loaded(_load(tmp_path / arch, "auto"), expected, tmp_path / arch)


def test_auto_without_heads_looks_up_the_prompt_and_mtp_says_why(tmp_path):
    save_hf_checkpoint(tmp_path / "plain", "qwen3_5", head_seed=None)
    engine = _load(tmp_path / "plain", "auto")
    assert engine.config.speculative == "ngram" and engine.stats().drafter == "ngram"
    with pytest.raises(ValueError, match="has no MTP weights"):
        _load(tmp_path / "plain", "mtp")
    save_model(tmp_path / "llama", "llama")
    with pytest.raises(ValueError, match="has no MTP layer"):
        _load(tmp_path / "llama", "mtp")
    assert _load(tmp_path / "llama", "auto").config.speculative == "ngram"


def test_doctor_reports_mtp_heads(tmp_path):
    save_hf_checkpoint(tmp_path / "heads", "qwen3_next")
    save_hf_checkpoint(tmp_path / "dropped", "qwen3_next", head_seed=None)
    config = json.loads((tmp_path / "dropped" / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1  # declared, as a conversion that dropped them leaves it
    (tmp_path / "dropped" / "config.json").write_text(json.dumps(config))
    save_model(tmp_path / "llama", "llama")
    rows = {
        name: dict(check_model(str(tmp_path / name)).rows) for name in ("heads", "dropped", "llama")
    }
    assert rows["heads"]["MTP heads"].startswith("1 MTP layer(s): --speculative auto drafts")
    assert "weights were dropped" in rows["dropped"]["MTP heads"]
    assert rows["llama"]["MTP heads"].startswith("none; --speculative auto drafts with")


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_block_fp8_weights_dequantize_block_by_block(dtype):
    """A block-fp8 weight of 300 x 200 (a 3 x 2 grid of 128 x 128 blocks, the last ones partial,
    each its own scale) dequantizes to the float64 oracle's values exactly, in the dtype of the
    layer's float weights; its scales go."""
    weight = np.random.default_rng(0).normal(size=(300, 200)) * np.linspace(0.01, 4.0, 200)
    codes, scale_inv, values = block_fp8(weight)
    assert scale_inv.shape == (3, 2) and len(np.unique(scale_inv)) == 6
    stored = {
        "a.weight": mx.array(codes),
        "a.weight_scale_inv": mx.array(scale_inv),
        "norm.weight": mx.ones((200,), dtype=dtype),
    }
    out = dequantized_blocks(stored, {"quantization_config": BLOCK_FP8_CONFIG})
    assert sorted(out) == ["a.weight", "norm.weight"] and out["a.weight"].dtype == dtype
    want = mx.array(values.astype(np.float32)).astype(dtype)
    assert mx.array_equal(out["a.weight"], want)


def test_ue8m0_block_fp8_weights_load_as_mxfp8_layers_of_the_same_values():
    """DeepSeek V4's block fp8 (a power-of-two byte per 128 x 128 block) of a 300 x 192 weight
    (a 3 x 2 grid, the last blocks partial, each its own scale) becomes an mxfp8 layer that
    dequantizes to the float64 oracle's values exactly; a float ``.scale`` is refused."""
    spread = np.kron(4.0 ** np.arange(6).reshape(3, 2), np.ones((128, 128)))[:300, :192]
    weight = np.random.default_rng(0).normal(size=(300, 192)) * spread
    codes, scales, values = ue8m0_block_fp8(weight)
    assert scales.shape == (3, 2) and len(np.unique(scales)) == 6
    out = as_mx_layers({"a.weight": mx.array(codes), "a.scale": mx.array(scales)})
    assert sorted(out) == ["a.scales", "a.weight"] and out["a.scales"].shape == (300, 6)
    got = mx.dequantize(out["a.weight"], out["a.scales"], None, 32, 8, "mxfp8", dtype=mx.float32)
    assert np.array_equal(np.array(got), values.astype(np.float32))
    with pytest.raises(ValueError, match="ue8m0"):
        as_mx_layers({"a.weight": mx.array(codes), "a.scale": mx.array(scales, mx.float32)})
