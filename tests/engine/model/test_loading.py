"""The real loading path on models written to disk, and refusal of unsupported architectures."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.oracle import mlx_lm_greedy
from tests.support.tiny import save_model


def test_load_from_disk_matches_mlx_lm(tiny_model_path):
    from mlx_lm import load

    engine = Engine.load(str(tiny_model_path), EngineConfig(num_blocks=32))
    model, _ = load(str(tiny_model_path))
    out = engine.generate(
        ["hello world"], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    )[0]
    ids = engine.tokenizer.encode("hello world")
    assert out.token_ids == mlx_lm_greedy(model, ids, 6)
    assert engine.model_name == str(tiny_model_path)


@pytest.mark.parametrize(
    "name,message",
    [
        ("/nonexistent/dir/model", "no model directory at /nonexistent/dir/model"),
        ("not a model", "neither a local directory nor a Hugging Face hub id"),
    ],
)
def test_bad_model_names(name, message):
    with pytest.raises(ValueError, match=message):
        Engine.load(name)


def test_directory_without_config(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        Engine.load(str(tmp_path))


def test_broken_weights_name_the_model(tmp_path):
    path = save_model(tmp_path / "broken")
    (path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="could not load model"):
        Engine.load(str(path))
