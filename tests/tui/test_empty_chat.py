"""An empty chat says how to start; with the demo model it lists what the demo answers, and the
demo answers those questions one after another in the same chat."""

from __future__ import annotations

from macbatch.demo import MODEL_DIR
from macbatch.demo.questions import read_question_set
from macbatch.demo.tasks import SHOWCASE
from macbatch.engine import Engine, EngineConfig
from macbatch.tui.widgets.empty_chat import GENERAL_HINT, EmptyChat
from macbatch.tui.widgets.message_view import MessageView
from tests.support.chat_app import GREEDY, send, wait_for
from tests.support.demo_oracle import oracle


def reference_replies(prompts: list[list[dict[str, str]]]) -> list[str]:
    """mlx-lm's greedy replies to `prompts` with the shipped demo model."""
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(MODEL_DIR))
    return [
        mlx_lm.generate(
            model,
            tokenizer,
            tokenizer.apply_chat_template(messages, add_generation_prompt=True),
            max_tokens=GREEDY.max_tokens,
        )
        for messages in prompts
    ]


def shown(screen) -> str:
    return "\n".join(str(view.render()) for view in screen.query(EmptyChat))


async def test_an_empty_chat_shows_how_to_start(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        assert shown(app.screen) == GENERAL_HINT


async def test_the_demo_chat_lists_its_tasks_and_answers_them_in_one_chat(make_app):
    config = EngineConfig(num_blocks=256, max_num_seqs=8)
    app = make_app(loader=lambda: Engine.load("demo", config), model_label="demo")
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        text = shown(screen)
        assert all(question in text for _, question in SHOWCASE.values())

        # Ten questions in one chat: each turn sees the earlier ones, until the chat outgrows the
        # demo's 512-token context and its oldest turns are left out of the prompt. Every reply is
        # mlx-lm's own greedy reply to the prompt the app sent (the oracle).
        questions = [(task, question) for task, (_, question) in SHOWCASE.items()]
        questions += [(e.task, e.question) for e in read_question_set()[::200]]
        replies = []
        for _, question in questions:
            await send(pilot, screen, question)
            await wait_for(pilot, lambda: not screen.chats.replies)
            replies.append(screen.transcript(screen.current).views[-1].message.content)
        assert not screen.query(EmptyChat)
        assert replies == reference_replies(app.chats.engine.prompts)
        task, question = questions[0]
        assert replies[0].strip() == oracle(task, question)  # asked first, in a fresh chat
        last_prompt = app.chats.engine.prompts[-1]
        assert 1 < len(last_prompt) < 2 * len(questions) - 1
        assert last_prompt[0]["role"] == "user"
        assert last_prompt[-1]["content"] == questions[-1][1]

        await pilot.press("ctrl+n")  # a new chat shows the list again
        assert shown(screen) == text
        assert not screen.transcript(screen.current).query(MessageView)
