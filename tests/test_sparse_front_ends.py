"""The sparse-attention families through the front ends (issue 59's "done when"): DeepSeek V3.2
``deepseek_v32`` and GLM-5 ``glm_moe_dsa`` (mlx-lm), DeepSeek V4 ``deepseek_v41`` (mlx-lm) and
``deepseek_v4`` (mlx-vlm), and Hunyuan V4 ``hy_v4``, Qwen4-exp ``qwen4_exp`` and GLM5-next
``glm5_next`` (mlx-vlm), each a tiny
random checkpoint in its Hugging Face layout with the tiny byte-level tokenizer and its ChatML
template, on the front ends' own engine settings (speculative "auto", prompt lookup here; the
disk tier on). ``macbatch serve`` (one child process of all seven) answers concurrent chat
completions through the official openai client, ``macbatch run`` writes a three-row job, and
``macbatch chat`` (Textual's pilot) replies to two turns; every reply is the library's own
greedy generation of the same templated prompt, whose context is longer than each family's
selection (the same weights attending to every position answer otherwise: docs/engine.md,
"Through the front ends")."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import openai
import pytest

from macbatch.commands.options import EngineKnobs
from macbatch.engine import EngineConfig, EngineThread
from macbatch.engine.model.families import Library, family
from macbatch.session_settings import SessionSettings
from tests.support.chat_app import send, wait_for
from tests.support.job_files import read_jsonl, write_job
from tests.support.serve_process import start_server
from tests.support.tiny import save_model
from tests.support.tiny_glm5_next import save_glm5_next
from tests.support.tiny_hy_v4 import partition_per_call, save_hy_v4
from tests.support.tiny_qwen4_exp import save_qwen4_exp

pytest.importorskip("mlx_vlm")  # an optional dependency (vision), which three families need


def _save_v41(path: Path) -> Path:
    from tests.support.deepseek_v4 import save_v41  # it imports mlx-vlm, so after the skip

    return save_v41(path)


def _save_v4(path: Path) -> Path:
    from tests.support.tiny_deepseek_v4 import save_deepseek_v4

    return save_deepseek_v4(path)


MAX_TOKENS = 8
# user messages whose templated prompts (39 to 53 tokens) pass every family's selection: a
# top-12 (DSA, Hunyuan V4), 3 blocks of 4 and the tail (Qwen4-exp), 2 pools of 4 and the tail
# (GLM5-next), a window of 8 and a top-3 (DeepSeek V4)
MESSAGES = [
    "the quick brown fox jumps over the lazy dog, hello world",
    "Summarize the following article in one sentence. MLX runs on Apple silicon; macbatch "
    "batches many prompts at once.",
    "hello world, how are you today? I am fine, thank you. 0123456789 + - * / = ( )",
]
SAVERS: dict[str, Callable[[Path], Path]] = {
    "deepseek_v32": lambda path: save_model(path, arch="deepseek_v32"),
    "glm_moe_dsa": lambda path: save_model(path, arch="glm_moe_dsa"),
    "deepseek_v41": _save_v41,
    "deepseek_v4": _save_v4,
    "hy_v4": save_hy_v4,
    "qwen4_exp": save_qwen4_exp,
    "glm5_next": save_glm5_next,
}
FAMILIES = list(SAVERS)


def _reference_greedy(model: Any, ids: list[int], max_tokens: int) -> list[tuple[int, float]]:
    """DeepSeek V4's oracle: its reference's greedy tokens and log-probabilities, each from
    mlx-vlm's forward of the whole sequence in one call (mlx-vlm's own generation pools zeros in
    place of the previous group at every call's start, which the reference does not:
    tests/support/tiny_deepseek_v4.py)."""
    from tests.support.tiny_deepseek_v4 import reference_logprobs

    tokens, steps = list(ids), []
    for _ in range(max_tokens):
        last = reference_logprobs(model, tokens)[-1]
        token = int(last.argmax())
        steps.append((token, float(last[token])))
        tokens.append(token)
    return steps


@pytest.fixture(scope="module", autouse=True)
def _hy_v4_partition_per_call() -> Iterator[None]:
    """mlx-vlm's Hunyuan V4 oracle with its top-k partition evaluated per call (its compiled one
    keeps the first call's key count: ``tests/support/tiny_hy_v4.py``)."""
    with partition_per_call():
        yield


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's tiny checkpoint, in a folder named after it, saved once for the module."""
    root = tmp_path_factory.mktemp("sparse")
    return {arch: save(root / arch) for arch, save in SAVERS.items()}


@pytest.fixture(scope="module")
def served(checkpoints: dict[str, Path]) -> Iterator[tuple[str, dict[str, str]]]:
    """One ``macbatch serve`` of every family (the first ``--model``, the others from
    ``--models-dir``, each loaded when first asked for): its URL and each family's model id."""
    first, *_ = checkpoints.values()
    process, url = start_server(first, "--models-dir", str(first.parent))
    try:
        yield url, {arch: arch for arch in checkpoints} | {FAMILIES[0]: str(first)}
    finally:
        process.terminate()
        process.wait(timeout=60)
        if process.stderr is not None:
            process.stderr.close()


@dataclass(frozen=True)
class Reply:
    """The library's greedy reply to one templated chat: its tokens (to the first EOS) and text."""

    token_ids: list[int]
    logprobs: list[float]
    pieces: list[str]  # each token decoded alone, as the logprobs of a response name it
    text: str


def model_type(path: Path) -> str:
    return json.loads((path / "config.json").read_text())["model_type"]


@cache
def _library(path: Path) -> tuple[Any, Any, Library]:
    """The library's own model of the checkpoint, mlx-lm's tokenizer of its files, and which
    library it is."""
    from mlx_lm.utils import load_tokenizer

    library = family(model_type(path)).library
    if library is Library.MLX_VLM:
        from mlx_vlm.utils import load_model

        return load_model(path), load_tokenizer(path), library
    from mlx_lm import load

    return *load(str(path)), library


@cache
def library_reply(path: Path, *turns: str) -> Reply:
    """The oracle: the library's greedy generation (mlx-lm's ``generate_step``, or mlx-vlm's)
    of the chat of ``turns`` (the user's, the assistant's, by turns) as the checkpoint's template
    renders it, cut at its first EOS, and the text its streaming detokenizer makes of them."""
    from tests.support.oracle import mlx_lm_greedy_logprobs
    from tests.support.vlm_oracle import mlx_vlm_text_greedy

    model, tokenizer, library = _library(path)
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": turn} for i, turn in enumerate(turns)]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    greedy = mlx_vlm_text_greedy if library is Library.MLX_VLM else mlx_lm_greedy_logprobs
    reference = model_type(path) == "deepseek_v4"
    steps = (_reference_greedy if reference else greedy)(model, ids, MAX_TOKENS)
    ends = [i for i, (token, _) in enumerate(steps) if token in tokenizer.eos_token_ids]
    steps = steps[: ends[0]] if ends else steps
    tokens = [token for token, _ in steps]
    detokenizer = tokenizer.detokenizer  # the text mlx-lm's and mlx-vlm's generate stream
    detokenizer.reset()
    for token in tokens:
        detokenizer.add_token(token)
    detokenizer.finalize()
    pieces = [tokenizer.decode([token]) for token in tokens]
    return Reply(tokens, [logprob for _, logprob in steps], pieces, detokenizer.text)


@dataclass(frozen=True)
class Answer:
    """What a chat completion (whole or streamed) says of its one choice."""

    pieces: list[str]
    logprobs: list[float]
    text: str
    completion_tokens: int


def ask(client: openai.OpenAI, model: str, message: str, stream: bool) -> Answer:
    """One greedy chat completion with its tokens' log-probabilities, whole or streamed."""
    common: dict[str, Any] = dict(
        model=model, messages=[{"role": "user", "content": message}], max_tokens=MAX_TOKENS,
        temperature=0, logprobs=True,
    )  # fmt: skip
    if not stream:
        answer = client.chat.completions.create(**common)
        [choice] = answer.choices
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert answer.usage is not None
        return Answer(
            [piece.token for piece in choice.logprobs.content],
            [piece.logprob for piece in choice.logprobs.content],
            choice.message.content or "",
            answer.usage.completion_tokens,
        )
    chunks = list(
        client.chat.completions.create(
            **common, stream=True, stream_options={"include_usage": True}
        )
    )
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    pieces = [p for c in choices if c.logprobs and c.logprobs.content for p in c.logprobs.content]
    usage = chunks[-1].usage
    assert usage is not None
    text = "".join(c.delta.content or "" for c in choices)
    return Answer([p.token for p in pieces], [p.logprob for p in pieces], text,
                  usage.completion_tokens)  # fmt: skip


@pytest.mark.parametrize("arch", FAMILIES)
def test_serve_answers_concurrent_chats_as_the_library(arch: str, checkpoints, served) -> None:
    """Three chat completions at once through the official openai client (the last streamed):
    each one's tokens (its logprobs' pieces and count), their log-probabilities and its text
    are the library's."""
    url, names = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    streamed = [i == len(MESSAGES) - 1 for i in range(len(MESSAGES))]
    with ThreadPoolExecutor(len(MESSAGES)) as pool:
        answers = list(pool.map(lambda m, s: ask(client, names[arch], m, s), MESSAGES, streamed))
    for message, answer in zip(MESSAGES, answers, strict=True):
        want = library_reply(checkpoints[arch], message)
        assert answer.pieces == want.pieces, message
        assert answer.logprobs == pytest.approx(want.logprobs, abs=1e-4), message
        assert answer.completion_tokens == len(want.token_ids)
        assert answer.text == want.text


def run_job(directory: Path, model: Path, macbatch_run) -> dict[str, dict[str, Any]]:
    """``macbatch run`` of a job asking ``MESSAGES`` greedily, written in ``directory``: the
    lines of the jsonl it writes, re-read, by custom id."""
    directory.mkdir()
    job = write_job(
        directory,
        f"""
        version: 1
        model: {model}
        defaults:
          sampling: {{temperature: 0, max_tokens: {MAX_TOKENS}}}
        output: {{dir: out}}
        jobs:
          - name: ask
            prompts: {json.dumps(MESSAGES)}
        """,
    )
    result = macbatch_run(job)
    assert result.exit_code == 0, result.output
    lines = {line["custom_id"]: line for line in read_jsonl(directory / "out" / "ask.jsonl")}
    assert sorted(lines) == ["1", "2", "3"]
    return lines


@pytest.mark.parametrize("arch", FAMILIES)
def test_run_writes_the_librarys_replies(
    arch: str, checkpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, macbatch_run
) -> None:
    """A three-row job, then the same rows in a second run (a fresh engine, which reads their
    prompts' blocks back from the disk tier the first one wrote): each line of the jsonl each
    writes, re-read, holds the library's reply and its token count."""
    monkeypatch.setenv("MACBATCH_HOME", str(tmp_path / "home"))
    path = checkpoints[arch]
    first = run_job(tmp_path / "first", path, macbatch_run)
    again = run_job(tmp_path / "again", path, macbatch_run)
    for i, message in enumerate(MESSAGES, start=1):
        want = library_reply(path, message)
        for lines in (first, again):
            body = lines[str(i)]["response"]["body"]
            assert body["choices"][0]["message"]["content"] == want.text, message
            assert body["usage"]["completion_tokens"] == len(want.token_ids)
        assert first[str(i)]["macbatch"]["disk_cached_tokens"] == 0
        read_back = again[str(i)]["macbatch"]["disk_cached_tokens"]
        assert read_back >= 32


@pytest.mark.parametrize("arch", FAMILIES)
async def test_chat_replies_as_the_library(
    arch: str, checkpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``macbatch chat`` on the checkpoint, its engine configured as the command configures it,
    driven by Textual's pilot: two turns of one chat (the second's prompt holds the first
    reply, as the history keeps it), each reply the library's."""
    from macbatch.tui.app import ChatApp
    from macbatch.tui.loading import LoadProgress, make_loader
    from macbatch.tui.store import HistoryStore

    monkeypatch.setenv("MACBATCH_HOME", str(tmp_path / "home"))
    path = checkpoints[arch]
    config = EngineConfig(**EngineKnobs().engine_fields((str(path),)))
    app = ChatApp(
        EngineThread(make_loader(str(path), config, LoadProgress())),
        HistoryStore(tmp_path / "chat.sqlite3"),
        model_label=str(path),
        export_dir=tmp_path / "exports",
        defaults=SessionSettings(temperature=0.0, top_p=1.0, max_tokens=MAX_TOKENS),
    )
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready or app.chats.load_error is not None, 120)
        assert app.chats.load_error is None
        chat = app.screen.current
        turns: list[str] = []
        for message in MESSAGES[:2]:
            await send(pilot, app.screen, message)
            await wait_for(pilot, lambda: chat not in app.chats.replies, timeout=120)
            reply = app.chats.store.messages(chat)[-1]
            want = library_reply(path, *turns, message)
            assert reply.content == want.text, message
            assert reply.metrics is not None and reply.metrics.tokens == len(want.token_ids)
            turns += [message, reply.content]
