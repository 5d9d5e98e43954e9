"""`macbatch ask` keeps its conversations in the chat history (issue 65, item 15): `-c`
continues the last one with its model and settings, `--json` prints one object, `macbatch
history` finds them, and the chat app's own store reads them as chats. A preset gives ask its
model, system prompt and sampling (item 16). The oracle: the engine's own greedy replies to
the same messages, and the history re-read with sqlite3."""

from __future__ import annotations

import json
import sqlite3

import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from macbatch.engine import Engine, SamplingParams

SYSTEM = "Answer briefly."
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def greedy():
    engine = Engine.load("demo")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return lambda messages: engine.generate([messages], params)[0].text


def test_ask_continues_and_its_history_is_searchable(greedy, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MACBATCH_HOME", str(tmp_path))
    (tmp_path / "presets.yaml").write_text(
        f"brief:\n  model: demo\n  system: {SYSTEM}\n  temperature: 0\n  max_tokens: {MAX_TOKENS}\n"
    )
    runner = CliRunner()
    none_yet = runner.invoke(app, ["ask", "-c", "hi"])
    assert none_yet.exit_code == 1 and "no ask conversation to continue" in none_yet.stderr

    first = runner.invoke(app, ["ask", "-m", "brief", "--top-p", "0.5", "What is 48 + 37?"])
    assert first.exit_code == 0, first.output
    turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 48 + 37?"}]
    reply = greedy(turn)
    assert first.stdout == reply + "\n"

    second = runner.invoke(app, ["ask", "-c", "--json", "Reverse the word planet."])
    assert second.exit_code == 0, second.output
    turn += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Reverse the word planet."},
    ]
    answer = json.loads(second.stdout)  # one object, nothing else on stdout
    assert answer["reply"] == greedy(turn) and answer["model"] == "demo"
    assert answer["completion_tokens"] > 0 and answer["finish_reason"] in ("stop", "length")

    db = sqlite3.connect(tmp_path / "chat.sqlite3")
    ((chat, title, model),) = db.execute("SELECT id, title, model FROM sessions").fetchall()
    assert (chat, title, model) == (answer["conversation"], "What is 48 + 37?", "demo")
    kept = db.execute("SELECT role, content FROM messages ORDER BY id").fetchall()
    assert kept == [(m["role"], m["content"]) for m in turn[1:]] + [("assistant", answer["reply"])]
    (settings,) = db.execute("SELECT settings FROM sessions").fetchone()
    assert json.loads(settings)["system_prompt"] == SYSTEM

    found = runner.invoke(app, ["history", "PLANET"])
    assert found.exit_code == 0
    assert found.stdout == f"chat {chat} (What is 48 + 37?): Reverse the word planet.\n"
    assert runner.invoke(app, ["history", "nowhere"]).stdout.startswith("nothing in the history")
