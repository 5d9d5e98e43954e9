"""The VLMs whose language model is mlx-vlm's own code, served as text through the packed paged
step: on a tiny random model of each (its config derived, tests/support/vlm_architectures.py),
three prompts batched with chunked prefill give mlx-vlm's own greedy tokens and their
log-probabilities, and a request with an image is refused with the table's reason
(docs/models.md, "Families only mlx-vlm has")."""

from __future__ import annotations

import json
from typing import Any

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model.families import Library, family
from macbatch.engine.multimodal.vision import unavailable_reason
from tests.support.oracle import assert_pool_idle
from tests.support.staggered import random_prompts
from tests.support.tiny_vlm_text import save_vlm_text_model, vlm_text_model
from tests.support.vlm_architectures import BUILT_IN_MEMORY, OVERRIDES
from tests.support.vlm_oracle import assert_matches_mlx_vlm_text

pytest.importorskip("mlx_vlm")

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
# a 16-token step budget chunks the 37- and 20-token prompts over several steps
CHUNKED = EngineConfig(num_blocks=64, block_size=8, max_num_batched_tokens=16)


def _assert_batched_chunked_text(engine: Engine, oracle: Any) -> None:
    """Three prompts batched, the longer two prefilled in chunks: every token and its
    log-probability is ``oracle``'s (mlx-vlm's own model) own generation's."""
    prompts = random_prompts([5, 37, 20], seed=1)
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert_matches_mlx_vlm_text(oracle, prompt, out)
    assert_pool_idle(engine)


# the served families of a tiny config saved as a checkpoint (a refused one's is for its refusal)
SAVED = sorted(n for n in OVERRIDES if n not in BUILT_IN_MEMORY and family(n).refusal is None)


@pytest.mark.parametrize("name", SAVED)
def test_batched_chunked_text_matches_mlx_vlm(tmp_path, name) -> None:
    """mlx-vlm's own generation on the saved tiny checkpoint; images are refused with the
    reason (a family served with images: refused when its processor cannot be read without the
    image processor config the text checkpoint lacks)."""
    from mlx_vlm.utils import load_model

    assert family(name).library is Library.MLX_VLM
    path = save_vlm_text_model(tmp_path, name)
    engine = Engine.load(str(path), CHUNKED)
    _assert_batched_chunked_text(engine, load_model(path))
    vision, rules = engine.runner.vision, family(name)
    if rules.vision is None:
        assert vision.encoder is None
        assert (rules.vision_refusal or "?") in (vision.refusal or "")
    else:  # served with images (tests/vision): refused where its processor files are missing
        assert vision.encoder is not None or "cannot be read" in (vision.refusal or "")


@pytest.mark.parametrize("name", sorted(BUILT_IN_MEMORY))
def test_text_of_a_model_built_in_memory_matches_mlx_vlm(tmp_path, tiny_tokenizer, name) -> None:
    """A family too big to save (``BUILT_IN_MEMORY``) served from mlx-vlm's model object: its
    own generation on a second model of the same weights, untouched by the engine; its
    checkpoint's images are refused with the table's reason."""
    assert family(name).library is Library.MLX_VLM
    model, config = vlm_text_model(name)
    engine = Engine(model, tiny_tokenizer, CHUNKED)
    _assert_batched_chunked_text(engine, vlm_text_model(name)[0])
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert (family(name).vision_refusal or "?") in (unavailable_reason(tmp_path, name) or "")


def test_zaya_attention_state_is_what_refuses_it(tmp_path, monkeypatch) -> None:
    """ZAYA1-VL's refusal is measured: served as any other family, its tiny model is refused by
    the adapter's probe for the state its attention keeps beside the K/V."""
    from macbatch.engine.model import families
    from macbatch.engine.model.adapter import UnsupportedModelError

    assert "ArraysCache beside the K/V" in (family("zaya1_vl").refusal or "")
    path = save_vlm_text_model(tmp_path, "zaya1_vl")
    served = families.Family(library=Library.MLX_VLM)
    monkeypatch.setitem(families.FAMILIES, "zaya1_vl", served)
    with pytest.raises(UnsupportedModelError, match="ArraysCache beside the K/V in one CacheList"):
        Engine.load(str(path), CHUNKED)
