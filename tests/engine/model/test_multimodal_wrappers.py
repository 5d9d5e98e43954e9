"""Multimodal checkpoints (gemma3, mistral3, gemma4) served as text models, against mlx-lm.

Each checkpoint is written in Hugging Face layout with the text model at ``language_model`` (as
mlx-community ships them), optionally quantized by mlx-lm's own ``convert``, and loaded through
``Engine.load(path)``; mlx-lm loading the same directory is the oracle.
"""

from __future__ import annotations

import copy

import mlx_lm
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.oracle import mlx_lm_greedy
from tests.support.tiny import WRAPPER_CONFIGS, save_model

PROMPTS = [list(range(5, 25)), [30, 31, 32]]  # 20 tokens: past the sliding window and a block


def _text_config(arch: str, **changes) -> dict:
    return dict(copy.deepcopy(WRAPPER_CONFIGS[arch]["text_config"]), **changes)


def _write(tmp_path, arch: str, tied: bool, bits: int | None):
    """The checkpoint directory, float or quantized by ``mlx_lm.convert``."""
    if arch == "gemma3":  # Gemma 3 ties by leaving the head out of the checkpoint
        path = save_model(tmp_path / "float", arch, drop_lm_head=tied)
    else:
        path = save_model(
            tmp_path / "float", arch, text_config=_text_config(arch, tie_word_embeddings=tied)
        )
    if bits is None:
        return path
    from mlx_lm import convert

    quantized = tmp_path / f"q{bits}"
    convert(str(path), str(quantized), quantize=True, q_bits=bits, q_group_size=32)
    return quantized


@pytest.mark.parametrize(
    "arch,tied,bits",
    [
        ("gemma3", True, None),
        ("gemma3", False, 4),
        ("mistral3", False, None),
        ("mistral3", False, 4),
        ("mistral3-ministral3", True, None),
        ("gemma4", True, None),
        ("gemma4", False, 4),
    ],
)
def test_wrapper_checkpoint_matches_mlx_lm(tmp_path, arch, tied, bits):
    path = _write(tmp_path, arch, tied, bits)
    engine = Engine.load(str(path), EngineConfig(num_blocks=32, max_num_batched_tokens=8))
    model, _ = mlx_lm.load(str(path))
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    assert engine.runner.adapter.model_type == WRAPPER_CONFIGS[arch]["model_type"]
    assert [o.token_ids for o in outs] == [mlx_lm_greedy(model, p, 10) for p in PROMPTS]


def test_gemma4_kv_shared_layers_use_the_source_pages(tmp_path):
    """The pool holds pages for exactly the layers mlx-lm keeps caches for, and no more bytes."""
    path = save_model(tmp_path / "gemma4", "gemma4")
    engine = Engine.load(str(path), EngineConfig(num_blocks=16))
    model, _ = mlx_lm.load(str(path))
    caches = model.make_cache()
    num_layers = len(model.layers)
    assert len(caches) < num_layers  # the shape under test does share K/V
    # the full and the window cache group (docs/engine.md, "Cache groups")
    stores = [s for s in (engine.runner.store, engine.runner.window_store) if s is not None]
    assert sum(len(store.keys) for store in stores) == len(caches)
    # what mlx-lm's caches hold per token: one K and one V row per kv head, per computing layer
    text = model.language_model
    per_layer = sorted(
        2 * layer.self_attn.n_kv_heads * layer.self_attn.head_dim * 4
        for layer in text.layers[: len(caches)]
    )
    paged = [2 * shape.num_kv_heads * shape.head_dim * 4 for st in stores for shape in st.shapes]
    assert sorted(paged) == per_layer
    for store in stores:
        pool_bytes = sum(a.nbytes for a in store.arrays())
        per_token = sum(2 * shape.num_kv_heads * shape.head_dim * 4 for shape in store.shapes)
        assert pool_bytes == per_token * store.num_blocks * store.block_size
        assert store.format.bytes_per_block(store.shapes, 16) * store.num_blocks == pool_bytes


def test_an_image_part_is_refused_and_the_engine_keeps_serving(tmp_path):
    path = save_model(tmp_path / "gemma3", "gemma3", drop_lm_head=True)
    engine = Engine.load(str(path), EngineConfig(num_blocks=16))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(ValueError, match="a content part macbatch cannot read \\('image_url'\\)"):
        engine.add_request([{"role": "user", "content": [image]}])
    model, _ = mlx_lm.load(str(path))
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    [out] = engine.generate([PROMPTS[1]], params)
    assert out.token_ids == mlx_lm_greedy(model, PROMPTS[1], 4)
