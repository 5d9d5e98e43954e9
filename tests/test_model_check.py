"""`macbatch doctor MODEL`: what serving a local model would do, checked against loading it."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from macbatch.engine import Engine, EngineConfig
from macbatch.engine.model.families import unsupported_reason
from tests.support.tiny import save_model


def _rows(output: str) -> dict[str, str]:
    rows = {}
    for line in output.splitlines():
        key, _, value = line.partition("  ")
        rows[key.strip()] = value.strip()
    return rows


def test_doctor_model_reports_what_the_engine_would_do(tmp_path):
    path = save_model(tmp_path / "gemma4", "gemma4")
    result = CliRunner().invoke(app, ["doctor", str(path)])
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    engine = Engine.load(str(path), EngineConfig(num_blocks=8))
    # every layer's K/V per token at full length: the full group's pages and the window group's
    stores = [s for s in (engine.runner.store, engine.runner.window_store) if s is not None]
    per_token = sum(
        sum(a.nbytes for a in s.arrays()) // (s.num_blocks * s.block_size) for s in stores
    )
    assert rows["KV bytes/token"] == f"{per_token:,} ({engine.compute_dtype.dtype})"
    assert rows["architecture"] == "gemma4 (text model: gemma4_text)"
    assert rows["layers"] == "4 (2 with KV pages, 2 reuse another layer's K/V)"
    assert rows["quantization"] == "none"
    assert rows["servable"] == "yes"


@pytest.mark.parametrize(
    ("arch", "layers"),
    [
        ("qwen3_5", "4 (2 with KV pages, 2 recurrent)"),
        ("falcon_h1", "3 (3 with KV pages, 3 recurrent; 3 run both side by side)"),
    ],
)
def test_doctor_model_shows_a_hybrid_models_recurrent_state(arch, layers, tmp_path):
    """A Qwen3.5-shaped model (recurrent layers among attention layers) and a Falcon-H1-shaped
    one (both in every layer): the layers, and the bytes of state each running request holds
    (the store's own size per slot, once loaded)."""
    path = save_model(tmp_path / arch, arch)
    result = CliRunner().invoke(app, ["doctor", str(path)])
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    # the store as loaded: the self-check's request would have grown it
    config = EngineConfig(num_blocks=8, max_num_seqs=4, self_check=False)
    engine = Engine.load(str(path), config)
    states = engine.runner.states
    assert states is not None
    per_request = sum(a.nbytes for a in states.arrays()) // states.rows
    assert rows["layers"] == layers
    assert rows["state bytes/request"] == f"{per_request:,} (recurrent layers, fixed size)"
    assert rows["servable"] == "yes"


@pytest.mark.parametrize("arch", ["glm4_moe_lite", "kimi_linear"])
def test_doctor_model_reports_an_mla_models_latent_bytes(arch, tmp_path):
    """GLM-4.7-Flash-shaped and Kimi Linear-shaped (MLA among recurrent layers): each MLA
    layer keeps one latent row per token, kv_lora_rank + qk_rope_head_dim values, as the config
    says (4-byte floats here)."""
    import json

    path = save_model(tmp_path / arch, arch)
    config = json.loads((path / "config.json").read_text())
    result = CliRunner().invoke(app, ["doctor", str(path)])
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    kda = config.get("linear_attn_config", {}).get("kda_layers", [])
    mla_layers = config["num_hidden_layers"] - len(kda)
    row = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    assert rows["KV bytes/token"] == f"{mla_layers * row * 4:,} (float32)"
    assert rows["layers"].startswith(f"{config['num_hidden_layers']} ({mla_layers} with latent")
    assert rows["servable"] == "yes"


@pytest.mark.parametrize("arch", ["deepseek_v32", "glm_moe_dsa"])
def test_doctor_model_reports_the_indexer_keys_of_a_sparse_model(arch, tmp_path):
    """DeepSeek V3.2- and GLM-5-shaped: each layer keeps a latent row and one indexer key
    (``index_head_dim``) per token, as the config says (4-byte floats here)."""
    import json

    path = save_model(tmp_path / arch, arch)
    config = json.loads((path / "config.json").read_text())
    result = CliRunner().invoke(app, ["doctor", str(path)])
    assert result.exit_code == 0, result.output
    rows = _rows(result.output)
    layers = config["num_hidden_layers"]
    latent = layers * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * 4
    keys = layers * config["index_head_dim"] * 4
    fp8 = latent + layers * (config["index_head_dim"] + 4)  # a byte a column, a float32 scale
    assert rows["KV bytes/token"] == (
        f"{latent + keys:,} (float32, {keys:,} of them the indexer's keys; "
        f"{fp8:,} with --indexer-keys fp8)"
    )
    assert rows["layers"] == (
        f"{layers} ({layers} with latent pages (MLA: one row per token), "
        f"{layers} with a sparse-attention indexer's keys)"
    )
    assert rows["servable"] == "yes"


def test_doctor_model_says_why_not(tmp_path):
    path = save_model(tmp_path / "qwen3", "qwen3", model_type="plamo3")  # refused by type
    result = CliRunner().invoke(app, ["doctor", str(path)])
    assert result.exit_code == 1
    reason = unsupported_reason("plamo3")
    assert _rows(result.output)["servable"] == f"no: model type 'plamo3' is not supported: {reason}"
    missing = CliRunner().invoke(app, ["doctor", "nobody/not-downloaded"])
    assert missing.exit_code == 1
    assert "'nobody/not-downloaded' is not downloaded yet" in missing.output


def test_doctor_model_says_when_the_weights_do_not_fit(tmp_path, monkeypatch):
    path = save_model(tmp_path / "qwen3", "qwen3")
    monkeypatch.setattr("macbatch.engine.model.probe.available_memory_bytes", lambda: 1024)
    result = CliRunner().invoke(app, ["doctor", str(path)])
    assert result.exit_code == 1
    servable = _rows(result.output)["servable"]
    assert re.match(r"no: its weights need 0\.\d MiB and 0\.0 MiB is free; free memory", servable)


def test_doctor_model_reports_the_templates_tool_calls_and_thinking(tmp_path):
    """Qwen3.5's real template: its XML calls, thinking on by default; the tiny model's own
    template (no tools): no format, reported and still servable."""
    from tests.support.real_templates import save_with_template

    qwen = save_with_template(tmp_path / "qwen3_5", "qwen3_5")
    rows = _rows(CliRunner().invoke(app, ["doctor", str(qwen)]).output)
    assert rows["tool calls"] == "qwen3_xml"
    assert rows["thinking"] == "on by default (enable_thinking switches it)"
    plain = CliRunner().invoke(app, ["doctor", str(save_model(tmp_path / "plain"))])
    rows = _rows(plain.output)
    assert rows["tool calls"].startswith("none macbatch parses")
    assert rows["servable"] == "yes"
