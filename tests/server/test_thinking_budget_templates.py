"""A thinking budget with a ``response_format`` through serve and the ``openai`` client, on the
real chat templates of Qwen3.5 and gpt-oss (tiny random models that reason and never stop by
themselves: tests/support/real_templates.py), sampled at temperature 1: the reply's content
validates against the schema (``jsonschema``), and reasoning and content are the engine's own
generation with the same seed, whose reasoning closes within the budget (counted in tokens)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from macbatch.engine import RequestOutput, SamplingParams, StructuredOutput
from tests.support.live_server import Served, engine_generate, serving, start_engine
from tests.support.real_templates import save_gpt_oss, save_with_template
from tests.support.structured import SKY_SCHEMA as SCHEMA

ASK = [{"role": "user", "content": "Why is the sky blue?"}]
END = {"qwen3_5": "</think>", "gpt_oss": "<|end|>"}  # each template's end of the reasoning


@pytest.fixture(scope="module", params=["qwen3_5", "gpt_oss"])
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def served(family: str, tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("models") / family
    if family == "gpt_oss":
        save_gpt_oss(path, reasons=True)
    else:
        save_with_template(path, family)
    thread = start_engine(path)
    with serving(thread) as server:
        yield server
    thread.shutdown()


def _expected(served: Served, family: str, budget: int, seed: int) -> tuple[int, RequestOutput]:
    """The engine's own reply, and its reasoning's length in tokens: output ids up to the
    template's end marker, less the analysis channel's opening where the model writes one."""
    structured = StructuredOutput(json_schema=SCHEMA)
    params = SamplingParams(max_tokens=budget + 120, temperature=1.0, seed=seed,
                            thinking_token_budget=budget, structured=structured)  # fmt: skip
    [out] = engine_generate(served.thread, [ASK], params)
    tokenizer = served.thread.call(lambda engine: engine.tokenizer).result(timeout=30)
    [end] = tokenizer.encode(END[family], add_special_tokens=False)
    opening = tokenizer.encode("<|channel|>analysis<|message|>", add_special_tokens=False)
    ids = list(out.token_ids)
    skip = len(opening) if ids[: len(opening)] == opening else 0
    return ids.index(end) - skip, out


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("budget", [0, 5])
def test_a_budgeted_json_answer(served: Served, family: str, budget: int, seed: int) -> None:
    count, expected = _expected(served, family, budget, seed)
    assert count <= budget
    client = openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model=served.thread.info.model_name, messages=ASK, max_tokens=budget + 120,
        temperature=1.0, seed=seed, extra_body={"thinking_token_budget": budget},
        response_format={"type": "json_schema",
                         "json_schema": {"name": "sky", "schema": SCHEMA}},
    )  # fmt: skip
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(message.content or ""), SCHEMA)
    assert message.content == expected.text
    assert message.model_extra and message.model_extra["reasoning_content"] == expected.reasoning
