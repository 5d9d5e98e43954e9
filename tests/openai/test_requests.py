"""Request bodies -> engine work, without a front end: defaults, OpenAI field quirks, refusals."""

from __future__ import annotations

import pytest

from macbatch.engine import SamplingParams
from macbatch.openai import MAX_CHOICES, Generation, InvalidRequest, parse_chat, parse_completion

HI = [{"role": "user", "content": "hi"}]


def jobs(generation: Generation) -> list[tuple[object, SamplingParams]]:
    """(prompt, params) of every engine request, for a body without tools."""
    return [(p.prompt, params) for p, params in generation.bind(None, None).requests]


def test_chat_defaults_follow_openai() -> None:
    generation = parse_chat({"model": "m", "messages": HI})
    [(prompt, params)] = jobs(generation)
    assert prompt == HI
    assert (params.temperature, params.top_p, params.max_tokens) == (1.0, 1.0, None)
    assert (generation.stream, generation.include_usage, generation.top_logprobs) == (
        False,
        False,
        None,
    )
    assert jobs(parse_completion({"prompt": "x"}))[0][1].max_tokens == 16


def test_nulls_mean_absent_and_aliases() -> None:
    generation = parse_chat(
        {
            "messages": HI,
            "temperature": None,
            "stop": None,
            "max_tokens": 5,
            "max_completion_tokens": 9,
            "top_k": -1,
        }
    )
    params = jobs(generation)[0][1]
    assert (params.temperature, params.stop, params.max_tokens, params.top_k) == (1.0, (), 9, 0)


def test_message_content_parts_and_developer_role() -> None:
    messages = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ]
    prompt = jobs(parse_chat({"messages": messages}))[0][0]
    assert prompt == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": ""},
    ]


def test_n_seeds_and_prompt_order() -> None:
    generation = parse_completion({"prompt": ["a", "b"], "n": 3, "seed": 5, "stop": "x"})
    assert [p for p, _ in jobs(generation)] == ["a"] * 3 + ["b"] * 3
    assert [s.seed for _, s in jobs(generation)] == [5, 6, 7] * 2
    assert all(s.stop == ("x",) for _, s in jobs(generation))
    unseeded = parse_completion({"prompt": "a", "n": 2})
    assert [s.seed for _, s in jobs(unseeded)] == [None, None]


def test_prompt_shapes() -> None:
    assert jobs(parse_completion({"prompt": [1, 2, 3]}))[0][0] == [1, 2, 3]
    assert [p for p, _ in jobs(parse_completion({"prompt": [[1], [2, 3]]}))] == [[1], [2, 3]]


def test_stream_options_and_logprobs() -> None:
    streamed = parse_chat(
        {
            "messages": HI,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
            "top_logprobs": 4,
        }
    )
    assert (streamed.include_usage, streamed.top_logprobs) == (True, 4)
    assert jobs(streamed)[0][1].logprobs == 4
    assert not parse_chat({"messages": HI, "stream_options": {"include_usage": True}}).include_usage
    assert parse_completion({"prompt": "a", "logprobs": 0}).top_logprobs == 0


@pytest.mark.parametrize(
    ("parse", "body", "param"),
    [
        (parse_completion, {"prompt": "a", "echo": True}, "echo"),
        (parse_completion, {"prompt": "a", "best_of": 3}, "best_of"),
        (parse_completion, {"prompt": "a", "suffix": "z"}, "suffix"),
        (parse_completion, {"prompt": []}, "prompt"),
        (parse_completion, {"prompt": [1, "a"]}, "prompt"),
        (parse_completion, {"prompt": ["a", "b"], "n": MAX_CHOICES}, "n"),
        (parse_completion, {"prompt": "a", "seed": 1.5}, "seed"),
        (parse_completion, {"prompt": "a", "stop": ["x"] * 17}, "stop"),
        (parse_completion, {"prompt": "a", "stream": "yes"}, "stream"),
        (parse_chat, {"messages": HI, "response_format": {"type": "xml"}}, "response_format"),
        (
            parse_chat,
            {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {}}},
            "response_format",
        ),
        (parse_chat, {"messages": HI, "guided_choice": []}, "guided_choice"),
        (
            parse_chat,
            {"messages": HI, "guided_regex": "a", "guided_choice": ["a"]},
            "guided_choice",
        ),
        (parse_chat, {"messages": HI, "tools": [{"function": {}}]}, "tools"),
        (parse_chat, {"messages": HI, "tool_choice": "required"}, "tool_choice"),
        (parse_chat, {"messages": HI, "logit_bias": {"1": 5}}, "logit_bias"),
        (parse_chat, {"messages": HI, "stream_options": 3}, "stream_options"),
        (parse_chat, {"messages": "hi"}, "messages"),
        (parse_chat, {"messages": [{"role": "user", "content": 3}]}, "messages[0]"),
        (parse_chat, {"messages": HI, "model": 7}, "model"),
    ],
)
def test_refusals_name_the_field(parse, body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(body)
    assert info.value.param == param
    assert param.split("[")[0] in str(info.value)


def test_sampling_range_errors_come_from_the_engine_with_the_name() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat({"messages": HI, "top_p": 0})
    assert "top_p" in str(info.value)


@pytest.mark.parametrize("temperature", [2.5, 3, -0.1])
def test_temperature_beyond_two_is_refused_with_the_engines_message(temperature: float) -> None:
    """One rule, owned by SamplingParams: serve, run and chat give the same message."""
    from macbatch.engine import InvalidSamplingParam, SamplingParams

    with pytest.raises(InvalidSamplingParam) as engine_error:
        SamplingParams(temperature=temperature)
    with pytest.raises(InvalidRequest) as info:
        parse_chat({"messages": HI, "temperature": temperature})
    assert info.value.param == "temperature"
    assert str(info.value) == str(engine_error.value)
    assert "must be a number in [0, 2] (0 means greedy)" in str(info.value)


def test_chat_template_kwargs_and_reasoning_effort() -> None:
    generation = parse_chat(
        {
            "messages": HI,
            "chat_template_kwargs": {"enable_thinking": False},
            "reasoning_effort": "low",
        }
    )
    assert generation.chat_template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    assert parse_chat({"messages": HI}).chat_template_kwargs is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"reasoning_effort": 3}, "reasoning_effort"),
    ],
)
def test_bad_template_arguments_are_400s(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat({"messages": HI, **body})
    assert info.value.param == param


def test_an_audio_part_gets_a_clear_error() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, audio]}]
    with pytest.raises(InvalidRequest) as info:
        parse_chat({"messages": messages})
    assert info.value.param == "messages[0].content[1]"
    assert "'input_audio' parts are not supported" in str(info.value)
