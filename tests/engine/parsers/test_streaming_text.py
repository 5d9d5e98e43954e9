"""Streaming text through the real Qwen3 and Mistral v0.3 tokenizers: accents, CJK and emoji
split across byte tokens, stop strings across token boundaries, every EOS id of
generation_config.json. A scripted model says known text, so the tokenizer is what is tested:
joined deltas == final text == tokenizer.decode(ids)."""

from __future__ import annotations

from functools import cache

import pytest

from macbatch.engine import Engine, EngineConfig, FinishReason, SamplingParams
from tests.support.real_tokenizers import generation_eos_ids, load_real_tokenizer
from tests.support.scripted import scripted_model

TEXT = "Crème brûlée: 東京🦩 ok"  # 東 and 🦩 are several byte tokens in both vocabularies
VOCAB = {"qwen3": ("qwen3", 151936), "mistral": ("llama", 32768)}
CASES = [(name, eos) for name in VOCAB for eos in generation_eos_ids(name)]


@cache  # one engine per script, reused: each test's request finishes and frees its blocks
def _engine(name: str, eos: int) -> tuple[Engine, list[int], list[int]]:
    """An engine whose model answers the prompt with TEXT, then ``eos``."""
    tokenizer = load_real_tokenizer(name)
    prompt = tokenizer.encode("Say it")
    text_ids = tokenizer.encode(TEXT, add_special_tokens=False)
    arch, vocab = VOCAB[name]
    model = scripted_model(arch, vocab, [prompt[-1], *text_ids, eos])
    return Engine(model, tokenizer, EngineConfig(num_blocks=8)), prompt, text_ids


def _stream(engine: Engine, prompt: list[int], params: SamplingParams):
    rid = engine.add_request(prompt, params)
    deltas, final = [], None
    while final is None:
        for out in engine.step():
            assert out.request_id == rid
            deltas.append(out.new_text)
            final = out if out.finished else None
    return "".join(deltas), final


@pytest.mark.parametrize("name,eos", CASES)
def test_deltas_join_to_the_decoded_text_and_every_eos_stops(name, eos):
    engine, prompt, text_ids = _engine(name, eos)
    joined, out = _stream(engine, prompt, SamplingParams(max_tokens=64, temperature=0))
    assert out.token_ids == text_ids
    assert out.finish_reason is FinishReason.STOP  # the EOS id ended it, not the length
    assert joined == out.text == engine.tokenizer.decode(text_ids)
    assert TEXT in out.text  # SentencePiece may keep a leading space; nothing else changes


@pytest.mark.parametrize("name", VOCAB)
@pytest.mark.parametrize("stop", ["東京🦩", "ée: 東", "🦩 o"])
def test_stop_strings_across_token_boundaries(name, stop):
    engine, prompt, _ = _engine(name, generation_eos_ids(name)[0])
    params = SamplingParams(max_tokens=64, temperature=0, stop=[stop])
    joined, out = _stream(engine, prompt, params)
    full = engine.tokenizer.decode(engine.tokenizer.encode(TEXT, add_special_tokens=False))
    assert out.finish_reason is FinishReason.STOP
    assert joined == out.text == full[: full.index(stop)]


def test_reasoning_and_answer_are_split_whenever_the_outputs_are_read():
    """A thinking turn through the pipelined step: outputs read only after the request ended, in
    reverse order, split reasoning from answer as each was when made (its deltas join up)."""
    tokenizer = load_real_tokenizer("qwen3")
    chat = [{"role": "user", "content": "Say it"}]
    reply = tokenizer.encode("<think>hmm 東京🦩</think>yes", add_special_tokens=False)
    eos = generation_eos_ids("qwen3")[0]
    prompt_end = tokenizer.apply_chat_template(chat, add_generation_prompt=True)[-1]
    model = scripted_model("qwen3", VOCAB["qwen3"][1], [prompt_end, *reply, eos])
    engine = Engine(model, tokenizer, EngineConfig(num_blocks=8, pipelined=True))
    engine.add_request(chat, SamplingParams(max_tokens=64, temperature=0))
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert outputs[-1].token_ids == reply
    end_marker = reply.index(tokenizer.convert_tokens_to_ids("</think>"))
    thought, answer = (
        tokenizer.decode(reply[1:end_marker]),
        tokenizer.decode(reply[end_marker + 1 :]),
    )
    assert (thought, answer) == ("hmm 東京🦩", "yes")
    for out in reversed(outputs):
        if len(out.token_ids) <= end_marker:  # still thinking: no answer yet
            assert thought.startswith(out.reasoning) and out.text == ""
        else:
            assert out.reasoning == thought and answer.startswith(out.text)
    assert "".join(o.new_reasoning for o in outputs) == thought
    assert "".join(o.new_text for o in outputs) == outputs[-1].text == answer
