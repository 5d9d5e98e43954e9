"""/v1/responses through the official openai client against a real server: text equals the
engine's own greedy generation for the same conversation, streamed events reassemble into the
whole response, and previous_response_id continues a stored conversation, on a new server over
the same data directory too."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from macbatch.engine import EngineThread, FinishReason, SamplingParams
from macbatch.server.app import ServerOptions, stop_batches
from tests.support.live_server import Served, engine_generate, serving

GREEDY = SamplingParams(max_tokens=12, temperature=0)
SYSTEM = "Be brief."
ASK = "hello world"


@pytest.fixture
def client(served: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0, timeout=60)


def _model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_response_matches_engine(client: openai.OpenAI, served: Served) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]
    [expected] = engine_generate(served.thread, [messages], GREEDY)
    response = client.responses.create(
        model=_model(client), instructions=SYSTEM, input=ASK, max_output_tokens=12, temperature=0
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == expected.text
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert expected.finish_reason is FinishReason.LENGTH
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == expected.metrics.prompt_tokens
    assert response.usage.output_tokens == len(expected.token_ids)
    assert response.instructions == SYSTEM and response.max_output_tokens == 12
    # Every field the client's own model requires is there (its lenient parse fills gaps).
    strict = openai.types.responses.Response.model_validate(response.model_dump(exclude_unset=True))
    assert strict.usage is not None and strict.usage.input_tokens_details.cache_write_tokens == 0


def test_stream_events_reassemble_into_the_response(client: openai.OpenAI, served: Served) -> None:
    [expected] = engine_generate(served.thread, [[{"role": "user", "content": ASK}]], GREEDY)
    events = list(
        client.responses.create(
            model=_model(client), input=ASK, max_output_tokens=12, temperature=0, stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected.text
    final = events[-1].response
    assert final.output_text == expected.text
    assert final.output[0].model_dump() == events[-2].item.model_dump()
    assert final.id == events[0].response.id


def test_stream_helper(client: openai.OpenAI, served: Served) -> None:
    """The client's own accumulator (responses.stream) agrees with the whole response."""
    body = dict(model=_model(client), input="the quick brown fox", max_output_tokens=8)
    whole = client.responses.create(**body, temperature=0)
    with client.responses.stream(**body, temperature=0) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
    assert "".join(texts) == whole.output_text


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    model = _model(client)
    first = client.responses.create(
        model=model, instructions=SYSTEM, input=ASK, max_output_tokens=6, temperature=0
    )
    follow = client.responses.create(
        model=model, previous_response_id=first.id, input="and then?", max_output_tokens=6,
        temperature=0,
    )  # fmt: skip
    whole = client.responses.create(
        model=model,
        input=[
            {"role": "user", "content": ASK},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": [{"type": "input_text", "text": "and then?"}]},
        ],
        max_output_tokens=6,
        temperature=0,
    )
    # instructions are not inherited (OpenAI's rule), so both prompts are the same tokens
    assert follow.usage.input_tokens == whole.usage.input_tokens
    assert follow.output_text == whole.output_text
    assert follow.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model, previous_response_id=first.id, input="x")


def test_store_false_keeps_nothing(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=_model(client), input=ASK, max_output_tokens=2, store=False
    )
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"max_output_tokens": "many"}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "schema": {"type": 5}}}}, "text.format"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    client: openai.OpenAI, fields: dict, param: str
) -> None:
    body = {"input": ASK, "max_output_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        client.post("/responses", body=body, cast_to=object)
    assert info.value.body["param"] == param, info.value.body
    assert client.responses.create(model=_model(client), input=ASK, max_output_tokens=1).output


def test_stored_responses_survive_a_restart(engine_thread: EngineThread, tmp_path: Path) -> None:
    """A server on the same data directory continues a stored conversation."""
    options = ServerOptions(data_dir=tmp_path)
    model = engine_thread.info.model_name
    body = dict(model=model, input="hello", max_output_tokens=4, temperature=0)
    with serving(engine_thread, options) as first:
        client = openai.OpenAI(base_url=first.api, api_key="unused", max_retries=0)
        stored = client.responses.create(**body)  # type: ignore[call-overload]
        stop_batches(first.app)
    with serving(engine_thread, options) as second:
        client = openai.OpenAI(base_url=second.api, api_key="unused", max_retries=0)
        assert client.responses.retrieve(stored.id).output_text == stored.output_text
        follow = client.responses.create(
            model=model, input="and?", previous_response_id=stored.id, max_output_tokens=2
        )
        assert follow.previous_response_id == stored.id
        client.responses.delete(stored.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(stored.id)
        stop_batches(second.app)
    assert not list((tmp_path / "responses").glob(f"{stored.id}*"))
