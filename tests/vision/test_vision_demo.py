"""The bundled offline image job: ``jobs/images.yaml`` on ``demo-vision``, the tiny random VLM
macbatch builds on first use (no download): every picture tagged once with JSON valid per the
job's schema, a rerun resumes, and the built model is a real mlx-vlm model (its greedy ids equal
mlx-vlm's own ``generate`` on one of the bundled pictures)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from macbatch.demo.vision import NAME
from tests.support.job_files import JOBS, read_jsonl
from tests.support.vlm_oracle import mlx_vlm_greedy

pytest.importorskip("mlx_vlm")


def test_the_bundled_image_job_runs_offline_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, macbatch_run
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("MACBATCH_HOME", str(home))
    shutil.copy(JOBS / "images.yaml", tmp_path / "images.yaml")
    shutil.copytree(JOBS / "data" / "photos", tmp_path / "data" / "photos")
    photos = sorted(p.name for p in (JOBS / "data" / "photos").glob("*.png"))
    assert len(photos) >= 3

    result = macbatch_run(tmp_path / "images.yaml")
    assert result.exit_code == 0, result.output
    assert (home / NAME / "model.safetensors").is_file()  # built here, on first use
    spec = yaml.safe_load((JOBS / "images.yaml").read_text())["jobs"][0]
    lines = read_jsonl(tmp_path / "out" / "photo-tags.jsonl")
    assert sorted(line["custom_id"] for line in lines) == photos
    for line in lines:
        body = line["response"]["body"]
        reply = body["choices"][0]["message"]["content"]
        jsonschema.validate(json.loads(reply), spec["schema"])
        assert body["usage"]["prompt_tokens"] > 40  # the image rows are in the prompt

    again = macbatch_run(tmp_path / "images.yaml")
    assert f"0 ok, 0 failed, {len(photos)} skipped (done before)" in again.output

    # the model it built is mlx-vlm's own: greedy ids equal mlx-vlm's generate, unconstrained
    from macbatch.engine import Engine, EngineConfig, PromptInput, SamplingParams
    from macbatch.engine.multimodal.images import load_image

    image = tmp_path / "data" / "photos" / photos[0]
    content = [{"type": "image", "image": load_image(image.read_bytes(), "x")}]
    content.append({"type": "text", "text": "what?"})
    engine = Engine.load(NAME, EngineConfig(num_blocks=64))
    [output] = engine.generate(
        [PromptInput([{"role": "user", "content": content}])],
        SamplingParams(temperature=0.0, max_tokens=6),
    )
    prompt = "<|im_start|>user\n[IMG]what?<|im_end|>\n<|im_start|>assistant\n"
    assert list(output.token_ids) == mlx_vlm_greedy(home / NAME, prompt, [image], 6)
