"""A hybrid model behind `macbatch serve`, with the official openai client: a conversation's
later turns resume from the prefix cache (recurrent-state checkpoints) and answer what the
engine's own generation answers."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from macbatch.engine import SamplingParams
from tests.support.live_server import engine_generate, serving, start_engine
from tests.support.tiny import save_model


@pytest.fixture(scope="module")
def hybrid_thread(tmp_path_factory: pytest.TempPathFactory):
    path: Path = save_model(tmp_path_factory.mktemp("hybrid") / "qwen3_5", arch="qwen3_5")
    thread = start_engine(path)
    yield thread
    thread.shutdown()


def test_a_conversation_hits_the_cache_and_matches_the_engine(hybrid_thread) -> None:
    messages = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 4}]
    with serving(hybrid_thread) as served:
        client = openai.OpenAI(base_url=served.api, api_key="unused")
        model = client.models.list().data[0].id
        cached = []
        for turn in range(3):
            reply = client.chat.completions.create(
                model=model, messages=messages, max_tokens=12, temperature=0,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
            [oracle] = engine_generate(
                hybrid_thread,
                [messages],
                SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
            )
            assert reply.choices[0].message.content == oracle.text
            details = reply.usage.prompt_tokens_details if reply.usage else None
            cached.append(details.cached_tokens if details else None)
            messages = messages + [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": f"and turn {turn} hello world"},
            ]
    assert cached[0] == 0 and all(c and c > 0 for c in cached[1:]), cached
