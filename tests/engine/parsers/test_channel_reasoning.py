"""Reasoning in channel formats: gpt-oss harmony (the analysis channel is the reasoning, the final
channel the answer) and Gemma 4's multi-token thought channel. The tokenizers are stand-ins
(tests/support/standin.py: the family's special tokens on a small BPE) with minimal templates in
each family's shape; the models are scripted from mlx-lm's own classes (gpt_oss, qwen3), so the
token ids they say are known and the text each part must hold is their decoding."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig, FinishReason, SamplingParams, StructuredOutput
from tests.support.scripted import scripted_model
from tests.support.standin import HARMONY, HARMONY_TURNS, gemma4_tokenizer, harmony_tokenizer
from tests.support.tiny import VOCAB_SIZE

# A stand-in that opens the analysis channel itself (as DeepSeek-R1's template opens <think>).
HARMONY_OPEN = (
    HARMONY_TURNS
    + "{% if add_generation_prompt %}<|start|>assistant<|channel|>analysis<|message|>{% endif %}"
)
CHAT = [{"role": "user", "content": "Which animal?"}]


def _ids(tokenizer, *pieces: str) -> list[int]:
    ids = []
    for piece in pieces:
        [token] = tokenizer.encode(piece, add_special_tokens=False)  # each piece one token
        ids.append(token)
    return ids


def _words(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def _run(engine: Engine, params: SamplingParams):
    """The final output of one chat request, and its streamed reasoning and answer."""
    rid = engine.add_request(CHAT, params)
    reasoning, text, final = [], [], None
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid:
                reasoning.append(out.new_reasoning)
                text.append(out.new_text)
                final = out
    assert final is not None
    return final, "".join(reasoning), "".join(text)


def _engine(arch: str, tokenizer, script: list[int]) -> Engine:
    model = scripted_model(arch, VOCAB_SIZE, script)
    return Engine(model, tokenizer, EngineConfig(num_blocks=64, block_size=8))


def test_harmony_analysis_is_reasoning_and_final_is_the_answer():
    tokenizer = harmony_tokenizer(HARMONY_OPEN)
    thought = _words(tokenizer, " quick brown")
    header = _ids(tokenizer, "<|start|>", "assistant", "<|channel|>", "final", "<|message|>")
    [message] = _ids(tokenizer, "<|message|>")
    # After the header's <|message|> the model says the same words again: its answer.
    engine = _engine(
        "gpt_oss", tokenizer, [message, *thought, *_ids(tokenizer, "<|end|>"), *header]
    )
    final, streamed_reasoning, streamed_text = _run(
        engine, SamplingParams(max_tokens=2 * len(thought) + 1 + len(header), temperature=0)
    )
    words = tokenizer.decode(thought)
    assert final.token_ids == [*thought, *_ids(tokenizer, "<|end|>"), *header, *thought]
    assert (final.reasoning, final.text) == (words, words)
    assert (streamed_reasoning, streamed_text) == (words, words)  # no header shown on the way


def test_harmony_answer_without_analysis_loses_its_header():
    tokenizer = harmony_tokenizer(HARMONY)
    start = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)[-1]
    header = _ids(tokenizer, "<|channel|>", "final", "<|message|>")
    answer = _words(tokenizer, " lazy dog")
    engine = _engine(
        "gpt_oss", tokenizer, [start, *header, *answer, *_ids(tokenizer, "<|return|>")]
    )
    final, streamed_reasoning, streamed_text = _run(
        engine, SamplingParams(max_tokens=20, temperature=0)
    )
    assert final.finish_reason is FinishReason.STOP
    assert final.reasoning is None and streamed_reasoning == ""
    assert final.text == streamed_text == tokenizer.decode(answer)


def test_harmony_constraint_applies_to_the_final_channel_only():
    """The model would write a second analysis message; a constrained request instead writes
    the final channel's header after the first, then an answer its grammar allows."""
    tokenizer = harmony_tokenizer(HARMONY)
    start = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)[-1]
    opening = _ids(tokenizer, "<|channel|>", "analysis", "<|message|>")
    thought = _words(tokenizer, " quick brown")
    end = _ids(tokenizer, "<|end|>")
    again = [*_ids(tokenizer, "<|start|>"), start]  # back to the generation prompt's end
    engine = _engine("gpt_oss", tokenizer, [start, *opening, *thought, *end, *again])
    reasoning_len = len(opening) + len(thought) + len(end)
    reference, _, _ = _run(engine, SamplingParams(max_tokens=reasoning_len + 6, temperature=0))
    assert reference.text.startswith("<|start|>assistant<|channel|>analysis")  # unconstrained

    choice = StructuredOutput(choice=["fox", "dog"])
    final, streamed_reasoning, streamed_text = _run(
        engine, SamplingParams(max_tokens=40, temperature=0, structured=choice)
    )
    header = _ids(tokenizer, "<|start|>", "assistant", "<|channel|>", "final", "<|message|>")
    assert final.token_ids[:reasoning_len] == reference.token_ids[:reasoning_len]  # no mask
    assert final.token_ids[reasoning_len : reasoning_len + len(header)] == header
    assert final.finish_reason is FinishReason.STOP
    assert final.reasoning == streamed_reasoning == tokenizer.decode(thought)
    assert final.text == streamed_text and final.text in ("fox", "dog")


@pytest.mark.parametrize("constrained", [False, True])
def test_gemma4_thought_channel_is_reasoning(constrained):
    """mlx-lm infers Gemma 4's markers from `<|channel>` / `<channel|>` in the vocabulary: the
    start is two tokens (`<|channel>thought`); reasoning and answer split, and a constraint
    waits for `<channel|>`."""
    tokenizer = gemma4_tokenizer()
    assert (tokenizer.think_start, tokenizer.think_end) == ("<|channel>thought", "<channel|>")
    start = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)[-1]
    opening = _ids(tokenizer, "<|channel>", "thought")
    thought = _words(tokenizer, " quick brown")
    answer = _words(tokenizer, " lazy dog")
    reasoning = [*opening, *thought, *_ids(tokenizer, "<channel|>")]
    engine = _engine("qwen3", tokenizer, [start, *reasoning, *answer, *_ids(tokenizer, "<eos>")])
    structured = StructuredOutput(choice=["fox", "cat"]) if constrained else None
    final, streamed_reasoning, streamed_text = _run(
        engine, SamplingParams(max_tokens=20, temperature=0, structured=structured)
    )
    assert final.finish_reason is FinishReason.STOP
    assert final.token_ids[: len(reasoning)] == reasoning  # never masked while thinking
    assert final.reasoning == streamed_reasoning == tokenizer.decode(thought)
    want = ("fox", "cat") if constrained else (tokenizer.decode(answer),)
    assert final.text == streamed_text and final.text in want
