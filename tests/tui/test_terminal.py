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
from tests.tui.test_streaming import greedy_texts

PROMPT = "0123456789"
MAX_TOKENS = 48  # greedy: a run of newlines, then visible text
REPO = Path(__file__).parents[2]

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


class Tmux:
    """One private tmux server (its own socket) running one command in a 120x36 window."""

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


def test_chat_in_tmux_answers_a_typed_message(tiny_model_path, tmp_path):
    home = tmp_path / "home"
    command = [
        sys.executable,
        "-c",
        "from macbatch.cli import app; app(prog_name='macbatch')",
        "chat",
        "--model",
        str(tiny_model_path),
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
    shell = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    shell = f"cd {shlex.quote(str(REPO))} && env {shell} {shlex.join(command)}"
    tmux = Tmux(f"macbatch-test-{os.getpid()}")
    tmux.run("new-session", "-d", "-s", "chat", "-x", "120", "-y", "36", shell)
    try:
        tmux.wait_for("tok/step")  # the status bar shows engine numbers once the model is ready
        tmux.run("send-keys", "-t", "chat", "-l", PROMPT)
        tmux.run("send-keys", "-t", "chat", "Enter")
        screen = tmux.wait_for(f"{MAX_TOKENS} tokens")
        (expected,) = greedy_texts(
            tiny_model_path, [[{"role": "user", "content": PROMPT}]], MAX_TOKENS
        )
        visible = expected.strip()
        assert visible and visible in screen
        assert PROMPT in screen
        tmux.run("send-keys", "-t", "chat", "C-q")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and tmux.alive():
            time.sleep(0.2)
        assert not tmux.alive(), "ctrl+q did not quit the app"
    finally:
        subprocess.run([*tmux.base, "kill-server"], capture_output=True)
    store = HistoryStore(home / "chat.sqlite3")
    (session,) = store.sessions()
    messages = store.messages(session.id)
    assert [(m.role, m.status) for m in messages] == [("user", DONE), ("assistant", DONE)]
    assert messages[1].content == expected
