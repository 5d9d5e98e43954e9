"""The official openai client against a real server: answers equal the engine's own greedy
output for the same prompt, in whole responses and in streams."""

from __future__ import annotations

import math

import openai
import pytest

from macbatch.engine import SamplingParams
from tests.support.live_server import Served, engine_generate

GREEDY = SamplingParams(max_tokens=12, temperature=0)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world"}]
TEXT = "how are you today?"


@pytest.fixture
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0, timeout=60)


def test_chat_completion_matches_engine(client: openai.OpenAI, served: Served) -> None:
    [expected] = engine_generate(served.thread, [CHAT], GREEDY)
    response = client.chat.completions.create(
        model=response_model(client), messages=CHAT, max_tokens=12, temperature=0
    )
    choice = response.choices[0]
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason.value
    usage = response.usage
    assert usage.prompt_tokens == expected.metrics.prompt_tokens
    assert usage.completion_tokens == len(expected.token_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    extra = usage.model_extra
    assert 0 < extra["time_to_first_token_s"] < 30
    assert extra["tokens_per_second"] > 0


def test_completion_matches_engine(client: openai.OpenAI, served: Served) -> None:
    [expected] = engine_generate(served.thread, [TEXT], GREEDY)
    response = client.completions.create(
        model=response_model(client), prompt=TEXT, max_tokens=12, temperature=0
    )
    assert response.object == "text_completion"
    assert response.id.startswith("cmpl-")
    assert response.choices[0].text == expected.text
    assert response.choices[0].finish_reason == "length"
    assert response.usage.prompt_tokens == expected.metrics.prompt_tokens
    assert response.usage.completion_tokens == len(expected.token_ids)


def test_completion_prompt_list_and_token_ids(client: openai.OpenAI, served: Served) -> None:
    prompts = [TEXT, "the quick brown fox"]
    expected = engine_generate(served.thread, prompts, GREEDY)
    ids = served.thread.call(lambda engine: engine.encode_prompt(TEXT)).result()
    response = client.completions.create(
        model=response_model(client), prompt=prompts, max_tokens=12, temperature=0
    )
    assert [c.text for c in sorted(response.choices, key=lambda c: c.index)] == [
        e.text for e in expected
    ]
    by_ids = client.completions.create(
        model=response_model(client), prompt=ids, max_tokens=12, temperature=0
    )
    assert by_ids.choices[0].text == expected[0].text


def test_chat_stream_with_usage(client: openai.OpenAI, served: Served) -> None:
    [expected] = engine_generate(served.thread, [CHAT], GREEDY)
    stream = client.chat.completions.create(
        model=response_model(client),
        messages=CHAT,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1  # one id for the whole stream
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == expected.finish_reason.value
    assert all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert chunks[-1].usage.prompt_tokens == expected.metrics.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream(client: openai.OpenAI, served: Served) -> None:
    [expected] = engine_generate(served.thread, [TEXT], GREEDY)
    stream = client.completions.create(
        model=response_model(client), prompt=TEXT, max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert len(chunks) > 1  # really streamed, not one final chunk
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string(client: openai.OpenAI, served: Served, stream: bool) -> None:
    [full] = engine_generate(served.thread, [TEXT], SamplingParams(max_tokens=24, temperature=0))
    text = full.text
    cut = next(k for k in range(1, len(text) - 3) if text.find(text[k : k + 3]) == k)
    stop = text[cut : cut + 3]
    [expected] = engine_generate(
        served.thread, [TEXT], SamplingParams(max_tokens=24, temperature=0, stop=(stop,))
    )
    assert expected.text == text[:cut]  # the engine's own stop handling, the oracle
    result = client.completions.create(
        model=response_model(client),
        prompt=TEXT,
        max_tokens=24,
        temperature=0,
        stop=[stop, "never appears \u2603"],
        stream=stream,
    )
    if stream:
        chunks = list(result)
        got, reason = (
            "".join(c.choices[0].text for c in chunks),
            chunks[-1].choices[0].finish_reason,
        )
    else:
        got, reason = result.choices[0].text, result.choices[0].finish_reason
    assert (got, reason) == (text[:cut], "stop")


def test_n_choices_use_successive_seeds(client: openai.OpenAI, served: Served) -> None:
    expected = [
        engine_generate(
            served.thread, [TEXT], SamplingParams(max_tokens=10, temperature=1.0, seed=seed)
        )[0].text
        for seed in (7, 8, 9)
    ]
    response = client.completions.create(
        model=response_model(client), prompt=TEXT, max_tokens=10, temperature=1.0, seed=7, n=3
    )
    got = [c.text for c in sorted(response.choices, key=lambda c: c.index)]
    assert got == expected
    assert (
        response.usage.prompt_tokens
        == engine_generate(served.thread, [TEXT], GREEDY)[0].metrics.prompt_tokens
    )  # counted once per prompt, not once per choice


def test_chat_logprobs(client: openai.OpenAI, served: Served) -> None:
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=3)
    [expected] = engine_generate(served.thread, [CHAT], params)
    response = client.chat.completions.create(
        model=response_model(client),
        messages=CHAT,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = response.choices[0].logprobs.content
    assert len(content) == len(expected.token_ids)
    for entry, logprob, top in zip(content, expected.logprobs, expected.top_logprobs):
        assert math.isclose(entry.logprob, logprob, rel_tol=1e-5, abs_tol=1e-6)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(sorted(top.values())[::-1])
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the top token
        assert bytes(entry.bytes) == entry.token.encode()


def test_completion_logprobs_stream(client: openai.OpenAI, served: Served) -> None:
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=1)
    [expected] = engine_generate(served.thread, [TEXT], params)
    stream = client.completions.create(
        model=response_model(client),
        prompt=TEXT,
        max_tokens=6,
        temperature=0,
        logprobs=1,
        stream=True,
    )
    tokens, logprobs, offsets = [], [], []
    for chunk in stream:
        if chunk.choices[0].logprobs:
            tokens += chunk.choices[0].logprobs.tokens
            logprobs += chunk.choices[0].logprobs.token_logprobs
            offsets += chunk.choices[0].logprobs.text_offset
    assert logprobs == pytest.approx(expected.logprobs[: len(expected.token_ids)], abs=1e-5)
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


def test_models(client: openai.OpenAI, served: Served) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [served.thread.info.model_name]
    assert client.models.retrieve(models[0].id).id == models[0].id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=2)
    assert info.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"top_p": 1.5}, "top_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"n": 0}, "n"),
        ({"stop": [""]}, "stop"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f f"}}]}, "tools"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
    ],
)
def test_invalid_chat_fields_are_400(
    client: openai.OpenAI, fields: dict, param: str | None
) -> None:
    body = {"model": response_model(client), "messages": CHAT, "max_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/chat/completions", body=body, cast_to=object)
    error = info.value.body
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]


def test_unknown_fields_are_ignored(client: openai.OpenAI, served: Served) -> None:
    [expected] = engine_generate(served.thread, [TEXT], GREEDY)
    response = client.completions.create(
        model=response_model(client),
        prompt=TEXT,
        max_tokens=12,
        temperature=0,
        user="someone",
        extra_body={"some_future_field": {"x": 1}},
    )
    assert response.choices[0].text == expected.text


def test_prompt_that_fills_the_context_is_400(client: openai.OpenAI, served: Served) -> None:
    limit = served.thread.info.max_model_len
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=response_model(client), prompt=[5] * limit, max_tokens=1)
    assert "leaves no room for a reply" in info.value.body["message"]


def test_max_tokens_beyond_the_context_is_capped(client: openai.OpenAI, served: Served) -> None:
    """The engine's one rule: max_tokens shrinks to the room the prompt leaves."""
    limit = served.thread.info.max_model_len
    prompt = [5] * (limit - 3)
    response = client.completions.create(
        model=response_model(client), prompt=prompt, max_tokens=limit, temperature=0
    )
    assert response.usage.prompt_tokens == limit - 3
    assert response.usage.completion_tokens <= 3


def response_model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_every_sampling_field_reaches_the_engine(client: openai.OpenAI, served: Served) -> None:
    fields = dict(
        temperature=0.8,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=0.3,
        repetition_penalty=1.1,
        seed=3,
        max_tokens=12,
    )
    [expected] = engine_generate(served.thread, [TEXT], SamplingParams(**fields))
    [baseline] = engine_generate(
        served.thread, [TEXT], SamplingParams(max_tokens=12, temperature=0.8, seed=3)
    )
    assert expected.token_ids != baseline.token_ids  # the fields change the output
    extra = {k: fields.pop(k) for k in ("top_k", "min_p", "repetition_penalty")}
    response = client.completions.create(
        model=response_model(client), prompt=TEXT, extra_body=extra, **fields
    )
    assert response.choices[0].text == expected.text


@pytest.mark.parametrize("chat", [True, False])
def test_logprobs_of_masked_tokens_are_json(client: openai.OpenAI, chat: bool) -> None:
    """A choice constraint masks every other token to -inf, which JSON cannot carry (found by
    tests/fuzz): the alternatives come back with OpenAI's lowest logprob, -9999."""
    from macbatch.openai.responses import LOWEST_LOGPROB

    model = client.models.list().data[0].id
    extra = {"guided_choice": ["0"]}
    if chat:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "0"}], max_tokens=1,
            logprobs=True, top_logprobs=2, extra_body=extra,
        )  # fmt: skip
        [entry] = reply.choices[0].logprobs.content  # type: ignore[union-attr]
        alternatives = [top.logprob for top in entry.top_logprobs]
    else:
        completion = client.completions.create(
            model=model, prompt="0", max_tokens=1, logprobs=2, extra_body=extra
        )
        [top] = completion.choices[0].logprobs.top_logprobs  # type: ignore[union-attr]
        alternatives = sorted(top.values(), reverse=True)
    assert alternatives[0] == 0.0 and alternatives[1] == LOWEST_LOGPROB
