"""Serve's adapters through the official ``openai`` client: ``model`` as ``base:adapter`` or the
adapter's name answers with that adapter (the engine's own generation of it, whose equality to
mlx-lm's tests/engine/lora/test_lora.py holds), the base with none; ``/v1/models`` lists them."""

from __future__ import annotations

import openai
import pytest

from macbatch.engine import Engine, EngineConfig, EngineThread, PromptInput, SamplingParams
from tests.support.live_server import engine_generate, serving
from tests.support.lora import ATTENTION, MLP, save_adapter

PROMPT = "the quick brown fox"
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_path):
    root = tmp_path_factory.mktemp("adapters")
    adapters = (
        ("attn", str(save_adapter(root / "attn", seed=1, keys=ATTENTION))),
        ("mlp", str(save_adapter(root / "mlp", seed=2, keys=MLP, rank=8))),
    )
    config = EngineConfig(num_blocks=256, adapters=adapters)
    thread = EngineThread(lambda: Engine.load(str(tiny_model_path), config)).start()
    thread.wait_ready(timeout=120)
    with serving(thread) as server:
        yield server
    thread.shutdown()


def _completion(client: openai.OpenAI, model: str) -> str:
    body = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    return body.choices[0].text


def test_the_model_field_names_an_adapter(served):
    client = openai.OpenAI(base_url=served.api, api_key="none", max_retries=0)
    base = served.thread.info.model_name
    prompts = [PromptInput(PROMPT, adapter=a) for a in (None, "attn", "mlp")]
    want = [o.text for o in engine_generate(served.thread, prompts, GREEDY)]
    assert len(set(want)) == 3
    assert _completion(client, base) == want[0]
    assert _completion(client, f"{base}:attn") == want[1]
    assert _completion(client, "mlp") == want[2]
    ids = [m.id for m in client.models.list()]
    assert ids == [base, f"{base}:attn", f"{base}:mlp"]
    with pytest.raises(openai.NotFoundError):
        _completion(client, f"{base}:nope")
