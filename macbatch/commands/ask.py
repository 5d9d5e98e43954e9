"""`macbatch ask "PROMPT"`: one question, the reply streamed to stdout, as `ollama run MODEL
PROMPT` and `llm PROMPT` do. Text piped in (`cat notes.md | macbatch ask "summarize"`) follows the
prompt in the one user message. Only the reply goes to stdout, so it can be piped on; anything
else (loading, errors, a reply cut at --max-tokens) goes to stderr.

It runs the engine on this thread, one request; the sampling defaults are a new chat's
(`session_settings.SessionSettings`, shared with the chat app), so `ask` and `chat` answer alike.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, NoReturn, TextIO

import typer

from macbatch.commands.fields import Pick, takes
from macbatch.commands.options import LOAD_ONLY, EngineKnobs, model_problem
from macbatch.config import DEFAULT_MODEL

if TYPE_CHECKING:
    from macbatch.engine import Engine, SamplingParams

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
        str,
        typer.Option(
            "--model",
            "-m",
            help="'demo' (bundled, offline), a local MLX model directory, or a Hugging Face id.",
        ),
    ] = DEFAULT_MODEL,
    system: Annotated[
        str | None, typer.Option("--system", help="A system prompt.", show_default=False)
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature", help="0 is greedy (default: a new chat's, 0.7).", show_default=False
        ),
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
    *,
    knobs: EngineKnobs,
) -> None:
    """Ask a model one question and stream its reply to stdout (text piped in is added).

    Example: `cat notes.md | macbatch ask -m mlx-community/Qwen3-0.6B-4bit "summarize"`
    """
    from dataclasses import replace

    from macbatch.session_settings import SessionSettings

    text = question(prompt, sys.stdin)
    if not text.strip():
        fail('nothing to ask: give a prompt (macbatch ask "...") or pipe text in')
    if (problem := model_problem(model)) is not None:
        raise typer.BadParameter(problem, param_hint="--model")
    settings = SessionSettings(system_prompt=system or "")
    if temperature is not None:
        settings = replace(settings, temperature=temperature)
    if max_tokens is not None:
        settings = replace(settings, max_tokens=max_tokens)
    try:
        params = settings.sampling_params()
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    engine = load(model, knobs)
    try:
        stream(engine, messages, params, settings.template_kwargs())
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None


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
) -> None:
    """Write the reply as it comes; say on stderr why it ended if not by itself."""
    from macbatch.engine import FinishReason, PromptInput

    try:
        engine.add_request(PromptInput(messages, template_kwargs), params)
    except ValueError as error:  # too long for the context, a template that refuses
        fail(str(error))
    ended = None
    while engine.has_unfinished():
        for output in engine.step():
            sys.stdout.write(output.new_text)
            sys.stdout.flush()
            if output.finished:
                ended = output
    sys.stdout.write("\n")
    if ended is not None and ended.finish_reason == FinishReason.ERROR:
        fail(ended.error or "the engine failed this request")
    if ended is not None and ended.finish_reason == FinishReason.LENGTH:
        sys.stderr.write(f"(the reply reached --max-tokens {params.max_tokens})\n")


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(1)
