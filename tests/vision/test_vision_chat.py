"""The chat app with images on the tiny Mistral 3 VLM: attach by key (F3) and by `/image PATH`,
chips with their sizes, the reply equal to mlx-vlm's own greedy generation, the images kept in
the history as bytes (the file deleted, a restart, a second turn), exported beside the Markdown;
a text-only model refuses an attachment in the UI."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from macbatch.engine import Engine, EngineConfig
from macbatch.session_settings import SessionSettings
from macbatch.tui.app import ChatApp
from macbatch.tui.screens.chat import ChatScreen
from macbatch.tui.store import HistoryStore
from tests.support.chat_app import RecordingEngineThread, send, wait_for
from tests.support.vlm_oracle import mlx_vlm_greedy

GREEDY = SessionSettings(temperature=0.0, top_p=1.0, max_tokens=5)


def chat_app(model: Path, home: Path) -> ChatApp:
    engine = RecordingEngineThread(
        lambda: Engine.load(str(model), EngineConfig(num_blocks=128, max_num_seqs=4))
    )
    return ChatApp(
        engine,
        HistoryStore(home / "chat.sqlite3"),
        model_label=model.name,
        export_dir=home / "exports",
        defaults=GREEDY,
    )


def reply_ids(app: ChatApp) -> list[int]:
    return list(app.chats.engine.outputs[-1][-1].token_ids)  # type: ignore[attr-defined]


async def test_attach_send_keep_and_export_images(vlm_path: Path, image_files, tmp_path: Path):
    home = tmp_path / "home"
    folder = tmp_path / "pictures"
    folder.mkdir()
    first, second = (shutil.copy(p, folder / p.name) for p in (image_files[1], image_files[3]))
    app = chat_app(vlm_path, home)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await pilot.press("f3")
        app.screen.query_one("Input").value = str(first)
        await pilot.press("enter")
        await send(pilot, screen, f"/image {folder / 'missing.png'}")
        assert any("No such file" in n.message for n in app._notifications)
        await send(pilot, screen, f"/image {second}")
        chips = str(screen.chips.render())
        size = Path(first).stat().st_size
        assert f"{Path(first).name} · {size / 1024:.1f} KiB · 64×48" in chips
        assert f"{Path(second).name} · " in chips and "33×60" in chips
        assert screen.message_box.text == ""  # the command is not sent as a message

        await send(pilot, screen, "compare")
        await wait_for(pilot, lambda: not screen.chats.replies)
        assert not screen.chips.display
        expected = mlx_vlm_greedy(vlm_path, "<s>[INST][IMG][IMG]compare[/INST]", [first, second], 5)
        assert reply_ids(app) == expected
        sent = app.chats.engine.prompts[-1]  # type: ignore[attr-defined]
        assert [p["type"] for p in sent[0]["content"]] == ["image", "image", "text"]

    Path(first).unlink()  # the history keeps the bytes, not the path
    again = chat_app(vlm_path, home)
    async with again.run_test() as pilot:
        await wait_for(pilot, lambda: again.chats.ready)
        screen = again.screen
        session_id = screen.current
        user = again.chats.messages(session_id)[0]
        assert [i.data for i in user.images] == [
            image_files[1].read_bytes(),
            Path(second).read_bytes(),
        ]
        assert "64×48" in str(screen.transcript(session_id).query(".attachment").first().render())
        await send(pilot, screen, "again")  # a second turn still sees both images
        await wait_for(pilot, lambda: not screen.chats.replies)
        first_reply = again.chats.messages(session_id)[1].content
        prompt = f"<s>[INST][IMG][IMG]compare[/INST]{first_reply}</s>[INST]again[/INST]"
        assert reply_ids(again) == mlx_vlm_greedy(vlm_path, prompt, [image_files[1], second], 5)

        await pilot.press("ctrl+o")
        markdown = (home / "exports" / f"chat-{session_id}.md").read_text()
        links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
        assert len(links) == 2
        written = [(home / "exports" / link).read_bytes() for link in links]
        assert written == [image_files[1].read_bytes(), Path(second).read_bytes()]


async def test_a_text_only_model_refuses_an_attachment(
    tiny_model_path: Path, image_files, tmp_path
):
    app = chat_app(tiny_model_path, tmp_path / "home")
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await send(pilot, screen, f"/image {image_files[0]}")
        await pilot.pause()
        assert not screen.chips.attached
        shown = [n.message for n in app._notifications]
        assert any("text-only model" in text and "cannot read images" in text for text in shown)


async def test_an_image_alone_is_sent_without_text(vlm_path: Path, image_files, tmp_path):
    app = chat_app(vlm_path, tmp_path / "home")
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.chats.ready)
        screen = app.screen
        await pilot.press("enter")  # an empty box with nothing attached sends nothing
        assert not app.chats.messages(screen.current)
        await send(pilot, screen, f"/image {image_files[2]}")
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.chats.replies)
        user = app.chats.messages(screen.current)[0]
        assert user.content == "" and len(user.images) == 1
        sent = app.chats.engine.prompts[-1]  # type: ignore[attr-defined]
        assert [p["type"] for p in sent[0]["content"]] == ["image"]
        expected = mlx_vlm_greedy(vlm_path, "<s>[INST][IMG][/INST]", [image_files[2]], 5)
        assert reply_ids(app) == expected
