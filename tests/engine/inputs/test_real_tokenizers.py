"""Prompts through the real Qwen3 and Mistral v0.3 tokenizers: chat templates with their
arguments, and the BOS rule for text prompts (mlx-lm's own encoding is the oracle)."""

from __future__ import annotations

import mlx_lm
import pytest

from macbatch.engine import Engine, EngineConfig, PromptInput, SamplingParams, thinking_default
from macbatch.engine.inputs.chat_template import has_thinking_switch, render_chat
from tests.support.real_tokenizers import generation_eos_ids, load_real_tokenizer, model_for

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nwho?\n</think>\n\nHello!"},
    {"role": "user", "content": "Café? 你好 🙂"},
]
# Qwen3's ChatML: earlier turns lose their reasoning; the assistant's turn opens at the end.
QWEN3_TEXT = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nCafé? 你好 🙂<|im_end|>\n"
    "<|im_start|>assistant\n"
)
NO_THINKING = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3() -> Engine:
    return Engine(model_for("qwen3"), load_real_tokenizer("qwen3"), EngineConfig(num_blocks=16))


@pytest.fixture(scope="module")
def mistral() -> Engine:
    return Engine(model_for("mistral"), load_real_tokenizer("mistral"), EngineConfig(num_blocks=16))


@pytest.mark.parametrize(
    "kwargs,suffix",
    [(None, ""), ({"enable_thinking": True}, ""), ({"enable_thinking": False}, NO_THINKING)],
)
def test_qwen3_template_thinking_on_and_off(qwen3, kwargs, suffix):
    ids = qwen3.encode_prompt(CONVERSATION, chat_template_kwargs=kwargs)
    tokenizer = qwen3.tokenizer
    assert ids == tokenizer.encode(QWEN3_TEXT + suffix, add_special_tokens=False)
    assert tokenizer.decode(ids) == QWEN3_TEXT + suffix
    assert has_thinking_switch(tokenizer)
    assert thinking_default(tokenizer) is True  # Qwen3 thinks unless told not to


def test_template_kwargs_reach_add_request_and_generate(qwen3):
    params = SamplingParams(max_tokens=1, temperature=0)
    off = {"enable_thinking": False}
    expected = qwen3.encode_prompt(CONVERSATION, off)
    assert len(expected) > len(qwen3.encode_prompt(CONVERSATION))
    [out] = qwen3.generate([PromptInput(CONVERSATION, off)], params)
    assert out.metrics.prompt_tokens == len(expected)
    rid = qwen3.add_request(PromptInput(CONVERSATION, off), params)
    assert qwen3._requests[rid].prompt_token_ids == expected
    qwen3.abort(rid)
    qwen3.step()


def test_template_default_holds_where_mlx_lm_forces_thinking(qwen3, monkeypatch):
    """A Gemma 4-like template thinks only when told to. mlx-lm's TokenizerWrapper passes
    enable_thinking=True to every tokenizer with thinking tokens (Qwen3's has them); the engine
    passes nothing, so the template's own default (no thinking) holds."""
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}<|im_start|>assistant\n{% if enable_thinking %}<think>\n{% endif %}"
    )
    tokenizer = qwen3.tokenizer
    monkeypatch.setattr(tokenizer._tokenizer, "chat_template", template)
    question = [{"role": "user", "content": "Hi"}]
    base = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    forced = tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    assert forced == base + "<think>\n"  # what mlx-lm's wrapper renders
    assert thinking_default(tokenizer) is False
    assert qwen3.encode_prompt(question) == tokenizer.encode(base, add_special_tokens=False)
    on = qwen3.encode_prompt(question, {"enable_thinking": True})
    assert on == tokenizer.encode(base + "<think>\n", add_special_tokens=False)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ([("enable_thinking", False)], "must be a mapping"),
        ({"add_generation_prompt": False}, "argument of apply_chat_template that macbatch decides"),
        ({"not a name": 1}, "not a template variable name"),
    ],
)
def test_bad_template_kwargs_are_refused(qwen3, kwargs, message):
    with pytest.raises(ValueError, match=message):
        qwen3.encode_prompt(CONVERSATION, chat_template_kwargs=kwargs)


def test_mistral_template_errors_are_value_errors(mistral):
    assert thinking_default(mistral.tokenizer) is None  # no switch to show
    with pytest.raises(ValueError, match="chat template refused"):
        mistral.encode_prompt([{"role": "assistant", "content": "first"}])


def test_templated_string_prompt_gets_one_bos(mistral):
    """A prompt already rendered by the template (starting with <s>) is not given a second BOS,
    and the engine's greedy ids equal mlx-lm's generate on the same string."""
    messages = CONVERSATION[:2]
    text = render_chat(mistral.tokenizer, messages)
    bos = mistral.tokenizer.bos_token_id
    assert text.startswith(mistral.tokenizer.bos_token)
    ids = mistral.encode_prompt(text)
    assert ids == mistral.encode_prompt(messages)
    assert ids.count(bos) == 1
    plain = mistral.encode_prompt("Hello")
    assert plain[0] == bos and plain.count(bos) == 1
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    [out] = mistral.generate([text], params)
    expected = [
        r.token
        for r in mlx_lm.stream_generate(mistral.runner.adapter.model, mistral.tokenizer, text, 4)
    ]
    assert out.metrics.prompt_tokens == len(ids)
    assert out.token_ids == expected


def test_every_eos_id_of_generation_config_stops(qwen3):
    """Both of Qwen3's EOS ids end a reply (a stop id is the engine's own EOS set)."""
    eos = generation_eos_ids("qwen3")
    assert len(eos) == 2
    for eos_id in eos:
        request = qwen3.prepare_request([1, 2, 3], SamplingParams(max_tokens=4), None)
        assert eos_id in request.eos_token_ids
