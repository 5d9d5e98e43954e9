"""A Claude Code session against a real server (a tiny random model with Qwen3's real tokenizer
and chat template): each turn's billing line differs, and with it taken out of the prompt the
prefix cache serves at least 95% of every later turn's prompt, read from the usage the official
clients parse (anthropic's ``cache_read_input_tokens``, openai's
``prompt_tokens_details.cached_tokens`` and ``input_tokens_details.cached_tokens``), through
/v1/messages and as proxies forward it to /v1/chat/completions and /v1/responses. With
``keep_volatile_prompt_lines`` (``--keep-volatile-prompt-lines``) the line stays and each turn
reads only the tokens before its hash from the cache, as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from macbatch.engine import Engine, EngineConfig, EngineThread
from macbatch.server.app import ServerOptions
from tests.support.agent_requests import as_chat, as_responses, claude_code_body
from tests.support.live_server import Served, serving
from tests.support.structured import QWEN3_VOCAB, save_model_with_tokenizer

TURNS = 4
CACHED = 0.95  # of each later turn's prompt


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineThread]:
    """Room for the ~12,000-token prompts: a long context and 64k tokens of KV blocks."""
    path = tmp_path_factory.mktemp("models") / "tiny-qwen3-long"
    save_model_with_tokenizer(path, "qwen3", QWEN3_VOCAB, max_position_embeddings=32768)
    config = EngineConfig(num_blocks=4096, max_num_seqs=4)
    thread = EngineThread(lambda: Engine.load(str(path), config)).start()
    thread.wait_ready(timeout=120)
    yield thread
    thread.shutdown()


@pytest.fixture(scope="module")
def served(engine: EngineThread) -> Iterator[Served]:
    with serving(engine) as server:
        yield server


def _claude(server: Served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=600)


def _oai(server: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=600)


def _messages_turn(client: anthropic.Anthropic, server: Served, turn: int) -> tuple[int, int]:
    """(cached, prompt) tokens of turn ``turn``, streamed as Claude Code streams it; the reply
    is cut to one token (the recorded body asks for 32,000)."""
    body: dict[str, Any] = claude_code_body(turn)
    del body["stream"]
    # this client takes no sampling arguments any more: the API still does
    body.update(model=server.thread.info.model_name, max_tokens=1)
    body["extra_body"] = {"temperature": body.pop("temperature")}
    with client.messages.stream(**body) as stream:
        usage = stream.get_final_message().usage
    cached = usage.cache_read_input_tokens or 0
    counted = client.messages.count_tokens(
        **{k: body[k] for k in ("model", "system", "messages", "tools")}
    )
    assert usage.input_tokens + cached == counted.input_tokens  # Anthropic counts them apart
    return cached, usage.input_tokens + cached


def _fractions(turns: list[tuple[int, int]]) -> list[float]:
    return [round(cached / prompt, 4) for cached, prompt in turns]


def test_claude_code_session_reads_its_prompt_from_the_cache(served: Served) -> None:
    client = _claude(served)
    turns = [_messages_turn(client, served, turn) for turn in range(1, TURNS + 1)]
    assert all(prompt > 10_000 for _, prompt in turns), turns
    fractions = _fractions(turns)
    assert all(f >= CACHED for f in fractions[1:]), fractions
    print("messages, (cached, prompt) tokens per turn:", turns, "fractions:", fractions)


def test_kept_volatile_line_misses_the_cache(engine: EngineThread) -> None:
    with serving(engine, ServerOptions(keep_volatile_prompt_lines=True)) as server:
        client = _claude(server)
        turns = [_messages_turn(client, server, turn) for turn in range(1, TURNS)]
    # the prompts share the chat markup and "x-anthropic-billing-header: cc_version=2.1.100."
    # (about 20 tokens: one 16-token block), then the hash differs
    assert all(cached <= 32 for cached, _ in turns), turns
    print("messages, line kept, cached tokens per turn:", [cached for cached, _ in turns])


def test_proxied_to_chat_completions(served: Served) -> None:
    client = _oai(served)
    turns = []
    for turn in range(1, TURNS):
        ask = "Through a proxy to chat: the lexer drops the column; fix it."
        body = as_chat(claude_code_body(turn, ask), parts=turn % 2 == 0)
        body.update(model=served.thread.info.model_name, max_tokens=1)
        usage = client.chat.completions.create(**body).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        turns.append((usage.prompt_tokens_details.cached_tokens or 0, usage.prompt_tokens))
    fractions = _fractions(turns)
    assert all(f >= CACHED for f in fractions[1:]), fractions
    print("chat completions, cached fraction per turn:", fractions)


def test_proxied_to_responses(served: Served) -> None:
    client = _oai(served)
    turns = []
    for turn in range(1, TURNS):
        ask = "Through a proxy to Responses: the grammar loops on '(('; fix it."
        body = as_responses(claude_code_body(turn, ask))
        body.update(model=served.thread.info.model_name, max_output_tokens=1, store=False)
        usage = client.responses.create(**body).usage
        assert usage is not None
        turns.append((usage.input_tokens_details.cached_tokens, usage.input_tokens))
    fractions = _fractions(turns)
    assert all(f >= CACHED for f in fractions[1:]), fractions
    print("responses, cached fraction per turn:", fractions)


def test_the_switch_reaches_every_route(served: Served, engine: EngineThread) -> None:
    """Each route's prompt loses the line by default and keeps it with the switch (short
    bodies: the prompt tokens each usage reports)."""
    line = claude_code_body(1)["system"][0]["text"]

    def prompts(server: Served) -> list[int]:
        model = server.thread.info.model_name
        ask = [{"role": "user", "content": "hi"}]
        system = [{"type": "text", "text": line}, {"type": "text", "text": "Be brief."}]
        message = _claude(server).messages.create(
            model=model, system=system, messages=ask, max_tokens=1
        )
        chat = _oai(server).chat.completions.create(
            model=model, messages=[{"role": "system", "content": f"{line}\n\nBe brief."}, *ask],
            max_tokens=1,
        )  # fmt: skip
        response = _oai(server).responses.create(
            model=model, instructions=f"{line}\n\nBe brief.", input="hi", max_output_tokens=1,
            store=False,
        )  # fmt: skip
        assert chat.usage is not None and response.usage is not None
        usage = message.usage
        return [
            usage.input_tokens + (usage.cache_read_input_tokens or 0),
            chat.usage.prompt_tokens,
            response.usage.input_tokens,
        ]

    stable = prompts(served)
    with serving(engine, ServerOptions(keep_volatile_prompt_lines=True)) as server:
        kept = prompts(server)
    assert all(k > s + 20 for k, s in zip(kept, stable, strict=True)), (stable, kept)
