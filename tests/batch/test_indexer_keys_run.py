"""`indexer_keys:` in the job file and `--indexer-keys` reach the engine: a sparse-attention
model's replies are those of an engine with fp8 indexer keys (docs/jobs.md, docs/engine.md),
on a tiny DeepSeek V3.2 whose replies fp8 keys change; the resume hint repeats the option and a
bad value is refused before anything runs."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from macbatch.batch.command import EngineOptions, resume_command
from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.job_files import read_jsonl, write_job
from tests.support.tiny import save_model

# templated prompts longer than the tiny model's top-12 selection, whose replies fp8 keys change
PROMPTS = [
    "the quick brown fox jumps over the lazy dog, hello world",
    "hello world, how are you today? I am fine, thank you. 0123456789 + - * / = ( )",
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def sparse_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("dsa") / "deepseek_v32", arch="deepseek_v32")


def _job(directory: Path, model: Path, top: str = "") -> Path:
    return write_job(
        directory,
        f"""
        model: {model}
        {top}
        jobs:
          - name: ask
            prompts: {PROMPTS}
            sampling: {{temperature: 0, max_tokens: {MAX_TOKENS}}}
        """,
    )


def _replies(directory: Path) -> list[str]:
    lines = {line["custom_id"]: line for line in read_jsonl(directory / "out" / "ask.jsonl")}
    return [lines[str(i)]["response"]["body"]["choices"][0]["message"]["content"] for i in (1, 2)]


def _engine_replies(model: Path, indexer_keys: str | None) -> list[str]:
    """The Python API's replies, one prompt at a time: the oracle of what run writes."""
    engine = Engine.load(str(model), EngineConfig(indexer_keys=indexer_keys))
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    return [engine.generate([[{"role": "user", "content": p}]], params)[0].text for p in PROMPTS]


def test_job_file_indexer_keys_and_the_option(
    tmp_path: Path, sparse_model: Path, macbatch_run, monkeypatch
) -> None:
    """The key and the option each give the fp8 engine's replies, which are not the float
    keys' (so a run that dropped the setting fails here)."""
    configs: list[EngineConfig | None] = []
    load = Engine.load

    def recording_load(name: str, config: EngineConfig | None = None) -> Engine:
        configs.append(config)
        return load(name, config)

    monkeypatch.setattr(Engine, "load", recording_load)
    want = _engine_replies(sparse_model, "fp8")
    assert want != _engine_replies(sparse_model, None), "fp8 keys reply as float keys"

    (tmp_path / "file").mkdir()
    result = macbatch_run(_job(tmp_path / "file", sparse_model, "indexer_keys: fp8"))
    assert result.exit_code == 0, result.output
    assert configs[-1] is not None and configs[-1].indexer_keys == "fp8"
    assert _replies(tmp_path / "file") == want

    (tmp_path / "option").mkdir()
    result = macbatch_run(_job(tmp_path / "option", sparse_model), "--indexer-keys", "fp8")
    assert result.exit_code == 0, result.output
    assert configs[-1] is not None and configs[-1].indexer_keys == "fp8"
    assert _replies(tmp_path / "option") == want


def test_the_resume_hint_repeats_the_indexer_keys(tmp_path: Path) -> None:
    hint = resume_command(tmp_path / "j.yaml", None, [], None, EngineOptions(8, "fp8"), False)
    assert shlex.split(hint) == [
        "macbatch", "run", str(tmp_path / "j.yaml"), "--kv-bits", "8", "--indexer-keys", "fp8",
    ]  # fmt: skip


def test_a_bad_value_is_refused_before_anything_runs(
    tmp_path: Path, sparse_model: Path, macbatch_run
) -> None:
    """In the job file: its file:line:column and the values it takes; as the option: the same
    words; either way no output file is made."""
    job = _job(tmp_path, sparse_model, "indexer_keys: fp4")
    result = macbatch_run(job)
    assert result.exit_code == 1
    assert f"{job}:2:" in result.output
    assert "indexer_keys must be 'fp8' or None" in result.output
    assert "Traceback" not in result.output
    result = macbatch_run(_job(tmp_path, sparse_model), "--indexer-keys", "int8")
    assert result.exit_code != 0
    assert "indexer_keys must be 'fp8' or None" in result.output
    assert not (tmp_path / "out").exists()
