"""`kv_bits:` in the job file and `--kv-bits` reach the engine; replies are those of an engine
with quantized pages."""

from __future__ import annotations

from pathlib import Path

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.job_files import read_jsonl, write_job

PROMPTS = ["What is MLX?", "how are you today?"]


def test_job_file_kv_bits_and_the_option_override(
    tmp_path: Path, tiny_model_path: Path, macbatch_run, monkeypatch
) -> None:
    write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        kv_bits: 4
        jobs:
          - name: inline
            prompts: {PROMPTS}
            sampling: {{temperature: 0, max_tokens: 6}}
        """,
    )
    configs: list[EngineConfig] = []
    load = Engine.load

    def recording_load(name: str, config: EngineConfig | None = None) -> Engine:
        configs.append(config)
        return load(name, config)

    monkeypatch.setattr(Engine, "load", recording_load)
    result = macbatch_run(tmp_path / "jobs.yaml")
    assert result.exit_code == 0, result.output
    assert configs[-1].kv_bits == 4
    oracle = Engine.load(str(tiny_model_path), EngineConfig(kv_bits=4))
    params = SamplingParams(temperature=0, max_tokens=6)
    want = [oracle.generate([[{"role": "user", "content": p}]], params)[0].text for p in PROMPTS]
    lines = read_jsonl(tmp_path / "out" / "inline.jsonl")
    got = [line["response"]["body"]["choices"][0]["message"]["content"] for line in lines]
    assert sorted(got) == sorted(want)

    result = macbatch_run(tmp_path / "jobs.yaml", "--fresh", "--kv-bits", "8")
    assert result.exit_code == 0, result.output
    assert configs[-1].kv_bits == 8
