"""64 concurrent streaming clients: every one gets the greedy output a lone request gets, the KV
pool is whole again afterwards, and /metrics adds up to what the clients received."""

from __future__ import annotations

import asyncio
from collections import Counter

import openai

from macbatch.engine import EngineThread
from tests.support.live_server import Served, serving
from tests.support.metrics_scrape import scrape
from tests.support.polling import wait_until

CLIENTS = 64
MAX_TOKENS = 16
SENTENCE = "the quick brown fox jumps over the lazy dog; hello world, how are you today? "
PROMPTS = [f"{i}. {SENTENCE[: 6 + 9 * i]}" for i in range(16)]  # 16 texts of 16 lengths


def _request(i: int) -> tuple[str, dict]:
    """Client i: chat for even i, legacy completion for odd i, one of the 16 prompts."""
    prompt = PROMPTS[i % len(PROMPTS)]
    common = {"max_tokens": MAX_TOKENS, "temperature": 0}
    if i % 2 == 0:
        return "chat", {"messages": [{"role": "user", "content": prompt}], **common}
    return "completion", {"prompt": prompt, **common}


async def _call(client: openai.AsyncOpenAI, model: str, i: int, stream: bool) -> dict:
    kind, fields = _request(i)
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    create = client.chat.completions.create if kind == "chat" else client.completions.create
    result = await create(model=model, **fields, **extra)
    if not stream:
        choice = result.choices[0]
        text = choice.message.content if kind == "chat" else choice.text
        return {"text": text, "finish": choice.finish_reason, "usage": result.usage}
    parts, finish, usage = [], None, None
    async for chunk in result:
        for choice in chunk.choices:
            parts.append((choice.delta.content if kind == "chat" else choice.text) or "")
            finish = choice.finish_reason or finish
        usage = chunk.usage or usage
    return {"text": "".join(parts), "finish": finish, "usage": usage}


def test_64_concurrent_streams(engine_thread: EngineThread, served: Served) -> None:
    async def sequential() -> list[dict]:
        async with openai.AsyncOpenAI(base_url=served.api, api_key="x", max_retries=0) as client:
            model = (await client.models.list()).data[0].id
            return [await _call(client, model, i, stream=False) for i in range(2 * len(PROMPTS))]

    alone = asyncio.run(sequential())

    steps_before = engine_thread.stats().steps
    with serving(engine_thread) as fresh:  # a new app, so its metrics count only this test

        async def concurrent() -> list[dict]:
            async with openai.AsyncOpenAI(
                base_url=fresh.api, api_key="x", max_retries=0, timeout=120
            ) as client:
                model = (await client.models.list()).data[0].id
                calls = [_call(client, model, i, stream=True) for i in range(CLIENTS)]
                return await asyncio.wait_for(asyncio.gather(*calls), timeout=90)

        results = asyncio.run(concurrent())
        for i, result in enumerate(results):
            reference = alone[i % len(alone)]
            assert (result["text"], result["finish"]) == (reference["text"], reference["finish"])
            assert result["usage"].completion_tokens == reference["usage"].completion_tokens

        assert wait_until(lambda: engine_thread.stats().running == 0)
        stats = engine_thread.stats()
        assert (stats.kv_blocks_used, stats.waiting) == (0, 0)
        assert stats.steps - steps_before < CLIENTS * MAX_TOKENS / 4  # they really were batched
        metrics = scrape(fresh)
        finishes = Counter(r["finish"] for r in results)
        for reason, count in finishes.items():
            assert metrics[f'macbatch_requests_total{{finish_reason="{reason}"}}'] == count
        assert sum(v for k, v in metrics.items() if k.startswith("macbatch_requests_total")) == 64
        assert metrics["macbatch_generation_tokens_total"] == sum(
            r["usage"].completion_tokens for r in results
        )
        assert metrics["macbatch_prompt_tokens_total"] == sum(
            r["usage"].prompt_tokens for r in results
        )
        assert metrics["macbatch_time_to_first_token_seconds_count"] == CLIENTS
        buckets = [
            v
            for k, v in metrics.items()
            if k.startswith("macbatch_time_to_first_token_s") and "_bucket" in k
        ]
        assert buckets == sorted(buckets) and buckets[-1] == CLIENTS  # cumulative, +Inf last
        for route in ("/v1/chat/completions", "/v1/completions"):
            assert metrics[f'macbatch_http_responses_total{{route="{route}",status="200"}}'] == 32
        assert metrics["macbatch_requests_pending"] == 0
        assert metrics["macbatch_kv_blocks_used"] == 0
        # What the finished requests left in the prefix cache (the pool is idle: only that).
        assert metrics["macbatch_kv_bytes_used"] == stats.kv_bytes_used > 0
