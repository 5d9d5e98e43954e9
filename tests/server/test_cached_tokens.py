"""Prompt tokens read from the prefix cache, reported by every API and by /metrics: a body sent
twice reads, the second time, every full 16-token block of its prompt but the one holding its
last token (the engine computes at least one token), read through the official clients
(openai's ``prompt_tokens_details.cached_tokens`` and ``input_tokens_details.cached_tokens``,
anthropic's ``cache_read_input_tokens``), and /metrics counts the same tokens and hits under
tier "ram"."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anthropic
import openai
import pytest

from tests.support.live_server import Served
from tests.support.metrics_scrape import scrape

TOKENS = 'macbatch_prefix_cache_tokens_total{tier="ram"}'
HITS = 'macbatch_prefix_cache_hits_total{tier="ram"}'
WORDS = "the quick brown fox jumps over the lazy dog " * 12


def _unique() -> str:
    """A prompt no other test sent: it opens with a fresh nonce, so its first block is new."""
    return f"{uuid.uuid4().hex} {WORDS}"


def _full_blocks_but_the_last_token(prompt_tokens: int, block_size: int) -> int:
    return (prompt_tokens - 1) // block_size * block_size


def _sent_twice(served: Served, send: Callable[[str], tuple[int, int]]) -> None:
    """``send(text)`` -> (cached, prompt) tokens; the same text twice, /metrics around it."""
    before = scrape(served)
    text = _unique()
    first_cached, prompt = send(text)
    cached, again = send(text)
    after = scrape(served)
    assert again == prompt > 64
    assert first_cached == 0
    assert cached == _full_blocks_but_the_last_token(prompt, served.thread.info.block_size)
    assert after[TOKENS] - before[TOKENS] == cached
    assert after[HITS] - before[HITS] == 1
    prompt_total = "macbatch_prompt_tokens_total"
    assert after[prompt_total] - before[prompt_total] == 2 * prompt


@pytest.fixture
def oai(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions(served: Served, oai: openai.OpenAI, stream: bool) -> None:
    def send(text: str) -> tuple[int, int]:
        body = dict(model=served.thread.info.model_name, max_tokens=2, temperature=0)
        messages = [{"role": "user", "content": text}]
        if stream:
            chunks = list(
                oai.chat.completions.create(
                    **body, messages=messages, stream=True, stream_options={"include_usage": True}
                )
            )
            usage = chunks[-1].usage
        else:
            usage = oai.chat.completions.create(**body, messages=messages).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        return usage.prompt_tokens_details.cached_tokens or 0, usage.prompt_tokens

    _sent_twice(served, send)


def test_responses(served: Served, oai: openai.OpenAI) -> None:
    def send(text: str) -> tuple[int, int]:
        response = oai.responses.create(
            model=served.thread.info.model_name, input=text, max_output_tokens=2, store=False
        )
        assert response.usage is not None
        return response.usage.input_tokens_details.cached_tokens, response.usage.input_tokens

    _sent_twice(served, send)


@pytest.mark.parametrize("stream", [False, True])
def test_messages(served: Served, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=60)

    def send(text: str) -> tuple[int, int]:
        body = dict(
            model=served.thread.info.model_name,
            messages=[{"role": "user", "content": text}],
            max_tokens=2,
        )
        if stream:
            with client.messages.stream(**body) as events:
                usage = events.get_final_message().usage
        else:
            usage = client.messages.create(**body).usage
        cached = usage.cache_read_input_tokens or 0
        return cached, usage.input_tokens + cached  # Anthropic counts cache reads apart

    _sent_twice(served, send)
