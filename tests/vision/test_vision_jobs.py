"""`macbatch run` with images: an `images:` path template over a CSV's rows (relative to the job
file) and OpenAI-batch rows with image_url parts; replies equal mlx-vlm's own greedy text, and a
row whose image is missing is an error line while the others run."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from tests.support.job_files import read_jsonl, write_job
from tests.support.vlm_oracle import mlx_vlm_generate

# the vision extra (mlx-vlm, Pillow); skipped without it: pip install -e '.[vision]'
pytest.importorskip("mlx_vlm")

QUESTION = "What is in this picture?"


def test_a_csv_job_with_images_and_an_openai_batch_with_image_parts(
    tmp_path: Path, vlm_path: Path, image_files: list[Path], macbatch_run
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for image in image_files[:3]:
        shutil.copy(image, photos / image.name)
    names = [image.name for image in image_files[:3]]
    (tmp_path / "photos.csv").write_text(
        "id,file\n" + "".join(f"{i},{name}\n" for i, name in enumerate(names)) + "3,gone.png\n"
    )
    encoded = base64.b64encode(image_files[3].read_bytes()).decode()
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
        "max_tokens": 6,
        "temperature": 0,
    }
    row = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": body}
    (tmp_path / "batch.jsonl").write_text(json.dumps(row) + "\n")
    job_file = write_job(
        tmp_path,
        f"""
        model: {vlm_path}
        defaults:
          sampling: {{temperature: 0, max_tokens: 6}}
        jobs:
          - name: captions
            input: photos.csv
            template: "{QUESTION}"
            images: "photos/{{file}}"
          - name: batch
            input: batch.jsonl
        """,
    )
    result = macbatch_run(job_file)
    assert "4 ok, 1 failed" in result.output, result.output
    lines = {line["custom_id"]: line for line in read_jsonl(tmp_path / "out" / "captions.jsonl")}
    assert sorted(lines) == ["0", "1", "2"]
    for i, name in enumerate(names):
        expected = mlx_vlm_generate(
            vlm_path, f"<s>[INST][IMG]{QUESTION}[/INST]", [photos / name], 6
        )
        reply = lines[str(i)]["response"]["body"]["choices"][0]["message"]["content"]
        assert reply == expected, name
    [error] = read_jsonl(tmp_path / "out" / "captions.errors.jsonl")
    assert error["custom_id"] == "3" and "gone.png" in json.dumps(error)
    [line] = read_jsonl(tmp_path / "out" / "batch.jsonl")
    expected = mlx_vlm_generate(vlm_path, f"<s>[INST][IMG]{QUESTION}[/INST]", [image_files[3]], 6)
    assert line["response"]["body"]["choices"][0]["message"]["content"] == expected


def test_a_folder_input_is_one_row_per_image_and_resumes_exactly_once(
    tmp_path: Path, vlm_path: Path, image_files: list[Path], macbatch_run
) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    for image in image_files:
        shutil.copy(image, photos / image.name)
    (photos / "notes.txt").write_text("not matched by the glob")
    job_file = write_job(
        tmp_path,
        f"""
        model: {vlm_path}
        defaults:
          sampling: {{temperature: 0, max_tokens: 4}}
        jobs:
          - name: folder
            input: {{folder: photos, glob: "*.png"}}
            template: "{QUESTION}"
            images: "{{path}}"
        """,
    )
    result = macbatch_run(job_file)
    assert result.exit_code == 0, result.output
    lines = read_jsonl(tmp_path / "out" / "folder.jsonl")
    assert sorted(line["custom_id"] for line in lines) == sorted(p.name for p in image_files)
    for line in lines:
        image = photos / line["custom_id"]
        expected = mlx_vlm_generate(vlm_path, f"<s>[INST][IMG]{QUESTION}[/INST]", [image], 4)
        assert line["response"]["body"]["choices"][0]["message"]["content"] == expected
    again = macbatch_run(job_file)  # a rerun resumes: every row is done, none runs twice
    assert again.exit_code == 0, again.output
    assert f"0 ok, 0 failed, {len(image_files)} skipped (done before)" in again.output
    assert len(read_jsonl(tmp_path / "out" / "folder.jsonl")) == len(image_files)
