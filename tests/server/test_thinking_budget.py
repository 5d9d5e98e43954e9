"""A thinking budget through serve, over a tiny random model with Qwen3's real tokenizer and its
template as Qwen3's thinking releases ship it (the reply starts inside ``<think>``, which the
model never closes itself): chat completions' ``thinking_token_budget``, Anthropic's
``thinking.budget_tokens`` and the Responses API's ``reasoning.effort`` each close the reasoning
at the budget, and the reply equals the engine's own generation with that budget."""

from __future__ import annotations

import anthropic
import openai
import pytest

from macbatch.engine import SamplingParams
from macbatch.openai.responses_api import EFFORT_BUDGETS
from tests.support.live_server import Served, engine_generate, serving, start_engine
from tests.support.real_tokenizers import open_reasoning
from tests.support.structured import QWEN3_VOCAB, save_model_with_tokenizer

ASK = [{"role": "user", "content": "Why is the sky blue?"}]
MAX = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    path = save_model_with_tokenizer(
        tmp_path_factory.mktemp("models") / "tiny-qwen3-think", "qwen3", QWEN3_VOCAB
    )
    thread = start_engine(open_reasoning(path))
    with serving(thread) as server:
        yield server
    thread.shutdown()


def _expected(served: Served, budget: int | None):
    """The engine's greedy reply with ``budget``, checked to close its reasoning there."""
    params = SamplingParams(max_tokens=MAX, temperature=0, thinking_token_budget=budget)
    [out] = engine_generate(served.thread, [ASK], params)
    tokenizer = served.thread.call(lambda engine: engine.tokenizer).result(timeout=30)
    [end] = tokenizer.encode("</think>", add_special_tokens=False)
    ids = list(out.token_ids)
    if budget is None:
        assert end not in ids and out.text == ""
    else:
        assert ids.index(end) == budget and out.text
    return out


@pytest.mark.parametrize("budget", [None, 0, 5])
def test_chat_completions(served: Served, budget: int | None) -> None:
    expected = _expected(served, budget)
    client = openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0)
    extra = {} if budget is None else {"thinking_token_budget": budget}
    reply = client.chat.completions.create(
        model=served.thread.info.model_name, messages=ASK, max_tokens=MAX, temperature=0,
        extra_body=extra,
    )  # fmt: skip
    message = reply.choices[0].message
    assert (message.content or "") == expected.text
    assert message.model_extra and message.model_extra["reasoning_content"] == expected.reasoning


def test_a_bad_budget_is_a_400(served: Served) -> None:
    client = openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="thinking_token_budget"):
        client.chat.completions.create(
            model=served.thread.info.model_name, messages=ASK, max_tokens=MAX,
            extra_body={"thinking_token_budget": -1},
        )  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_messages_budget_tokens(served: Served, stream: bool) -> None:
    expected = _expected(served, 4)
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=60)
    fields = dict(
        model=served.thread.info.model_name, messages=ASK, max_tokens=MAX,
        thinking={"type": "enabled", "budget_tokens": 4}, extra_body={"temperature": 0},
    )  # fmt: skip
    if stream:
        with client.messages.stream(**fields) as events:  # type: ignore[arg-type]
            message = events.get_final_message()
    else:
        message = client.messages.create(**fields)  # type: ignore[arg-type]
    thinking = [b.thinking for b in message.content if b.type == "thinking"]
    text = [b.text for b in message.content if b.type == "text"]
    assert thinking == [expected.reasoning] and "".join(text) == expected.text


def test_messages_bad_budget_tokens(served: Served) -> None:
    client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        client.messages.create(
            model=served.thread.info.model_name, messages=ASK, max_tokens=MAX,  # type: ignore[arg-type]
            thinking={"type": "enabled", "budget_tokens": "many"},  # type: ignore[typeddict-item]
        )  # fmt: skip


def test_responses_effort_sets_the_budget(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EFFORT_BUDGETS, "low", 3)  # the table's own budgets outlast MAX
    expected = _expected(served, 3)
    client = openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0)
    response = client.responses.create(
        model=served.thread.info.model_name, input="Why is the sky blue?", max_output_tokens=MAX,
        temperature=0, reasoning={"effort": "low"},
    )  # fmt: skip
    assert response.output_text == expected.text
    # a body's own thinking_token_budget wins over the effort's
    expected = _expected(served, 6)
    response = client.responses.create(
        model=served.thread.info.model_name, input="Why is the sky blue?", max_output_tokens=MAX,
        temperature=0, reasoning={"effort": "low"}, extra_body={"thinking_token_budget": 6},
    )  # fmt: skip
    assert response.output_text == expected.text


def test_responses_stream_reasoning_events(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The streamed Responses events of a reply that reasons: a reasoning item whose
    ``response.reasoning_text.delta`` events join into the engine's reasoning, closed (done
    events) before the message opens, and both items equal to the final response's."""
    monkeypatch.setitem(EFFORT_BUDGETS, "low", 3)
    expected = _expected(served, 3)
    client = openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0)
    events = list(
        client.responses.create(
            model=served.thread.info.model_name,
            input="Why is the sky blue?",
            max_output_tokens=MAX,
            temperature=0,
            reasoning={"effort": "low"},
            stream=True,
        )  # fmt: skip
    )
    kinds = [event.type for event in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
    ]
    assert events[2].item.type == "reasoning" and events[2].output_index == 0
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert expected.reasoning and "".join(deltas) == expected.reasoning
    [done] = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done.text == expected.reasoning
    closed = kinds.index("response.reasoning_text.done")
    assert kinds[closed : closed + 3] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert closed < kinds.index("response.output_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected.text
    final = events[-1].response
    items = [e.item.model_dump() for e in events if e.type == "response.output_item.done"]
    assert [item.model_dump() for item in final.output] == items
    assert final.output[0].content[0].text == expected.reasoning
    assert final.output_text == expected.text
