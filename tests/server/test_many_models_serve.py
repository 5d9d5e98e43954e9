"""``macbatch serve`` itself with two ``--model``s, a ``--models-dir`` and ``--max-loaded-models
1`` (a child process, as users run it): alternating requests for every model, through the
official ``openai`` client, each answer equal to a single-model server's (greedy); a model
named nowhere is a 404."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from macbatch.server.app import ServerOptions
from tests.support.live_server import Served, serving, start_engine
from tests.support.serve_process import start_server
from tests.support.tiny import save_model

PROMPTS = ["hello world", "the quick brown fox"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-many")
    return {
        "alpha": save_model(root / "given" / "alpha", arch="qwen3", seed=0),
        "beta": save_model(root / "given" / "beta", arch="llama", seed=1),
        "gamma": save_model(root / "shelf" / "gamma", arch="qwen2", seed=2),
    }


@pytest.fixture(scope="module")
def alone(models: dict[str, Path]) -> Iterator[dict[str, Served]]:
    threads = {name: start_engine(path) for name, path in models.items()}
    with ExitStack() as stack:
        yield {
            name: stack.enter_context(serving(thread, ServerOptions(model_aliases=(name,))))
            for name, thread in threads.items()
        }
    for thread in threads.values():
        thread.shutdown()


def reply(api: str, model: str, prompt: str) -> str:
    client = openai.OpenAI(base_url=api, api_key="x", max_retries=0)
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=10, temperature=0
    )
    return answer.choices[0].message.content or ""


def test_serve_answers_every_model_alternately_as_each_alone(
    models: dict[str, Path], alone: dict[str, Served], tmp_path: Path
) -> None:
    process, url = start_server(
        models["alpha"],
        "--model",
        str(models["beta"]),
        "--models-dir",
        str(models["gamma"].parent),
        "--max-loaded-models",
        "1",
        env={"MACBATCH_HOME": str(tmp_path / "home")},
    )
    try:
        listed = {m["id"] for m in httpx.get(url + "/v1/models").json()["data"]}
        assert {str(models["alpha"]), str(models["beta"]), "gamma"} <= listed
        for prompt in PROMPTS:
            for name in ("alpha", "beta", "gamma"):
                assert reply(url + "/v1", name, prompt) == reply(alone[name].api, name, prompt)
        loaded = httpx.get(url + "/health").json()["loaded_models"]
        # the first --model runs the Batch API and stays; one other at most (gamma, the last)
        assert sorted(loaded) == sorted([str(models["alpha"]), "gamma"])
        with pytest.raises(openai.NotFoundError):
            reply(url + "/v1", "delta", "hi")
    finally:
        process.terminate()
        process.wait(timeout=60)
        process.stderr.close()
