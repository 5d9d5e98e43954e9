"""The demo model's training script: deterministic given a seed, and its output loads in mlx-lm.

A few optimizer steps are enough to prove both; the accuracy of a full run is what
tests/demo/test_model.py checks on the shipped weights.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_demo_model.py"


def train(out: Path, seed: int) -> dict[str, mx.array]:
    """Run the script for three steps and return the weights it wrote."""
    command = [sys.executable, str(SCRIPT), "--seed", str(seed), "--steps", "3"]
    command += ["--batch-size", "4", "--eval-per-task", "1", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "held-out accuracy" in done.stdout
    return mx.load(str(out / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[tuple[Path, dict[str, mx.array]]]:
    """Two runs with seed 0 and one with seed 1."""
    root = tmp_path_factory.mktemp("train")
    seeds = {"a": 0, "b": 0, "c": 1}
    return [(root / name, train(root / name, seed)) for name, seed in seeds.items()]


def test_same_seed_gives_identical_weights(runs):
    (_, first), (_, second), (_, other) = runs
    assert first.keys() == second.keys()
    assert all(mx.array_equal(first[k], second[k]).item() for k in first)
    assert not all(mx.array_equal(first[k], other[k]).item() for k in first)


def test_output_loads_in_mlx_lm_with_the_chat_template(runs):
    import mlx_lm

    out, weights = runs[0]
    model, tokenizer = mlx_lm.load(str(out))
    loaded = dict(tree_flatten(model.parameters()))
    assert all(mx.array_equal(loaded[k], weights[k]).item() for k in weights)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 2?"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    config = json.loads((out / "config.json").read_text())
    assert tokenizer.eos_token_id == config["eos_token_id"]
    assert tokenizer.decode(tokenizer.encode("Zählen 12 + 7?")) == "Zählen 12 + 7?"


def test_mix_boost_feeds_lagging_tasks_more():
    spec = importlib.util.spec_from_file_location("train_demo_model", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    base = script.parse_weights("add=2,subtract=2,reverse=1,sort=2,count=2")
    accuracy = {"add": 1.0, "subtract": 1.0, "reverse": 0.5, "sort": 1.0, "count": 0.75}
    boosted = script.boosted_weights(base, accuracy, boost=4)
    assert boosted == {"add": 2, "subtract": 2, "reverse": 3, "sort": 2, "count": 4}
    assert script.boosted_weights(base, accuracy, boost=0) == base


def test_negative_mix_boost_is_refused_before_training(tmp_path):
    command = [sys.executable, str(SCRIPT), "--mix-boost", "-1", "--out", str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--mix-boost must be 0 or more" in done.stderr
    assert not (tmp_path / "run").exists()
