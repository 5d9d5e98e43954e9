"""Adapters under ``--models-dir`` served on demand, through the official ``openai`` client:
each folder whose ``adapter_config.json`` names a served base model is listed in ``/v1/models``
as ``base:adapter``, loads into the base model's running engine when a request first names it,
answers as an engine that loaded it at start does (whose equality to mlx-lm's own generation
tests/engine/lora/test_lora.py holds), reports the name the client asked, and unloads, least
recently used first, when the memory guard needs its room for another."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest

from macbatch.engine import Engine, EngineThread, PromptInput, SamplingParams, Turns
from macbatch.models.adapter_uses import need_of_adapter
from macbatch.models.catalog import catalog, starter
from macbatch.models.memory import Memory
from macbatch.models.pool import ModelPool, PoolLimits
from macbatch.openai import DATA_ONLY
from macbatch.server.app import ServerOptions, create_pool_app
from tests.support.live_server import ENGINE_CONFIG, Served, engine_generate, serving_app
from tests.support.lora import ATTENTION, MLP, name_base, save_adapter, to_peft
from tests.support.polling import wait_until

PROMPT = "the quick brown fox"
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


class GuardedMemory:
    """The machine as the guard reads it: ``room`` bytes, less the adapters loaded in ``pool``
    (their files' sizes), so that only one of the two adapters fits at a time."""

    def __init__(self) -> None:
        self.room = 1 << 40  # the base model loads first, unguarded
        self.pool: ModelPool | None = None
        self.paths: dict[str, str] = {}

    def __call__(self) -> Memory:
        assert self.pool is not None
        held = sum(
            need_of_adapter(self.paths[name]).total
            for loaded in self.pool.loaded.values()
            for name in loaded.adapters
        )
        return Memory(self.room, self.room - held)


@pytest.fixture(scope="module")
def adapters_dir(tmp_path_factory, tiny_model_path) -> Path:
    """Two adapters of the same size under one models folder: mlx-lm's naming the base by its
    path, PEFT's by a hub id ending in the base's folder name."""
    root = tmp_path_factory.mktemp("models-dir")
    name_base(save_adapter(root / "attn", seed=1, keys=ATTENTION + MLP), str(tiny_model_path))
    mlx_twin = save_adapter(tmp_path_factory.mktemp("twin") / "peft", seed=2, keys=ATTENTION + MLP)
    name_base(to_peft(mlx_twin, root / "peft"), "someone/tiny-qwen3")
    save_adapter(root / "orphan", seed=3, keys=MLP)  # names no base: not served
    return root


@pytest.fixture(scope="module")
def oracle(adapters_dir, tiny_model_path) -> Iterator[dict[str, str]]:
    """Each adapter's greedy text from an engine that loaded both at start."""
    pairs = (("attn", str(adapters_dir / "attn")), ("peft", str(adapters_dir / "peft")))
    config = replace(ENGINE_CONFIG, adapters=pairs)
    thread = EngineThread(lambda: Engine.load(str(tiny_model_path), config)).start()
    thread.wait_ready(timeout=120)
    prompts = [PromptInput(PROMPT, adapter=a) for a in (None, "attn", "peft")]
    outs = engine_generate(thread, prompts, GREEDY)
    thread.shutdown()
    yield dict(zip(("base", "attn", "peft"), (o.text for o in outs)))


@pytest.fixture
def served(adapters_dir, tiny_model_path) -> Iterator[tuple[Served, ModelPool, GuardedMemory]]:
    memory = GuardedMemory()
    entries = catalog((str(tiny_model_path),), (adapters_dir,))
    memory.paths = entries[0].adapter_paths
    pool = ModelPool(
        entries, starter(ENGINE_CONFIG, Turns()), DATA_ONLY, PoolLimits(keep_alive_s=None), memory
    )
    memory.pool = pool
    loaded = pool.load_now(entries[0].name)
    try:
        with serving_app(create_pool_app(pool, ServerOptions()), loaded.thread) as server:
            yield server, pool, memory
    finally:
        for model in list(pool.loaded.values()):
            model.thread.shutdown()


def _completion(served: Served, model: str) -> tuple[str, str]:
    client = openai.OpenAI(base_url=served.api, api_key="none", max_retries=0)
    body = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    return body.choices[0].text, body.model


def _adapters_loaded(served: Served) -> dict[str, bool]:
    cards = httpx.get(served.api + "/models").json()["data"]
    return {c["id"]: c["macbatch"]["loaded"] for c in cards if "adapter" in c["macbatch"]}


def test_listed_loaded_on_first_use_and_named_as_asked(served, oracle, tiny_model_path):
    server, pool, _ = served
    base = str(tiny_model_path)
    assert _adapters_loaded(server) == {f"{base}:attn": False, f"{base}:peft": False}
    assert _completion(server, "tiny-qwen3:attn") == (oracle["attn"], "tiny-qwen3:attn")
    assert _completion(server, "peft") == (oracle["peft"], "peft")
    assert _completion(server, "tiny-qwen3") == (oracle["base"], base)
    assert _adapters_loaded(server) == {f"{base}:attn": True, f"{base}:peft": True}
    client = openai.OpenAI(base_url=server.api, api_key="none", max_retries=0)
    stream = client.chat.completions.create(
        model="tiny-qwen3:peft",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
    )
    assert {chunk.model for chunk in stream} == {"tiny-qwen3:peft"}
    [loaded] = pool.loaded.values()
    # the stream's lease goes when the server's handler ends, just after the client's last chunk
    assert wait_until(lambda: all(use.leases == 0 for use in loaded.adapters.values()))


def test_the_least_recently_used_adapter_unloads_for_another(served, oracle, tiny_model_path):
    server, pool, memory = served
    base = str(tiny_model_path)
    sizes = [need_of_adapter(path).total for path in memory.paths.values()]
    memory.room = sum(sizes) - 1  # one adapter fits, not two
    for name in ("attn", "peft", "attn"):
        assert _completion(server, f"tiny-qwen3:{name}")[0] == oracle[name]
        others = {"attn": "peft", "peft": "attn"}[name]
        assert _adapters_loaded(server) == {f"{base}:{name}": True, f"{base}:{others}": False}
    assert list(pool.loaded) == [base]  # the model stayed
