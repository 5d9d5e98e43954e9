"""Regenerate keeps every version of a reply (issue 50): ctrl+r adds one, alt+left / alt+right
flip between them on the real app, the message says which one it shows, the one shown is what the
next turn sends as context, and all of them survive a restart."""

from __future__ import annotations

from dataclasses import replace

from macbatch.tui.store import DONE, HistoryStore
from tests.support.chat_app import GREEDY, first_reply, greedy_texts, send, wait_for

SHORT = 8  # tokens of the second version: a different reply from the same prompt, greedily


def meta(screen) -> str:
    return str(screen.transcript(screen.current).views[-1].query_one(".meta").render())


async def test_regenerate_keeps_versions_to_flip_through(make_app, home, tiny_model_path):
    question = [{"role": "user", "content": "hello world"}]
    long, short = (greedy_texts(tiny_model_path, [question], n)[0] for n in (24, SHORT))
    assert long != short
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await first_reply(pilot, app, "hello world")
        session_id = screen.current
        [_, first] = app.chats.store.messages(session_id)
        assert "version" not in meta(screen)  # one version: nothing to flip
        footer = {k.key for k in screen.query("FooterKey")}
        assert "alt+left" not in footer  # F1 only, so the footer fits 140 columns
        await pilot.press("f1")
        keys = {keys: action for _, keys, action in app.screen.rows}
        assert keys["alt+←"].startswith("Previous version of the selected (else last) reply")
        assert keys["alt+→"].startswith("Next version of the selected (else last) reply")
        await pilot.press("escape")

        app.chats.save_settings(session_id, replace(GREEDY, max_tokens=SHORT))
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not screen.chats.replies)
        [_, reply] = app.chats.store.messages(session_id)
        assert (reply.id, reply.content, reply.status) == (first.id, short, DONE)
        assert (reply.version, reply.versions) == (2, 2)
        assert meta(screen).startswith("version 2/2 · ")
        assert engine_prompt(app, -1) == question  # the kept version is not in the prompt

        await pilot.press("alt+left")
        [_, reply] = app.chats.store.messages(session_id)
        assert (reply.content, reply.version, reply.versions) == (long, 1, 2)
        assert meta(screen).startswith("version 1/2 · 24 tokens")
        views = screen.transcript(session_id).views
        assert [v.message.id for v in views][-1] == first.id
        assert views[-1].message.content == long

        await pilot.press("alt+left")  # already the first: says so, changes nothing
        assert any("first version (1/2)" in str(n.message) for n in app._notifications)
        assert app.chats.store.messages(session_id)[-1].content == long

        await send(pilot, screen, "and then")
        await wait_for(pilot, lambda: not screen.chats.replies)
        assert engine_prompt(app, -1) == [
            *question,
            {"role": "assistant", "content": long},  # the version shown, not the newest
            {"role": "user", "content": "and then"},
        ]

        await pilot.click(views[-1])  # select the first reply
        assert screen.focused is views[-1]
        await pilot.press("alt+right")  # flips the selected reply, not the last one
        messages = app.chats.store.messages(session_id)
        assert [(m.content, m.version, m.versions) for m in messages[1:2]] == [(short, 2, 2)]
        assert messages[-1].versions == 1

    store = HistoryStore(home / "chat.sqlite3")  # after a restart, every version is there
    reply = store.messages(session_id)[1]
    assert (reply.content, reply.version, reply.versions) == (short, 2, 2)
    assert store.show_version(reply.id, 1).content == long
    store.close()


def engine_prompt(app, index: int) -> list[dict]:
    return app.chats.engine.prompts[index]
