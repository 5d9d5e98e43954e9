"""Helpers for the chat app tests: greedy settings, an engine thread that records, waiting, the
engine's own greedy replies (the oracle for the text), and a two-command CLI around `chat`.
Shared by the chat app tests and the vision tests' image chats, so here, not in tests/tui/."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import mlx_lm
import typer
from textual import events

from macbatch.engine import Engine, EngineConfig, EngineThread, RequestOutput, SamplingParams
from macbatch.session_settings import SessionSettings
from macbatch.tui.command import chat_command
from tests.support.oracle import mlx_lm_greedy

# Greedy decoding of the tiny model never emits EOS for these prompts, so a long limit, with engine
# steps paced to at least STEP_SECONDS, keeps a reply streaming until the test stops it.
LONG = SessionSettings(temperature=0.0, top_p=1.0, max_tokens=3000)
STEP_SECONDS = 0.01
# Greedy, short replies: deterministic, so the engine's own output is the oracle for the text.
GREEDY = SessionSettings(temperature=0.0, top_p=1.0, max_tokens=24)


class RecordingEngineThread(EngineThread):
    """A real EngineThread that also keeps every output it streams, per request, for asserts."""

    def __init__(self, loader: Callable[[], Engine]) -> None:
        super().__init__(loader)
        self.outputs: list[list[RequestOutput]] = []
        self.template_kwargs: list[dict | None] = []
        self.prompts: list = []

    async def stream(self, prompt, params=None, request_id=None):  # type: ignore[override]
        seen: list[RequestOutput] = []
        self.outputs.append(seen)
        self.template_kwargs.append(prompt.chat_template_kwargs)  # the chat passes a PromptInput
        self.prompts.append(prompt.prompt)
        async for output in super().stream(prompt, params, request_id):
            seen.append(output)
            yield output


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Let the app run until `condition()` holds; fail with a clear message after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {condition}")
        await pilot.pause(0.02)


async def send(pilot, screen, text: str) -> None:
    screen.message_box.text = text  # typing key by key is slow while replies stream
    await pilot.press("enter")


async def first_reply(pilot, app, text: str):
    """Wait for the app, send `text` in the open session and wait for the whole reply; the chat
    screen is returned."""
    await wait_for(pilot, lambda: app.chats.ready)
    screen = app.screen
    await send(pilot, screen, text)
    await wait_for(pilot, lambda: not screen.chats.replies)
    return screen


def type_ahead(app, *keys: str) -> None:
    """Deliver `keys` all at once, as a terminal does with keys typed (or sent by tmux) faster
    than the app handles them. `pilot.press` waits for the app to go idle after every key, which
    hides any race between them."""
    for key in keys:
        app.post_message(events.Key(key, key if len(key) == 1 else None))


def mlx_lm_reply(
    path: Path, text: str, max_tokens: int = GREEDY.max_tokens, adapter: Path | None = None
) -> str:
    """The oracle: mlx-lm's greedy tokens for the one-message chat (with ``adapter`` loaded by
    mlx-lm itself), up to its first EOS, as the text they add after the prompt's (the reply's
    leading spaces left out, as a reply's text starts at its first character)."""
    model, tokenizer = mlx_lm.load(
        str(path), adapter_path=None if adapter is None else str(adapter)
    )
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    tokens = mlx_lm_greedy(model, ids, max_tokens)
    ends = [i for i, token in enumerate(tokens) if token in tokenizer.eos_token_ids]
    tokens = tokens[: ends[0]] if ends else tokens
    whole = tokenizer.decode(ids + tokens)
    return whole[len(tokenizer.decode(ids)) :].lstrip(" ")


def greedy_texts(model_path: Path, prompts: list[list[dict[str, str]]], max_tokens: int) -> list:
    """The oracle: what a fresh engine generates for these chats, greedily."""
    engine = Engine.load(str(model_path), EngineConfig(num_blocks=64))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return [out.text for out in engine.generate(prompts, params)]


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("chat")(chat_command)
    app.command("other")(lambda: None)  # two commands, so "chat" is a subcommand as in macbatch
    return app


def shown_whole(screen, widget) -> bool:
    """Whether every cell of `widget` is on the screen: inside its containers' clip (not cut or
    scrolled away) and inside the terminal."""
    geometry = screen.find_widget(widget)
    size = screen.app.size
    on_terminal = geometry.region.right <= size.width and geometry.region.bottom <= size.height
    return on_terminal and geometry.clip.contains_region(geometry.region)


def drawn_text(widget) -> str:
    """Everything `widget` draws (all of its height, scrolled or not), whitespace collapsed: a
    text cut at the widget's edge is missing its end here."""
    from textual.geometry import Region

    lines = widget.render_lines(Region(0, 0, widget.size.width, widget.virtual_size.height))
    return " ".join(" ".join(line.text for line in lines).split())
