"""One request layer: the same OpenAI body sent to `serve` and written as a row of an OpenAI-batch
job for `run` gives the same engine requests (SamplingParams compared field by field) and the same
reply JSON (every field, bar the ids and times that differ by nature).

Both front ends run for real: a uvicorn server over an EngineThread, and `macbatch run` in-process,
each on a tiny random model with the real Qwen3 tokenizer and chat template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from macbatch.engine import Engine, EngineThread, SamplingParams
from tests.support.job_files import read_jsonl, write_job
from tests.support.live_server import serving, start_engine
from tests.support.load_memo import loads_memoized
from tests.support.structured import QWEN3_VOCAB, WEATHER_TOOL, save_model_with_tokenizer

BODIES = {
    # no temperature: OpenAI's 1.0 in both (run's job defaults once gave 0.7); the seed makes
    # the sampled reply the same in both
    "defaults": {
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 6,
        "seed": 5,
    },
    "openai quirks": {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
            },
        ],
        "temperature": 0,
        "top_k": -1,
        "max_completion_tokens": 7,
        "seed": 11,
        "n": 2,
        "stop": "zzz",
        "logprobs": True,
        "top_logprobs": 2,
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "tools": {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 40,
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "completion": {"prompt": "Once upon", "max_tokens": 5, "temperature": 0, "logprobs": 1},
}
# Differ by nature between two runs: response ids, creation time, speed and timing.
VOLATILE = {"id", "created", "time_to_first_token_s", "tokens_per_second"}


@pytest.fixture(scope="module", autouse=True)
def tokenizer_read_once() -> Iterator[None]:
    """Each `run` loads the same model: its real Qwen3 tokenizer is read once and unpickled
    after (tests/support/load_memo.py)."""
    with loads_memoized():
        yield


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_with_tokenizer(tmp_path_factory.mktemp("agree") / "m", "qwen3", QWEN3_VOCAB)


@pytest.fixture(scope="module")
def thread(model_path: Path):
    thread = start_engine(model_path)
    yield thread
    thread.shutdown()


def _url(body: dict[str, Any]) -> str:
    return "/v1/completions" if "prompt" in body else "/v1/chat/completions"


def _record_params(cls: type, method: str, monkeypatch) -> list[SamplingParams]:
    """The SamplingParams every call of ``cls.method(prompt, params, ...)`` gets, as it runs."""
    seen: list[SamplingParams] = []
    original = getattr(cls, method)

    def recording(self, prompt, params=None, *args, **kwargs):
        seen.append(params)
        return original(self, prompt, params, *args, **kwargs)

    monkeypatch.setattr(cls, method, recording)
    return seen


def _served(thread: EngineThread, body: dict[str, Any], monkeypatch) -> tuple[list, dict]:
    """(the SamplingParams serve submitted, its JSON reply)."""
    submitted = _record_params(EngineThread, "prepare", monkeypatch)  # off its event loop
    with serving(thread) as served:
        reply = httpx.post(served.url + _url(body), json=body, timeout=120)
    monkeypatch.undo()
    assert reply.status_code == 200, reply.text
    return submitted, reply.json()


def _ran(model_path: Path, body: dict[str, Any], tmp_path: Path, monkeypatch) -> tuple[list, list]:
    """(the SamplingParams run queued, in choice order, and its result lines)."""
    import typer

    from macbatch.batch.command import run_command

    queued = _record_params(Engine, "prepare_request", monkeypatch)  # rows prepared off-loop
    row = {"custom_id": "r", "method": "POST", "url": _url(body), "body": body}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    job = write_job(
        tmp_path,
        f"model: {model_path}\noutput: {{dir: out}}\njobs:\n  - {{name: j, input: rows.jsonl}}\n",
    )
    app = typer.Typer()
    app.command()(run_command)
    result = CliRunner().invoke(app, [str(job), "--headless"])
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out" / "j.errors.jsonl").exists()
    return queued, read_jsonl(tmp_path / "out" / "j.jsonl")


def _same_json(served: Any, ran: Any, where: str = "") -> None:
    """Field by field: the same keys everywhere, the same values bar the volatile ones (and
    float32 rounding)."""
    if isinstance(served, dict):
        assert isinstance(ran, dict) and served.keys() == ran.keys(), where
        for key in served:
            if key not in VOLATILE:
                _same_json(served[key], ran[key], f"{where}.{key}")
    elif isinstance(served, list):
        assert isinstance(ran, list) and len(served) == len(ran), where
        for i, (a, b) in enumerate(zip(served, ran)):
            _same_json(a, b, f"{where}[{i}]")
    elif isinstance(served, float):  # logprobs: float32 sums in another batch differ in the ulp
        assert ran == pytest.approx(served, rel=1e-5, abs=1e-5), f"{where}: {served} vs {ran}"
    else:
        assert served == ran, f"{where}: serve {served!r}, run {ran!r}"


@pytest.mark.parametrize("name", BODIES)
def test_serve_and_run_read_a_body_alike(name, thread, model_path, tmp_path, monkeypatch) -> None:
    body = BODIES[name]
    submitted, reply = _served(thread, body, monkeypatch)
    queued, lines = _ran(model_path, body, tmp_path, monkeypatch)
    assert queued == submitted  # SamplingParams: a frozen dataclass, compared field by field
    [line] = lines  # a body's n choices are one line, as serve answers them
    assert len(reply["choices"]) == body.get("n", 1)
    _same_json(reply, line["response"]["body"])
