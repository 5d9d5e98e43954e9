"""`macbatch ask "PROMPT"`: one question, the reply streamed to stdout, as `ollama run MODEL
PROMPT` and `llm PROMPT` do. Text piped in (`cat notes.md | macbatch ask "summarize"`) follows the
prompt in the one user message. Only the reply goes to stdout, so it can be piped on; anything
else (loading, errors, a reply cut at --max-tokens) goes to stderr.

It runs the engine on this thread, one request; the sampling defaults are a new chat's
(`session_settings.SessionSettings`, shared with the chat app), so `ask` and `chat` answer alike.
Each turn is kept in the chat history (`ask_history.py`): `-c` continues the last conversation.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TextIO

import typer

from macbatch.commands.fields import Pick, takes
from macbatch.commands.options import LOAD_ONLY, EngineKnobs, resolve_model
from macbatch.config import DEFAULT_MODEL

if TYPE_CHECKING:
    from macbatch.commands.ask_history import Conversation
    from macbatch.engine import Engine, RequestOutput, SamplingParams
    from macbatch.models.presets import Preset
    from macbatch.session_settings import SessionSettings

EXIT_INTERRUPTED = 130
ASK_KNOBS = Pick(EngineKnobs, LOAD_ONLY)  # otherwise the engine's defaults


@takes(knobs=ASK_KNOBS)
def ask_command(
    prompt: Annotated[
        str | None,
        typer.Argument(
            help="The question or instruction; text piped in is added after it.",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help=f"'{DEFAULT_MODEL}' (default), a short name (macbatch models --available), a "
            "preset, a local MLX model directory or a Hugging Face id.",
            show_default=False,
        ),
    ] = None,
    system: Annotated[
        str | None, typer.Option("--system", help="A system prompt.", show_default=False)
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature", help="0 is greedy (default: a new chat's, 0.7).", show_default=False
        ),
    ] = None,
    top_p: Annotated[
        float | None,
        typer.Option("--top-p", help="Nucleus sampling (default: 1.0).", show_default=False),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            min=1,
            help="Longest reply (default: a new chat's, 512).",
            show_default=False,
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--continue", "-c", help="Continue the last ask conversation (its model, settings)."
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (reply, model, tokens).")
    ] = False,
    *,
    knobs: EngineKnobs,
) -> None:
    """Ask a model one question and stream its reply to stdout (text piped in is added).
    Each conversation is kept in the chat history: `-c` continues it, `macbatch history`
    searches it, `macbatch chat` opens it.

    Example: `cat notes.md | macbatch ask -m qwen3:0.6b "summarize"`
    """
    text = question(prompt, sys.stdin)
    if not text.strip():
        fail('nothing to ask: give a prompt (macbatch ask "...") or pipe text in')
    before = previous() if resume else None
    chosen = model or (before.model if before and before.model else DEFAULT_MODEL)
    resolved = resolve_model(chosen)
    given = {"system_prompt": system, "temperature": temperature, "top_p": top_p}
    given["max_tokens"] = max_tokens
    settings = ask_settings(before, resolved.preset, given)
    params = settings.sampling_params()
    messages = [{"role": "system", "content": settings.system_prompt}]
    messages = messages[: 1 if settings.system_prompt else 0]
    messages += [*(before.messages if before else []), {"role": "user", "content": text}]
    engine = load(resolved.model, knobs)
    try:
        ended = stream(engine, messages, params, settings.template_kwargs(), not as_json)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    chat = keep(before, resolved.model, settings, text, ended.text)
    if as_json:
        sys.stdout.write(json.dumps(answer(resolved.model, chat, ended)) + "\n")


def ask_settings(
    before: Conversation | None, preset: Preset | None, given: dict[str, Any]
) -> SessionSettings:
    """A new chat's settings, under the continued conversation's, under the preset's, under
    the options given."""
    from macbatch.models.presets import layered
    from macbatch.session_settings import SessionSettings

    try:
        return layered(before.settings if before else SessionSettings(), preset, given)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def previous() -> Conversation:
    """The conversation `-c` continues; none yet (or the history busy) ends the command."""
    from macbatch.commands.ask_history import last_conversation
    from macbatch.tui.history_file import HistoryError, history_path

    try:
        found = last_conversation(history_path())
    except HistoryError as error:
        fail(f"cannot continue: {error}")
    if found is None:
        fail("no ask conversation to continue yet: ask without -c first")
    return found


def keep(
    before: Conversation | None, model: str, settings: SessionSettings, text: str, reply: str
) -> int | None:
    """The turn written to the history (its chat's id); the history busy is said, not fatal."""
    from macbatch.commands.ask_history import save_turn
    from macbatch.tui.history_file import HistoryError, history_path

    try:
        return save_turn(history_path(), before, model, settings, text, reply)
    except HistoryError as error:
        sys.stderr.write(f"(not kept in the history: {error})\n")
        return None


def answer(model: str, chat: int | None, ended: RequestOutput) -> dict[str, Any]:
    """--json's object."""
    reason = ended.finish_reason.value if ended.finish_reason is not None else None
    return {
        "model": model,
        "conversation": chat,
        "reply": ended.text,
        "finish_reason": reason,
        "prompt_tokens": ended.metrics.prompt_tokens,
        "completion_tokens": ended.metrics.generated_tokens,
    }


def question(prompt: str | None, stdin: TextIO) -> str:
    """The prompt, then what was piped in (never read from a terminal: that would wait); text
    that is not UTF-8 (a Latin-1 file piped in, bytes the locale kept as surrogates) is refused
    with where it goes wrong, before a tokenizer chokes on it."""
    try:
        piped = "" if stdin.isatty() else stdin.read()
        text = "\n\n".join(part for part in (prompt, piped.strip()) if part)
        text.encode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError) as error:
        fail(
            f"the prompt is not UTF-8 text ({error.reason} at position {error.start}); convert "
            "it first, e.g. `iconv -f latin1 -t utf-8 FILE | macbatch ask`"
        )
    return text


def load(model: str, knobs: EngineKnobs) -> Engine:
    from macbatch.engine import Engine, EngineConfig

    try:
        return Engine.load(model, EngineConfig(self_check=not knobs.no_self_check))
    except Exception as error:  # load errors come in many types; all mean "cannot answer"
        fail(f"cannot load model '{model}': {error}")


def stream(
    engine: Engine,
    messages: list[dict[str, str]],
    params: SamplingParams,
    template_kwargs: dict[str, bool] | None,
    echo: bool = True,
) -> RequestOutput:
    """Write the reply as it comes (``echo``); say on stderr why it ended if not by itself."""
    from macbatch.engine import FinishReason, PromptInput

    try:
        engine.add_request(PromptInput(messages, template_kwargs), params)
    except ValueError as error:  # too long for the context, a template that refuses
        fail(str(error))
    ended = None
    while engine.has_unfinished():
        for output in engine.step():
            if echo:
                sys.stdout.write(output.new_text)
                sys.stdout.flush()
            if output.finished:
                ended = output
    if echo:
        sys.stdout.write("\n")
    if ended is None or ended.finish_reason == FinishReason.ERROR:
        fail(ended.error if ended is not None and ended.error else "the engine failed this request")
    if ended.finish_reason == FinishReason.LENGTH:
        sys.stderr.write(f"(the reply reached --max-tokens {params.max_tokens})\n")
    return ended


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(1)
