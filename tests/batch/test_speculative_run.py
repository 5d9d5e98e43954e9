"""`macbatch run` with `speculative:` in the job file (and `--speculative` over it): replies are
the engine's without speculation (re-read from the output file), and the summary reports the
acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macbatch.engine import Engine, SamplingParams
from tests.support.job_files import read_jsonl, write_job
from tests.support.mtp import save_hf_checkpoint

PROMPTS = ["one two three one two three one two three one", "the quick brown fox the quick"]


@pytest.mark.parametrize("option", [None, "ngram"])
def test_job_file_speculation_keeps_replies_and_reports_acceptance(
    tmp_path: Path, tiny_model_path: Path, macbatch_run, option
) -> None:
    method = "off" if option else "ngram"  # the option overrides the file
    job = write_job(
        tmp_path,
        f"""
        model: {tiny_model_path}
        speculative: {{method: {method}, num_tokens: 3}}
        jobs:
          - name: copy
            prompts: {json.dumps(PROMPTS)}
            chat: false
            sampling: {{temperature: 0, max_tokens: 16}}
        """,
    )
    args = [job] + (["--speculative", option] if option else [])
    result = macbatch_run(*args)
    assert result.exit_code == 0, result.output
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out" / "copy.jsonl")}
    engine = Engine.load(str(tiny_model_path))
    params = SamplingParams(temperature=0, max_tokens=16)
    for i, prompt in enumerate(PROMPTS):
        expected = engine.generate([prompt], params)[0].text
        assert lines[str(i + 1)]["response"]["body"]["choices"][0]["text"] == expected
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    spec = summary["speculative"]
    assert spec["drafted_tokens"] > 0 and 0 <= spec["acceptance_rate"] <= 1
    assert spec["mean_accepted_length"] >= 1
    assert "speculative decoding:" in result.output
    # each reply's own numbers: the run's rate and length are their drafted-weighted means, so
    # they lie between the replies' lowest and highest
    each = spec["per_request"]
    assert each["requests"] == len(PROMPTS)
    rates, lengths = each["acceptance_rate"], each["mean_accepted_length"]
    assert rates["p10"] <= spec["acceptance_rate"] <= rates["p90"]
    assert lengths["p10"] <= spec["mean_accepted_length"] <= lengths["p90"]
    assert "per reply (2): acceptance p10" in result.output


@pytest.mark.parametrize("option", [None, "off"])
def test_a_checkpoint_with_mtp_heads_drafts_with_them_by_default(
    tmp_path: Path, macbatch_run, option
) -> None:
    """No ``speculative:`` section and no option: ``auto``, so the checkpoint's MTP heads draft
    (the summary reports them); ``--speculative off`` turns them off. Replies are the engine's
    without speculation either way."""
    model = tmp_path / "qwen3_5"
    save_hf_checkpoint(model, "qwen3_5")
    job = write_job(
        tmp_path,
        f"""
        model: {model}
        jobs:
          - name: copy
            prompts: {json.dumps(PROMPTS)}
            chat: false
            sampling: {{temperature: 0, max_tokens: 16}}
        """,
    )
    result = macbatch_run(job, *(["--speculative", option] if option else []))
    assert result.exit_code == 0, result.output
    lines = {x["custom_id"]: x for x in read_jsonl(tmp_path / "out" / "copy.jsonl")}
    engine = Engine.load(str(model))  # EngineConfig's own default: off
    params = SamplingParams(temperature=0, max_tokens=16)
    for i, prompt in enumerate(PROMPTS):
        expected = engine.generate([prompt], params)[0].text
        assert lines[str(i + 1)]["response"]["body"]["choices"][0]["text"] == expected
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    if option is None:
        assert summary["speculative"]["drafted_tokens"] > 0
    else:
        assert not summary.get("speculative")
