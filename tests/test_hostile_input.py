"""Bad input gets an error that says what, where and how to fix it, a non-zero exit status and
no traceback (issue 61, item 11): a disk cache size that is not a number of GiB, a rank
variable set without a launcher, a prompt that is not UTF-8, a draft model whose config breaks
mlx-lm's own checks (the error names the draft and the check). The hub's cases are in
test_pull.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig
from tests.support.cli_process import run_command
from tests.support.tiny import save_model


def _refused(done, *words: str) -> None:
    assert done.returncode not in (0, None) and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


@pytest.mark.parametrize("size", ["inf", "1e400"])
def test_a_disk_cache_size_past_any_number_is_refused(size: str, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: demo\nprompt: hi\n")
    done = run_command("run", str(job), "--cache-disk-gb", size)
    _refused(done, "--cache-disk-gb", "not a size")


def test_a_stray_rank_variable_says_to_unset_it(tmp_path: Path) -> None:
    done = run_command("cache", "--cache-dir", str(tmp_path), env={"MLX_RANK": "0"})
    _refused(done, "MLX_RANK=0", "unset MLX_RANK", "mlx.launch")


def test_a_prompt_that_is_not_utf8_is_refused_before_the_model_loads() -> None:
    done = run_command("ask", "x", stdin=b"caf\xe9\xff")
    _refused(done, "not UTF-8", "iconv")


def test_a_broken_draft_model_is_named_with_the_check_it_fails(tmp_path: Path) -> None:
    draft = save_model(tmp_path / "draft", arch="llama")
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps(config | {"vocab_size": -1}))
    with pytest.raises(ValueError) as refused:
        Engine.load("demo", EngineConfig(speculative="draft", draft_model=str(draft)))
    message = str(refused.value)
    assert f"cannot load the draft model '{draft}' (--draft-model)" in message
    assert "vocab_size > 0" in message and "llama.py" in message
