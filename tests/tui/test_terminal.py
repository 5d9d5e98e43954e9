"""`macbatch chat` in a real terminal (tmux): type a message, read the reply off the screen."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from macbatch.tui.store import DONE, HistoryStore
from tests.support.chat_app import greedy_texts

PROMPT = "0123456789"
MAX_TOKENS = 48  # greedy: a run of newlines, then visible text
REPO = Path(__file__).parents[2]

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


class Tmux:
    """One private tmux server (its own socket) running one command in one window."""

    def __init__(self, socket: str) -> None:
        self.base = ["tmux", "-L", socket]

    def run(self, *args: str) -> str:
        return subprocess.run(
            [*self.base, *args], check=True, capture_output=True, text=True
        ).stdout

    def alive(self) -> bool:
        return (
            subprocess.run(
                [*self.base, "has-session", "-t", "chat"], capture_output=True
            ).returncode
            == 0
        )

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "chat")

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} never appeared on the screen:\n{self.screen()}")


def start_chat(tmux: Tmux, model: Path, home: Path, size_env: str, width: int, height: int):
    """Run `macbatch chat` on the tiny model in a `width` x `height` tmux window. tmux hands its
    own environment to the app (the outer terminal's COLUMNS and LINES included); `size_env` is
    the `env` arguments that set or unset them for the app."""
    command = [
        sys.executable,
        "-c",
        "from macbatch.cli import app; app(prog_name='macbatch')",
        "chat",
        "--model",
        str(model),
        "--temperature",
        "0",
        "--max-tokens",
        str(MAX_TOKENS),
        "--kv-blocks",
        "64",
    ]
    env = {"MACBATCH_HOME": str(home), "TERM": "xterm-256color"}
    if os.environ.get("LD_PRELOAD"):
        env["LD_PRELOAD"] = os.environ["LD_PRELOAD"]
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    shell = f"cd {shlex.quote(str(REPO))} && env {size_env} {assignments} {shlex.join(command)}"
    tmux.run("new-session", "-d", "-s", "chat", "-x", str(width), "-y", str(height), shell)


def quit_chat(tmux: Tmux) -> None:
    tmux.run("send-keys", "-t", "chat", "C-q")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and tmux.alive():
        time.sleep(0.2)
    assert not tmux.alive(), "ctrl+q did not quit the app"


@pytest.fixture
def tmux():
    server = Tmux(f"macbatch-test-{os.getpid()}")
    yield server
    subprocess.run([*server.base, "kill-server"], capture_output=True)


def test_chat_in_tmux_answers_a_typed_message(tiny_model_path, tmp_path, tmux):
    home = tmp_path / "home"
    start_chat(tmux, tiny_model_path, home, "-u COLUMNS -u LINES", 120, 36)
    tmux.wait_for("tok/step")  # the status bar shows engine numbers once the model is ready
    tmux.run("send-keys", "-t", "chat", "-l", PROMPT)
    tmux.run("send-keys", "-t", "chat", "Enter")
    screen = tmux.wait_for(f"{MAX_TOKENS} tokens")
    (expected,) = greedy_texts(tiny_model_path, [[{"role": "user", "content": PROMPT}]], MAX_TOKENS)
    visible = expected.strip()
    assert visible and visible in screen
    assert PROMPT in screen
    quit_chat(tmux)
    store = HistoryStore(home / "chat.sqlite3")
    (session,) = store.sessions()
    messages = store.messages(session.id)
    assert [(m.role, m.status) for m in messages] == [("user", DONE), ("assistant", DONE)]
    assert messages[1].content == expected


def test_chat_draws_at_the_panes_size_whatever_columns_and_lines_say(
    tiny_model_path, tmp_path, tmux
):
    """A stale COLUMNS=160 LINES=48 (exported in a bigger terminal) must not size the app."""

    def drawn_at(width: int, height: int) -> bool:
        lines = tmux.screen().splitlines()
        return (
            len(lines) == height
            and lines[0].startswith("╭─ Chats")
            and len(lines[0]) == width
            and lines[0].endswith("╮")  # the chat's frame closes at the pane's right edge
            and " running · " in lines[height - 2]  # the status bar above the footer
        )

    start_chat(tmux, tiny_model_path, tmp_path / "home", "COLUMNS=160 LINES=48", 100, 30)
    tmux.wait_for("tok/step")
    wait_until(lambda: drawn_at(100, 30), tmux)
    tmux.run("resize-window", "-t", "chat", "-x", "80", "-y", "24")
    wait_until(lambda: drawn_at(80, 24), tmux)
    quit_chat(tmux)


def wait_until(condition, tmux: Tmux, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the app is not drawn at the pane's size:\n{tmux.screen()}")
        time.sleep(0.2)
