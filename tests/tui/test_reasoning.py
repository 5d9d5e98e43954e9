"""A thinking model's reasoning in the chat: shown apart from the answer, dim and open while the
model reasons, collapsed once the answer starts, titled with its token count and time."""

from __future__ import annotations

from textual.app import App, ComposeResult

from macbatch.engine import RequestMetrics, RequestOutput
from macbatch.engine.text import FixedText
from macbatch.tui.reply import ReasoningProgress
from macbatch.tui.store import STREAMING, Message
from macbatch.tui.widgets.message_view import MessageView
from macbatch.tui.widgets.reasoning_view import ReasoningView


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
