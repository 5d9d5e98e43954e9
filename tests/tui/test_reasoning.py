"""A thinking model's reasoning in the chat: shown apart from the answer, dim and open while the
model reasons, collapsed once the answer starts, titled with its token count and time."""

from __future__ import annotations

from textual.app import App, ComposeResult

from macbatch.engine import Engine, EngineConfig, RequestMetrics, RequestOutput
from macbatch.engine.parsers.text import FixedText
from macbatch.tui.reply import ReasoningProgress
from macbatch.tui.store import DONE, STREAMING, HistoryStore, Message, Reasoning
from macbatch.tui.widgets.message_view import MessageView
from macbatch.tui.widgets.reasoning_view import ReasoningView
from tests.support.chat_app import first_reply, send, wait_for
from tests.support.scripted import scripted_model
from tests.support.standin import gemma4_tokenizer
from tests.support.tiny import VOCAB_SIZE


def _output(tokens: int, reasoning: str | None, text: str) -> RequestOutput:
    metrics = RequestMetrics(arrival_time=0.0, first_token_time=10.0)
    return RequestOutput(
        request_id="r",
        token_ids=list(range(tokens)),
        new_token_ids=[],
        finished=False,
        finish_reason=None,
        metrics=metrics,
        step=tokens,
        text_view=FixedText(text=text, reasoning=reasoning),
    )


class _OneMessage(App):
    def compose(self) -> ComposeResult:
        yield MessageView(
            Message(id=1, session_id=1, role="assistant", content="", status=STREAMING)
        )


async def test_reasoning_opens_then_collapses_when_the_answer_starts():
    app = _OneMessage()
    async with app.run_test(size=(80, 24)) as pilot:
        view = app.query_one(MessageView)
        progress = ReasoningProgress()
        assert not progress.update(_output(3, None, "plain"), 11.0)  # no reasoning: no view
        assert not view.query(ReasoningView)

        thinking = _output(5, "Let me add 2 and 2.", "")
        assert progress.update(thinking, 11.5)
        await view.show_reasoning(*progress.shown(thinking))
        await pilot.pause()
        box = view.query_one(ReasoningView)
        assert not box.collapsed
        assert box.title == "Reasoning… (5 tokens, 1.5 s)"
        # the reasoning sits above the answer
        assert list(view.children).index(box) < list(view.children).index(
            view.query_one("Markdown")
        )

        answering = _output(8, "Let me add 2 and 2.", "4")
        assert progress.update(answering, 12.0)
        await view.show_reasoning(*progress.shown(answering))
        await pilot.pause()
        assert box.collapsed
        assert box.title == "Reasoned (5 tokens, 2.0 s)"
        assert not progress.update(_output(9, "Let me add 2 and 2.", "4."), 13.0)


class _StoredReply(App):
    def compose(self) -> ComposeResult:
        reasoning = Reasoning("Let me add 2 and 2.", 5, 1.5)
        yield MessageView(Message(1, 1, "assistant", "4", DONE, reasoning=reasoning))


async def test_a_stored_reply_shows_its_reasoning_again_collapsed():
    """After a restart a reply comes from the history: its reasoning is shown, collapsed."""
    app = _StoredReply()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        box = app.query_one(ReasoningView)
        assert box.collapsed and box.title == "Reasoned (5 tokens, 1.5 s)"
        assert str(box.query_one(".reasoning-text").render()) == "Let me add 2 and 2."


async def test_a_thinking_reply_keeps_its_reasoning_out_of_the_next_prompt(make_app, home):
    """A chat with a thinking model (scripted, Gemma-4-style stand-in tokenizer): the reply's
    reasoning is stored apart from its answer, and the next turn sends the answer only."""
    tokenizer = gemma4_tokenizer()
    chat = [{"role": "user", "content": "hello"}]
    start = tokenizer.apply_chat_template(chat, add_generation_prompt=True)[-1]
    thought = tokenizer.encode(" quick brown", add_special_tokens=False)
    answer = tokenizer.encode(" lazy dog", add_special_tokens=False)
    marks = [
        tokenizer.convert_tokens_to_ids(t) for t in ("<|channel>", "thought", "<channel|>", "<eos>")
    ]
    script = [start, *marks[:2], *thought, marks[2], *answer, marks[3]]
    model = scripted_model("qwen3", VOCAB_SIZE, script)
    app = make_app(loader=lambda: Engine(model, tokenizer, EngineConfig(num_blocks=64)))
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello")
        await send(pilot, screen, "again")
        await wait_for(
            pilot, lambda: len(app.chats.engine.prompts) == 2 and not screen.chats.replies
        )
        session_id = screen.current
    history = HistoryStore(home / "chat.sqlite3").messages(session_id)
    assert history[1].reasoning.text == tokenizer.decode(thought)
    assert history[1].content == tokenizer.decode(answer)
    assert app.chats.engine.prompts[1] == [
        *chat,
        {"role": "assistant", "content": tokenizer.decode(answer)},
        {"role": "user", "content": "again"},
    ]
