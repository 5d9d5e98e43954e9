"""Every field of every endpoint's body, given extreme values (issue 46): numbers past 64 bits,
past Python's 4,300 digits, NaN and infinities, lone surrogates. The fields are the ones each
parser reads (``fields.fields_read``), so a new field is fuzzed without editing this file. Each
body goes through the real app: never a 5xx, no admission slot kept, the engine thread alive;
after each field a normal request is served."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.testclient import TestClient

from macbatch.openai import SAMPLING_FIELDS, parse_chat, parse_completion
from macbatch.openai.anthropic_api import parse_messages
from macbatch.openai.embeddings import parse_embeddings
from macbatch.openai.rerank import parse_rerank, parse_score
from macbatch.openai.responses_api import parse_responses
from tests.support.body_fields import FieldPath, fields_read, with_raw_value

HELLO = [{"role": "user", "content": "hi"}]
TEXT = {"type": "text"}
# route -> (its parser, a valid body holding the nested objects whose fields are fuzzed too)
ENDPOINTS: dict[str, tuple[Callable[[Any], Any], dict[str, Any]]] = {
    "/v1/chat/completions": (
        parse_chat,
        {"messages": HELLO, "max_tokens": 2, "stream_options": {"include_usage": True}},
    ),
    "/v1/completions": (parse_completion, {"prompt": "hi", "max_tokens": 2}),
    "/v1/responses": (
        parse_responses,
        {"input": "hi", "max_output_tokens": 2, "reasoning": {}, "text": {"format": TEXT}},
    ),
    "/v1/messages": (
        parse_messages,
        {"messages": HELLO, "max_tokens": 2, "thinking": {"type": "enabled", "budget_tokens": 2}},
    ),
    "/v1/messages/count_tokens": (
        lambda body: parse_messages(body, count_only=True),
        {"messages": HELLO},
    ),
    "/v1/embeddings": (parse_embeddings, {"input": "hi"}),
    "/v1/rerank": (parse_rerank, {"query": "q", "documents": ["a", "b"]}),
    "/v1/score": (parse_score, {"text_1": "a", "text_2": ["b", "c"]}),
}
# The normal request served after each field: the route's own valid body, but the tiny model is
# no reranker (a valid /v1/rerank body is a 400 saying so), so there the same pairs as scores.
NORMAL = {"/v1/rerank": ("/v1/score", {"text_1": "q", "text_2": ["a", "b"]})}
# JSON text Python's json module reads (the app must refuse or honour each, never fail on it)
EXTREMES = [
    str(2**64),
    str(-(2**63) - 1),
    "9" * 5_000,  # past the digits Python converts
    "1e400",  # past a float
    "NaN",
    "-1",
    str(2**31),
    '"\\ud800"',
    '""',
    "[" + str(2**64) + "]",
    '["\\ud800"]',
    '{"\\ud800": 1}',
]
# more numbers and text, drawn (one per field on top of EXTREMES)
DRAWN = st.one_of(
    st.integers(-(2**80), 2**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),
    st.text(st.characters(categories=["L", "N", "Cs"]), max_size=6).map(json.dumps),
)
CASES = [
    pytest.param(route, path, id=f"{route}:{'.'.join(map(str, path))}")
    for route, (parse, body) in ENDPOINTS.items()
    for path in fields_read(parse, body)
]


def test_the_fields_found_include_every_sampling_field() -> None:
    """The recording parse finds what the tables say (so it would find a new field too)."""
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        found = {path[0] for path in fields_read(*ENDPOINTS[route]) if len(path) == 1}
        assert set(SAMPLING_FIELDS) <= found, route
    messages = {path for path in fields_read(*ENDPOINTS["/v1/messages"])}
    assert {("top_k",), ("thinking", "budget_tokens"), ("messages", 0, "content")} <= messages


def _settings(function: Callable[..., None]) -> Callable[..., None]:
    for raw in EXTREMES:
        function = example(raw=raw)(function)
    return settings(
        max_examples=1,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )(function)


@pytest.mark.parametrize(("route", "path"), CASES)
def test_an_extreme_value_in_any_field_is_never_a_5xx(
    fuzz_client: TestClient, fuzz_app: Starlette, route: str, path: FieldPath
) -> None:
    body = ENDPOINTS[route][1]
    state = fuzz_app.state.macbatch

    @_settings
    @given(raw=DRAWN)
    def one_value(raw: str) -> None:
        response = fuzz_client.post(route, content=with_raw_value(body, path, raw))
        assert response.status_code < 500, (raw[:80], response.text[:500])
        assert state.admission.pending == 0
        assert state.thread.alive, state.thread.error

    one_value()
    normal_route, normal_body = NORMAL.get(route, (route, body))
    normal = fuzz_client.post(normal_route, json=normal_body)
    assert normal.status_code == 200, normal.text[:500]
