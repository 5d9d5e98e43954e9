"""`macbatch doctor MODEL` says whether a checkpoint takes images, and why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from macbatch.engine.multimodal.vision import unavailable_reason
from tests.support.tiny import save_model
from tests.support.vlm_families import TinyVlm

# the vision extra (mlx-vlm, Pillow); skipped without it: pip install -e '.[vision]'
pytest.importorskip("mlx_vlm")


def _images_row(path: Path) -> str:
    result = CliRunner().invoke(app, ["doctor", str(path)])
    assert result.exit_code == 0, result.output
    [row] = [line for line in result.output.splitlines() if line.startswith("images")]
    return row.partition("  ")[2].strip()


def test_doctor_says_which_checkpoints_take_images(tmp_path: Path, vlm_path: Path) -> None:
    assert _images_row(vlm_path).startswith("yes")
    text_only = _images_row(save_model(tmp_path / "llama", "llama"))
    assert text_only.startswith("no: ") and "text-only model (llama)" in text_only


def test_doctor_takes_each_qwen_vl_family_and_says_why_not_an_untested_one(
    tmp_path: Path, qwen_vl_path: Path
) -> None:
    assert _images_row(qwen_vl_path).startswith("yes")
    other = tmp_path / "ernie-vl"
    other.mkdir()
    config = json.loads((qwen_vl_path / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "ernie4_5_moe_vl"}))
    reason = unavailable_reason(other, "ernie-vl")
    assert reason is not None and "images for 'ernie4_5_moe_vl' models are not supported" in reason


def test_doctor_says_yes_for_each_served_family(family_vlm: TinyVlm) -> None:
    assert _images_row(family_vlm.path).startswith("yes")
