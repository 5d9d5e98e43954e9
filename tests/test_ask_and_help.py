"""The command line as a new user meets it (issue 50): `macbatch ask` streams a reply to stdout
(the prompt, text piped in, or both); `--help` reads well (reflowed text, no literal markup,
allowed values listed, optional arguments shown so, nothing suggested that fails outside a
checkout); a mistyped model gets a did-you-mean before anything is created; transformers'
too-long warning stays out of the output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from macbatch.engine import Engine, SamplingParams
from macbatch.session_settings import SessionSettings

REPO = Path(__file__).resolve().parents[1]


def macbatch(*args: str, cwd: Path = REPO, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`macbatch ARGS` in a child process, 200 columns wide (whatever the caller's terminal)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "COLUMNS": "200", "LINES": "50", "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "macbatch", *args],
        cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def demo_replies():
    """The oracle: the engine's own greedy replies, at a new chat's max_tokens."""
    engine = Engine.load("demo")
    params = SamplingParams(temperature=0.0, max_tokens=SessionSettings().max_tokens)

    def reply(text: str) -> str:
        return engine.generate([[{"role": "user", "content": text}]], params)[0].text

    return reply


def test_ask_streams_the_reply_to_stdout(demo_replies) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["ask", "--temperature", "0", "What is 48 + 37?"])
    assert result.exit_code == 0, result.output
    assert result.stdout == demo_replies("What is 48 + 37?") + "\n"

    piped = runner.invoke(app, ["ask", "--temperature", "0"], input="Reverse the word planet.\n")
    assert piped.exit_code == 0, piped.output
    assert piped.stdout == demo_replies("Reverse the word planet.") + "\n"

    both = runner.invoke(app, ["ask", "--temperature", "0", "Reverse the word"], input="planet\n")
    assert both.stdout == demo_replies("Reverse the word\n\nplanet") + "\n"

    nothing = runner.invoke(app, ["ask"], input="")
    assert nothing.exit_code == 1 and "nothing to ask" in nothing.stderr

    typo = runner.invoke(app, ["ask", "-m", "dmeo", "hi"])
    assert typo.exit_code == 2 and "did you mean 'demo'?" in typo.output


def test_help_reads_well() -> None:
    top = macbatch("--help")
    assert top.returncode == 0
    assert "``" not in top.stdout and "jobs/demo.yaml" not in top.stdout
    assert "macbatch chat" in top.stdout and "│ ask " in top.stdout
    # a docstring's line break is not a line break on screen
    assert "the packaged demo model, --models-dir folders and the Hugging Face hub cache" in (
        top.stdout
    )
    assert "(--embed: embedding throughput" in top.stdout

    doctor = macbatch("doctor", "--help")
    assert "Usage: macbatch doctor [OPTIONS] [MODEL]" in doctor.stdout
    for command in ("chat", "run", "serve"):
        text = macbatch(command, "--help").stdout
        assert "[8|4]" in text and "off, auto, ngram, draft, mtp, dflash, eagle3" in text, command
        assert "not available" not in text and "``" not in text, command
    serve = macbatch("serve", "--help").stdout
    assert "critical, error, warning, info, debug, trace" in serve
    run = macbatch("run", "--help").stdout
    assert "<job>.jsonl" in run and "<job>.csv" in run and "<job>.errors.jsonl" in run
    assert "? for all keys" not in macbatch("chat", "--help").stdout


def test_a_mistyped_model_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text(json.dumps({"q": "hi"}) + "\n")
    (tmp_path / "job.yaml").write_text(
        "model: dmeo\njobs:\n  - name: a\n    input: rows.jsonl\n    template: '{q}'\n"
    )
    result = macbatch("run", str(tmp_path / "job.yaml"), cwd=tmp_path)
    assert result.returncode == 1
    assert "did you mean 'demo'?" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml", "rows.jsonl"]


def test_no_tokenizer_warning_for_a_prompt_longer_than_the_context(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text(json.dumps({"q": "what is 1 plus 1? " * 400}) + "\n")
    (tmp_path / "job.yaml").write_text(
        "model: demo\njobs:\n  - name: a\n    input: rows.jsonl\n    template: '{q}'\n"
    )
    result = macbatch("run", str(tmp_path / "job.yaml"), "--headless", cwd=tmp_path)
    assert result.returncode == 3, result.stderr  # the row failed: too long
    (error,) = [
        json.loads(x) for x in (tmp_path / "out" / "a.errors.jsonl").read_text().splitlines()
    ]
    assert "512" in error["error"]["message"]
    assert "Token indices sequence length" not in result.stderr + result.stdout
