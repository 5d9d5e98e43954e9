"""A request naming a preset (``"model": "terse"``) is answered with the preset's system prompt
and sampling where the body gives none, through the official openai and anthropic clients
(issue 65, item 16): the oracle is the engine's own greedy generation of the same chat with the
system prompt written out, and the prompt's token count (the system prompt is in it or not)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from macbatch.engine import SamplingParams
from tests.support.live_server import Served, engine_generate

SYSTEM = "Answer in one word."
ASK = [{"role": "user", "content": "hello world"}]
PRESET_TOKENS = 6


@pytest.fixture(autouse=True)
def presets(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``terse``: the served model, greedy, with a system prompt and a token limit."""
    (tmp_path / "presets.yaml").write_text(
        f"terse:\n  model: {served.thread.info.model_name}\n  system: {SYSTEM}\n"
        f"  temperature: 0\n  max_tokens: {PRESET_TOKENS}\n"
    )
    monkeypatch.setenv("MACBATCH_HOME", str(tmp_path))
    yield


def _expected(served: Served, messages: list[dict], max_tokens: int):
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    [out] = engine_generate(served.thread, [messages], params)
    return out


def test_a_chat_naming_a_preset_gets_its_system_prompt_and_sampling(served: Served) -> None:
    client = openai.OpenAI(base_url=served.api, api_key="none", max_retries=0)
    expected = _expected(served, [{"role": "system", "content": SYSTEM}, *ASK], PRESET_TOKENS)
    reply = client.chat.completions.create(model="terse", messages=ASK)
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.prompt_tokens == expected.metrics.prompt_tokens
    assert reply.usage.completion_tokens == len(expected.token_ids)
    # what the body gives wins: its own system message and token limit
    own = [{"role": "system", "content": "Be verbose."}, *ASK]
    mine = client.chat.completions.create(model="terse", messages=own, max_tokens=2)
    expected_own = _expected(served, own, 2)
    assert mine.choices[0].message.content == expected_own.text
    assert mine.usage.prompt_tokens == expected_own.metrics.prompt_tokens
    # the served model by its own name: none of the preset's settings
    plain = client.chat.completions.create(
        model=served.thread.info.model_name, messages=ASK, max_tokens=2, temperature=0
    )
    assert plain.usage.prompt_tokens == _expected(served, ASK, 2).metrics.prompt_tokens
    assert plain.usage.prompt_tokens < reply.usage.prompt_tokens


def test_responses_and_messages_naming_a_preset_get_its_system_prompt(served: Served) -> None:
    expected = _expected(served, [{"role": "system", "content": SYSTEM}, *ASK], PRESET_TOKENS)
    client = openai.OpenAI(base_url=served.api, api_key="none", max_retries=0)
    response = client.responses.create(model="terse", input="hello world")
    assert response.output_text == expected.text
    assert response.usage.input_tokens == expected.metrics.prompt_tokens
    messages = anthropic.Anthropic(base_url=served.url, api_key="none", max_retries=0)
    message = messages.messages.create(model="terse", messages=ASK, max_tokens=PRESET_TOKENS)
    [block] = message.content
    assert block.text == expected.text  # greedy: the preset's temperature
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == expected.metrics.prompt_tokens
