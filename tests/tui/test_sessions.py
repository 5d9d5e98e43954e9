"""Sessions on a real engine: create, rename, delete, switch; history across restarts; export,
settings, copy and the help screen."""

from __future__ import annotations

from macbatch.tui.screens.chat import ChatScreen
from macbatch.tui.screens.help import HelpScreen
from macbatch.tui.store import DONE, INTERRUPTED, HistoryStore
from macbatch.tui.widgets.message_view import MessageView
from tests.support.chat_app import LONG, STEP_SECONDS, first_reply, send, wait_for


async def test_create_rename_switch_and_delete_sessions(make_app, home):
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await pilot.press("ctrl+n", "ctrl+n")
        ids = list(screen.chats.sessions)
        assert len(ids) == 3 and screen.current == ids[2]

        await pilot.press("f2")
        app.screen.query_one("Input").value = ""
        await pilot.press(*"Groceries", "enter")
        assert isinstance(app.screen, ChatScreen)
        assert screen.session_list.item_for(ids[2]).title == "Groceries"

        await pilot.press("ctrl+pageup")
        assert screen.current == ids[1]
        await pilot.press("alt+down")
        assert screen.current == ids[2]
        await pilot.click(screen.session_list.item_for(ids[0]))
        assert screen.current == ids[0]
        assert screen.query_one("#transcripts").current == f"session-{ids[0]}"

        await pilot.press("f8", "n")  # answer no: nothing happens
        assert list(screen.chats.sessions) == ids
        await pilot.press("f8", "enter")  # an Enter meant for the message box answers no
        assert isinstance(app.screen, ChatScreen) and list(screen.chats.sessions) == ids
        await pilot.press("f8", "y")
        assert list(screen.chats.sessions) == ids[1:]
        assert screen.current == ids[1]
        assert [item.session_id for item in screen.session_list.items] == ids[1:]
        assert not screen.query(f"#session-{ids[0]}")

    store = HistoryStore(home / "chat.sqlite3")
    assert [(s.id, s.title) for s in store.sessions()] == [
        (ids[1], "Chat 2"),
        (ids[2], "Groceries"),
    ]

    again = make_app()  # reopening selects the chat used last, not the newest
    async with again.run_test() as pilot:
        assert again.screen.current == ids[1]
        assert again.screen.session_list.index == 0


async def test_the_first_message_titles_the_chat(make_app):
    question = "How do I   sort a dict\nby value in Python, keeping ties stable?"
    title = "How do I sort a dict by value in Python…"
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, question)
        first = screen.current
        await send(pilot, screen, "and in reverse?")
        await wait_for(pilot, lambda: not screen.chats.replies)
        assert app.chats.store.session(first).title == title
        assert screen.session_list.item_for(first).title == title
        assert screen.query_one("#transcripts").border_title == title

        await pilot.press("ctrl+n", "f2")  # a title the user chose is kept
        app.screen.query_one("Input").value = "Groceries"
        await pilot.press("enter")
        await send(pilot, screen, "milk")
        await wait_for(pilot, lambda: not screen.chats.replies)
        assert app.chats.store.session(screen.current).title == "Groceries"


async def test_switching_twice_in_a_row_ends_in_the_second_chat(make_app):
    """Two switches handled back to back (a held alt+up, keys typed ahead): the sidebar's late
    news of the first one must not reopen the chat in between, cancelling the edit begun after."""
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello world")
        await pilot.press("ctrl+n", "ctrl+n")
        first, second, third = screen.chats.sessions
        opened = []
        original = screen.open_session

        async def open_session(session_id: int) -> None:
            opened.append(session_id)
            await original(session_id)

        screen.open_session = open_session
        await screen.action_switch(-1)
        await screen.action_switch(-1)
        screen.action_edit_last()
        await pilot.pause(0.2)
        assert opened == [second, first]
        assert screen.current == first and screen.session_list.index == 0
        assert screen.editing is not None and screen.message_box.text == "hello world"


async def test_history_survives_a_restart_and_quitting_mid_reply(make_app):
    app = make_app(step_seconds=STEP_SECONDS)
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello world")
        first = screen.current
        finished = app.chats.store.messages(first)
        await pilot.press("ctrl+n")
        screen.chats.sessions[screen.current].settings = LONG
        await send(pilot, screen, "the quick brown fox")
        await wait_for(pilot, lambda: len(app.chats.engine.outputs[-1]) >= 10)
        second = screen.current
    # The app quit while the second reply streamed.

    again = make_app()
    async with again.run_test() as pilot:
        screen = again.screen
        await wait_for(pilot, lambda: again.chats.ready)
        assert list(screen.chats.sessions) == [first, second]
        assert screen.current == second
        restored = again.chats.store.messages(second)
        assert [(m.role, m.status) for m in restored] == [
            ("user", DONE),
            ("assistant", INTERRUPTED),
        ]
        assert len(restored[1].content) > 0
        assert (
            restored[1].content == app.chats.engine.outputs[-1][-1].text[: len(restored[1].content)]
        )
        views = screen.transcript(second).views
        assert "interrupted" in str(views[-1].query_one(".meta").render())
        await pilot.press("ctrl+pageup")
        assert again.chats.store.messages(first) == finished
        texts = [v.message.content for v in screen.transcript(first).views]
        assert texts == [m.content for m in finished]


async def test_export_writes_the_chat_as_markdown(make_app, home):
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello world")
        await pilot.press("ctrl+o")
        session_id = screen.current
    path = home / "exports" / f"chat-{session_id}.md"
    text = path.read_text()
    reply = HistoryStore(home / "chat.sqlite3").messages(session_id)[1]
    assert text.startswith("# hello world\n")
    assert "- temperature: 0\n" in text and "- max tokens: 24\n" in text
    user_at = text.index("## User\n\nhello world\n")
    assert text.index("## Assistant\n\n" + reply.content + "\n") > user_at


async def test_settings_are_checked_and_saved(make_app, home):
    app = make_app()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await pilot.press("ctrl+s")
        dialog = app.screen
        dialog.query_one("#system-prompt").text = "Answer in French."
        dialog.query_one("#temperature").value = "hot"
        await pilot.press("ctrl+s")
        assert app.screen is dialog  # still open, with the reason
        assert "temperature must be a number" in str(dialog.query_one("#settings-error").render())
        dialog.query_one("#temperature").value = "-1"
        await pilot.press("ctrl+s")
        assert "temperature" in str(dialog.query_one("#settings-error").render())
        dialog.query_one("#temperature").value = "0.3"
        dialog.query_one("#max-tokens").value = "8"
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, ChatScreen)
        await send(pilot, screen, "hello world")
        await wait_for(pilot, lambda: not screen.chats.replies)
        session_id = screen.current
    saved = HistoryStore(home / "chat.sqlite3").session(session_id).settings
    assert (saved.system_prompt, saved.temperature, saved.max_tokens) == (
        "Answer in French.",
        0.3,
        8,
    )
    (outputs,) = app.chats.engine.outputs
    assert len(outputs[-1].token_ids) <= 8


async def test_copy_a_message_and_the_help_screen(make_app):
    app = make_app()
    async with app.run_test() as pilot:
        screen = await first_reply(pilot, app, "hello world")
        user_view = screen.transcript(screen.current).views[0]
        await pilot.pause(0.2)  # let the finished reply's layout settle before clicking
        await pilot.click(user_view)
        await wait_for(pilot, lambda: app.focused is user_view, timeout=5)
        await pilot.press("ctrl+c")
        assert app.clipboard == "hello world"

        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        rows = app.screen.rows
        actions = {action for _, _, action in rows}
        for binding in [*ChatScreen.BINDINGS, *MessageView.BINDINGS]:
            assert (binding.tooltip or binding.description) in actions
        assert ("Anywhere", "^pgup, alt+↑", "Previous chat") in rows
        await pilot.press("escape")
        assert isinstance(app.screen, ChatScreen)
