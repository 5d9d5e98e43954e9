"""The demo model's training script: deterministic given a seed, its processes' steps are the
step of one process over the whole batch, and its output loads in mlx-lm.

A few optimizer steps are enough to prove all three; the accuracy of a full run is what
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


def start_training(out: Path, seed: int, processes: int, fast_ops: bool) -> subprocess.Popen:
    """Start the script for three steps of phase 1 and two short cycles of phase 2."""
    command = [sys.executable, str(SCRIPT), "--seed", str(seed), "--steps", "3"]
    command += ["--processes", str(processes), "--fast-ops" if fast_ops else "--no-fast-ops"]
    command += ["--batch-size", "4", "--chat-steps", "3,2", "--chat-lr", "2e-4,1e-4"]
    command += ["--chat-json", "0,0.5"]
    command += ["--chat-weights", "add=1,subtract=1,reverse=1,sort=1,count=0"]  # no counting
    command += ["--eval-per-task", "1", "--eval-max-tokens", "2"]  # the scores say nothing here
    command += ["--out", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def trained(run: subprocess.Popen, out: Path) -> dict[str, mx.array]:
    """The weights a started run wrote, once its output says it ran every phase. The wait has
    no time limit: the runs are a few optimizer steps and evaluations of two-token replies,
    bounded by that work, however busy the machine (a hung run is the suite's timeout's)."""
    stdout, stderr = run.communicate()
    assert run.returncode == 0, stderr
    assert "phase 1 step 3 held-out accuracy" in stdout
    assert "phase 2.1 step 3 held-out accuracy" in stdout
    assert "phase 2.2 step 2 held-out accuracy" in stdout
    marker = "mix from here: "
    mixes = [line.split(marker)[1] for line in stdout.splitlines() if marker in line]
    assert len(mixes) == 3 and "count 0%" not in mixes[0]  # phase 1: --weights
    assert all("count 0%" in mix for mix in mixes[1:])  # phase 2: --chat-weights
    before, after = stdout.split("phase 2.1 step 3 held-out")
    assert "JSON, turn 5:" in after and "JSON" not in before  # only the second cycle asks JSON
    return mx.load(str(out / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, dict[str, mx.array]]]:
    """Two runs with seed 0, two processes each; one with seed 1, one with seed 0 and one with
    seed 0 and the fast ops, in one process each (seven processes, as few as the claims need)."""
    root = tmp_path_factory.mktemp("train")
    runs = {
        "a": (0, 2, False),
        "b": (0, 2, False),
        "c": (1, 1, False),  # another seed: one process is enough to tell
        "alone": (0, 1, False),
        "fast": (0, 1, True),  # held to "alone": the ops, not the split, differ
    }
    # run side by side: each spends much of its time starting up and waiting on its peers
    started = {name: start_training(root / name, *run) for name, run in runs.items()}
    return {name: (root / name, trained(started[name], root / name)) for name in runs}


def test_same_seed_gives_identical_weights(runs):
    (_, first), (_, second) = runs["a"], runs["b"]
    assert first.keys() == second.keys()
    assert all(mx.array_equal(first[k], second[k]).item() for k in first)
    (_, alone), (_, other) = runs["alone"], runs["c"]  # one process each: only the seed differs
    assert not all(mx.array_equal(alone[k], other[k]).item() for k in alone)


def test_processes_together_take_one_process_steps(runs):
    """Each process trains on its rows of a step's batch and the gradients are summed: the same
    steps as one process on the whole batch, up to float32 rounding (the sums run in another
    order), not a run on half the data nor one with twice the step."""
    (_, together), (_, alone) = runs["a"], runs["alone"]
    assert all(mx.allclose(together[k], alone[k], rtol=1e-4, atol=1e-5).item() for k in alone)
    # Not the same bits: the run really was split (deterministic, so this cannot flake).
    assert not all(mx.array_equal(together[k], alone[k]).item() for k in alone)


def test_fast_ops_take_the_steps_of_mlx_ops(runs):
    """--fast-ops computes the same functions to float32 rounding: after eight steps the weights
    are those of MLX's own ops up to that rounding (6e-7 apart when measured)."""
    (_, exact), (_, fast) = runs["alone"], runs["fast"]
    assert all(mx.allclose(fast[k], exact[k], rtol=1e-4, atol=1e-5).item() for k in exact)
    assert not all(mx.array_equal(fast[k], exact[k]).item() for k in exact)  # other arithmetic


def test_output_loads_in_mlx_lm_with_the_chat_template(runs):
    import mlx_lm

    out, weights = runs["a"]
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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--mix-boost", "-1"], "--mix-boost must be 0 or more"),
        (["--chat-steps", "100,100", "--chat-lr", "1e-4"], "one value per cycle each"),
        (["--chat-weights", "add=1,subtract=1,reverse=1,sort=1,count=-1"], "0 or more, not all"),
    ],
)
def test_bad_options_are_refused_once_before_any_process_starts(tmp_path, options, message):
    command = [sys.executable, str(SCRIPT), *options, "--out", str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count(message) == 1  # said by the command, not by each process
    assert not (tmp_path / "run").exists()


def test_conversations_are_the_chat_template_and_the_loss_covers_the_replies(runs):
    """Phase 2's training rows against the chat template as mlx-lm applies it (the oracle)."""
    import random

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from macbatch.demo.conversation import chat_messages
    from macbatch.demo.questions import held_out_examples

    spec = importlib.util.spec_from_file_location("train_demo_model", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out, _ = runs["a"]
    wrapper = load_tokenizer(out)
    turns = held_out_examples(random.Random(5), 1)[:3]
    messages = chat_messages(turns, "unused")[:-1]  # the three turns, answered
    ids, mask = script.encode_conversation(script.build_tokenizer(), turns, 512)
    assert ids == wrapper.apply_chat_template(messages)[:-1]  # up to the last <|im_end|>
    replied = wrapper.decode([i for i, m in zip(ids, mask) if m])
    assert replied == "".join(f"{t.answer}<|im_end|>" for t in turns)
    # One token short: the last reply goes whole, its question stays without a target.
    short_ids, short_mask = script.encode_conversation(
        script.build_tokenizer(), turns, len(ids) - 1
    )
    assert wrapper.decode([i for i, m in zip(short_ids, short_mask) if m]) == "".join(
        f"{t.answer}<|im_end|>" for t in turns[:2]
    )
    assert wrapper.decode(short_ids).endswith(
        f"{turns[2].question}<|im_end|>\n<|im_start|>assistant\n"
    )
