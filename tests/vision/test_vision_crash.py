"""A 500-image captioning job with ``response_format`` (a JSON schema), killed with kill -9
mid-run and resumed: every image exactly once in the results, every reply valid JSON per the
schema (checked with jsonschema on the lines re-read from disk)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

from tests.support.batch_process import kill_9_after
from tests.support.job_files import read_jsonl, write_job
from tests.support.tiny_vlm import png_bytes

pytest.importorskip("mlx_vlm")

IMAGES = 500
SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["cat", "dog", "car"]}},
    "required": ["label"],
    "additionalProperties": False,
}


def test_500_images_killed_and_resumed_each_once_and_valid_json(
    tmp_path: Path, vlm_path: Path, macbatch_run
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(IMAGES):  # 16x16: one merged patch, so a row is a few dozen tokens
        (photos / f"p{i:03d}.png").write_bytes(png_bytes(16, 16, 1000 + i))
    response_format = {"type": "json_schema", "json_schema": {"name": "tag", "schema": SCHEMA}}
    job_file = write_job(
        tmp_path,
        f"""
        model: {vlm_path}
        jobs:
          - name: tags
            input: {{folder: photos, glob: "*.png"}}
            template: "Tag this photo."
            images: "{{path}}"
            sampling: {{temperature: 0, max_tokens: 16}}
            response_format: {json.dumps(response_format)}
        """,
    )
    output = tmp_path / "out" / "tags.jsonl"
    written = kill_9_after(job_file, output, 100, in_flight=32)
    assert 100 <= written < IMAGES

    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    lines = read_jsonl(output)
    assert Counter(line["custom_id"] for line in lines) == {
        f"p{i:03d}.png": 1 for i in range(IMAGES)
    }
    for line in lines:
        reply = line["response"]["body"]["choices"][0]["message"]["content"]
        jsonschema.validate(json.loads(reply), SCHEMA)
        assert line["parsed"] == json.loads(reply)
    assert not (tmp_path / "out" / "tags.errors.jsonl").exists()
