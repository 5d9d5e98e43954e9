"""chat_template_kwargs and reasoning_effort through a real server reach the model's template."""

from __future__ import annotations

import openai
import pytest

from macbatch.engine import PromptInput, SamplingParams
from tests.support.live_server import serving, start_engine
from tests.support.tiny import THINKING_TEMPLATE, save_model

CHAT = [{"role": "user", "content": "hello world"}]
OFF = {"enable_thinking": False}


@pytest.fixture
def thinking_server(tmp_path):
    thread = start_engine(save_model(tmp_path / "thinking", chat_template=THINKING_TEMPLATE))
    try:
        with serving(thread) as served:
            yield served
    finally:
        thread.shutdown()


def test_template_kwargs_reach_the_template(thinking_server) -> None:
    thread = thinking_server.thread
    params = SamplingParams(max_tokens=8, temperature=0)
    [expected] = thread.call(
        lambda engine: engine.generate([PromptInput(CHAT, OFF)], params)
    ).result(timeout=60)
    default_ids = thread.encode_prompt(CHAT)
    assert expected.metrics.prompt_tokens > len(default_ids)  # "off" changes the prompt
    client = openai.OpenAI(base_url=thinking_server.api, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    response = client.chat.completions.create(
        model=model,
        messages=CHAT,
        max_tokens=8,
        temperature=0,
        extra_body={"chat_template_kwargs": OFF, "reasoning_effort": "low"},
    )
    assert response.usage.prompt_tokens == expected.metrics.prompt_tokens
    assert response.choices[0].message.content == expected.text
    plain = client.chat.completions.create(model=model, messages=CHAT, max_tokens=1)
    assert plain.usage.prompt_tokens == len(default_ids)
    with pytest.raises(openai.BadRequestError, match="argument of apply_chat_template"):
        client.chat.completions.create(
            model=model, messages=CHAT, extra_body={"chat_template_kwargs": {"tokenize": True}}
        )
