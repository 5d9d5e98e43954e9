"""One server, many models (issue 49): requests name any of two tiny models saved in Hugging Face
layout, which load on demand and unload past ``max_loaded``; each reply equals what a server of
that model alone gives (the oracle: a single-model server per model, greedy); one model embeds
while the other streams; the engines alternate on the device; a model that cannot fit is
refused before it loads, with the reason."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from macbatch.engine import Turns
from macbatch.models.catalog import starter
from macbatch.models.memory import parse_meminfo
from macbatch.models.pool import ModelPool, ModelRefused, PoolLimits, Servable
from macbatch.openai import DATA_ONLY
from macbatch.server.app import ServerOptions, create_pool_app
from tests.support.live_server import ENGINE_CONFIG, Served, serving, serving_app, start_engine
from tests.support.metrics_scrape import scrape
from tests.support.polling import wait_until
from tests.support.tiny import save_two_models

PROMPTS = ["hello world", "the quick brown fox", "MLX runs on Apple silicon"]
MEMINFO = Path(__file__).parents[1] / "support" / "memory" / "meminfo_small.txt"


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return save_two_models(tmp_path_factory.mktemp("many"))


@pytest.fixture(scope="module")
def alone(two_models: dict[str, Path]) -> Iterator[dict[str, Served]]:
    """The oracle: each model served alone, by the single-model server."""
    threads = {name: start_engine(path) for name, path in two_models.items()}
    named = {name: ServerOptions(model_aliases=(name,)) for name in threads}
    with (
        serving(threads["alpha"], named["alpha"]) as a,
        serving(threads["beta"], named["beta"]) as b,
    ):
        yield {"alpha": a, "beta": b}
    for thread in threads.values():
        thread.shutdown()


class CountingStarter:
    """The serve command's starter, counting the loads it was asked for."""

    def __init__(self, turns: Turns) -> None:
        self.start = starter(ENGINE_CONFIG, turns)
        self.loads: list[str] = []

    def __call__(self, entry: Servable) -> Any:
        self.loads.append(entry.name)
        return self.start(entry)


@contextmanager
def served_pool(
    two_models: dict[str, Path],
    limits: PoolLimits,
    turns: Turns | None = None,
    memory: Any = None,
) -> Iterator[tuple[Served, ModelPool, CountingStarter]]:
    """A pool server over both models, alpha loaded up front (as serve's first --model)."""
    catalog = [Servable(name, str(path), path) for name, path in two_models.items()]
    counting = CountingStarter(turns or Turns())
    pool = ModelPool(catalog, counting, DATA_ONLY, limits, memory)
    pool.load_now("alpha")
    app = create_pool_app(pool, ServerOptions())
    try:
        with serving_app(app, pool.loaded["alpha"].thread) as server:
            yield server, pool, counting
    finally:
        for loaded in list(pool.loaded.values()):
            loaded.thread.shutdown()


def chat(served: Served, model: str, prompt: str, max_tokens: int = 12) -> str:
    client = openai.OpenAI(base_url=served.api, api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def embed(served: Served, model: str, texts: list[str]) -> list[list[float]]:
    client = openai.OpenAI(base_url=served.api, api_key="x", max_retries=0)
    return [item.embedding for item in client.embeddings.create(model=model, input=texts).data]


def loaded_flags(served: Served) -> dict[str, bool]:
    cards = httpx.get(served.api + "/models").json()["data"]
    return {card["id"]: card["macbatch"]["loaded"] for card in cards}


def test_alternating_models_with_one_loaded_answer_as_each_alone(
    two_models: dict[str, Path], alone: dict[str, Served]
) -> None:
    with served_pool(two_models, PoolLimits(keep_alive_s=None, max_loaded=1)) as (
        served,
        _,
        counting,
    ):
        for prompt in PROMPTS:
            for name in ("alpha", "beta"):
                assert chat(served, name, prompt) == chat(alone[name], name, prompt)
                flags = loaded_flags(served)
                assert flags == {"alpha": name == "alpha", "beta": name == "beta"}
        # alpha up front; then every request but the first loads its model, unloading the other
        assert counting.loads == ["alpha", "beta"] * len(PROMPTS)


def test_one_model_embeds_while_the_other_streams(
    two_models: dict[str, Path], alone: dict[str, Served]
) -> None:
    texts = ["notes about the fox", "a second note"]
    expected_text = chat(alone["alpha"], "alpha", PROMPTS[1], max_tokens=48)
    expected_vectors = embed(alone["beta"], "beta", texts)
    with served_pool(two_models, PoolLimits(keep_alive_s=None)) as (served, pool, _):
        client = openai.OpenAI(base_url=served.api, api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model="alpha",
            messages=[{"role": "user", "content": PROMPTS[1]}],
            max_tokens=48,
            temperature=0,
            stream=True,
        )
        pieces = [next(iter(stream)).choices[0].delta.content or ""]
        admission = served.app.state.macbatch.admission
        assert admission.pending_of("alpha") == 1  # the chat is still generating
        vectors = embed(served, "beta", texts)
        pieces += [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert np.allclose(vectors, expected_vectors, atol=1e-5)
    assert "".join(pieces) == expected_text


def test_two_busy_models_take_turns_on_the_device(two_models: dict[str, Path]) -> None:
    """Both stream long replies at once: whenever one ends its turn while the other waits, the
    other steps next, and when the first finishes the second has nearly finished too."""
    turns = Turns(keep_log=True)
    tokens = 64
    counts = {"alpha": 0, "beta": 0}
    finished: list[tuple[str, dict[str, int]]] = []  # who finished, and the counts then
    with served_pool(two_models, PoolLimits(keep_alive_s=None), turns) as (served, _, _):
        chat(served, "beta", "warm up", 1)  # loaded before the race starts
        start = threading.Barrier(2)

        def run(name: str) -> None:
            client = openai.OpenAI(base_url=served.api, api_key="x", max_retries=0)
            start.wait()
            for chunk in client.completions.create(
                model=name,
                prompt="hello",
                max_tokens=tokens,
                temperature=0,
                stream=True,
                logprobs=0,
                extra_body={"ignore_eos": True},
            ):
                for choice in chunk.choices:  # each chunk's tokens, from their logprobs
                    counts[name] += len(choice.logprobs.tokens or []) if choice.logprobs else 0
            finished.append((name, dict(counts)))

        turns.log.clear()  # type: ignore[union-attr]
        workers = [threading.Thread(target=run, args=(n,)) for n in ("alpha", "beta")]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
    log = turns.log
    assert log is not None and len(log) > tokens
    handed_over = [log[i + 1][0] != owner for i, (owner, waited) in enumerate(log[:-1]) if waited]
    assert handed_over and all(handed_over)
    (first, at_first), (_, at_end) = finished
    other = "beta" if first == "alpha" else "alpha"
    assert at_end == {"alpha": tokens, "beta": tokens}
    assert at_first[other] >= tokens * 3 // 4, finished


def test_unknown_and_too_large_models_are_refused_before_loading(
    two_models: dict[str, Path],
) -> None:
    small = parse_meminfo(MEMINFO.read_text())
    with served_pool(two_models, PoolLimits(keep_alive_s=None)) as (served, pool, counting):
        pool.memory = lambda: small  # from here on the machine has 100 MiB free
        pool.loaded["alpha"].pinned = True  # as the Batch API's model: it never unloads
        client = openai.OpenAI(base_url=served.api, api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(
                model="gamma", messages=[{"role": "user", "content": "hi"}]
            )
        assert missing.value.body["code"] == "model_not_found"
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="beta", messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.body["code"] == "model_too_large"
        message = refused.value.body["message"]
        assert "'beta' needs about" in message and "smaller quantization" in message
        assert counting.loads == ["alpha"] and set(pool.loaded) == {"alpha"}
        with pytest.raises(ModelRefused, match="'beta' needs about") as at_start:  # serve's --model
            pool.load_now("beta")
        assert at_start.value.status == 400 and counting.loads == ["alpha"]


def test_requests_wait_for_their_model_to_load_and_it_loads_once(
    two_models: dict[str, Path], alone: dict[str, Served]
) -> None:
    expected = chat(alone["beta"], "beta", PROMPTS[0])
    with served_pool(two_models, PoolLimits(keep_alive_s=None)) as (served, _, counting):
        replies: list[str] = []
        workers = [
            threading.Thread(target=lambda: replies.append(chat(served, "beta", PROMPTS[0])))
            for _ in range(4)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=120)
        assert replies == [expected] * 4
        assert counting.loads == ["alpha", "beta"]


def test_an_idle_model_unloads_after_keep_alive_and_loads_again(
    two_models: dict[str, Path],
) -> None:
    with served_pool(two_models, PoolLimits(keep_alive_s=0.5)) as (served, pool, counting):
        first = chat(served, "beta", PROMPTS[2])
        assert wait_until(lambda: not loaded_flags(served)["beta"], timeout=10)
        assert chat(served, "beta", PROMPTS[2]) == first
        assert counting.loads.count("beta") == 2


def test_models_lists_every_servable_model_and_metrics_carry_its_name(
    two_models: dict[str, Path],
) -> None:
    with served_pool(two_models, PoolLimits(keep_alive_s=None)) as (served, _, _):
        cards = {c["id"]: c["macbatch"] for c in httpx.get(served.api + "/models").json()["data"]}
        assert cards["alpha"]["loaded"] and not cards["beta"]["loaded"]
        on_disk = (two_models["beta"] / "model.safetensors").stat().st_size
        assert cards["beta"]["memory"]["weights_bytes"] == on_disk
        assert cards["beta"]["tasks"] == cards["alpha"]["tasks"] == ["generate", "embed", "score"]
        chat(served, "beta", "hi", 3)
        samples = scrape(served)
        assert samples['macbatch_requests_total{model="beta",finish_reason="length"}'] == 1
        assert samples['macbatch_engine_up{model="alpha"}'] == 1
        assert samples['macbatch_engine_up{model="beta"}'] == 1


def test_under_memory_pressure_idle_models_unload_and_the_pinned_one_stays(
    two_models: dict[str, Path],
) -> None:
    pressed = parse_meminfo(MEMINFO.read_text())  # 100 MiB free of 23.5 GiB: under 5%
    with served_pool(two_models, PoolLimits(keep_alive_s=None)) as (served, pool, _):
        pool.loaded["alpha"].pinned = True
        chat(served, "beta", "hi", 3)
        assert loaded_flags(served) == {"alpha": True, "beta": True}
        pool.memory = lambda: pressed
        assert wait_until(lambda: loaded_flags(served) == {"alpha": True, "beta": False}, 10)


def test_a_model_that_fails_to_load_is_a_400_with_why_and_the_others_keep_serving(
    two_models: dict[str, Path], alone: dict[str, Served], tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no_such_architecture"}')
    with served_pool({**two_models, "broken": broken}, PoolLimits(keep_alive_s=None)) as (
        served,
        pool,
        _,
    ):
        client = openai.OpenAI(base_url=served.api, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="broken", messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.body["code"] == "model_unavailable"
        assert "cannot load model 'broken'" in refused.value.body["message"]
        assert "broken" not in pool.loaded
        assert chat(served, "alpha", PROMPTS[0]) == chat(alone["alpha"], "alpha", PROMPTS[0])
        assert httpx.get(served.url + "/health").status_code == 200
