"""The chat app in a small terminal (issue 65, item 8): at 60x20 the settings dialog shows every
field and its buttons, F1 shows every action in full, grouped by where it works, and ctrl+f's
header is whole; at 140 columns the footer's keys all fit. The size is set in `run_test`, never
taken from the environment (COLUMNS, LINES, a TTY)."""

from __future__ import annotations

from textual.widgets import Footer, Label

from macbatch.tui.screens.help import HelpScreen
from macbatch.tui.screens.search import SearchScreen
from macbatch.tui.screens.settings import SettingsScreen
from tests.support.chat_app import drawn_text, shown_whole, wait_for


def no_model():
    raise OSError("no model in these tests")  # the layout needs none: nothing loads


async def test_settings_at_60x20_show_every_field_and_both_buttons(make_app):
    app = make_app(loader=no_model)
    async with app.run_test(size=(60, 20)) as pilot:
        chat = app.chats.sessions[app.screen.current]
        # what ctrl+s shows for a model whose template has a thinking switch: the most rows
        app.push_screen(SettingsScreen(chat.title, chat.settings, thinking_default=False))
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        await pilot.pause()
        dialog = app.screen
        ids = ["system-prompt", "temperature", "top-p", "max-tokens", "thinking", "save", "cancel"]
        for name in ids:
            assert shown_whole(dialog, dialog.query_one(f"#{name}")), name
        await pilot.click("#cancel")
        assert not isinstance(app.screen, SettingsScreen)


async def test_keys_help_at_60x20_shows_every_action_whole_by_place(make_app):
    app = make_app(loader=no_model)
    async with app.run_test(size=(60, 20)) as pilot:
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause()
        help_screen = app.screen
        text = drawn_text(help_screen.query_one("#help-table"))
        for _, keys, action in help_screen.rows:
            assert f"{keys} {' '.join(action.split())}" in text, (keys, action)
        places = {where for where, _, _ in help_screen.rows}
        assert {"Anywhere", "Message box", "Mouse"} <= places
        for place in places:  # a heading each, not a column repeating it
            assert text.count(place) == 1, place
        assert help_screen.query_one("#help-keys").max_scroll_x == 0  # nothing off to the side


async def test_the_footer_and_the_search_header_are_whole(make_app):
    app = make_app(loader=no_model)
    async with app.run_test(size=(140, 40)) as pilot:
        footer = app.screen.query_one(Footer)
        used_most = {"Help", "New", "Stop", "Edit", "Settings", "Model", "Search", "Send"}
        # the footer redraws once the message box has the focus (its keys: Send, New line)
        await wait_for(
            pilot, lambda: used_most <= {k.description for k in footer.query("FooterKey")}
        )
        await pilot.pause()
        assert footer.virtual_size.width <= footer.size.width

        await pilot.press("ctrl+f")
        await wait_for(pilot, lambda: isinstance(app.screen, SearchScreen))
        for size in [(140, 40), (60, 20)]:
            await pilot.resize_terminal(*size)
            await pilot.pause()
            header = app.screen.query_one(Label)
            assert drawn_text(header) == " ".join(str(header.content).split()), size
            assert shown_whole(app.screen, header), size
