"""A checkpoint whose ``model_type`` is another name mlx-vlm gives one of its families
(``MODEL_REMAPPING``): Command A Vision's checkpoints say ``cohere2_vision``, which mlx-vlm runs
with Aya Vision's code. The table's key is the family's (``families.library_type``), so such a
checkpoint loads through mlx-vlm with its family's rules, images included, where it was taken
for an mlx-lm model and failed to load."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model.families import library_type
from tests.support.image_requests import QUESTIONS, chat, expected
from tests.support.tiny_vlm_aya import rendered, save_tiny_aya
from tests.support.vlm_families import TinyVlm

pytest.importorskip("mlx_vlm")


def test_an_aliased_model_type_is_served_as_its_family(
    tmp_path: Path, image_files: list[Path]
) -> None:
    path = save_tiny_aya(tmp_path / "command-a-vision")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"model_type": "cohere2_vision"}))
    # Command A Vision's projector has no layernorm (mlx-vlm's Aya code builds one for
    # aya_vision only)
    weights = mx.load(str(path / "model.safetensors"))
    kept = {k: v for k, v in weights.items() if "multi_modal_projector.layernorm" not in k}
    assert len(kept) == len(weights) - 2
    mx.save_safetensors(str(path / "model.safetensors"), kept)
    assert library_type("cohere2_vision") == "aya_vision"
    engine = Engine.load(str(path), EngineConfig(num_blocks=128, block_size=8))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    question, images = QUESTIONS[0], [image_files[0]]
    out = engine.generate([chat(question, images)], params)[0]
    vlm = TinyVlm("cohere2_vision", path, rendered)
    assert out.token_ids == expected(vlm, question, images, 6)
