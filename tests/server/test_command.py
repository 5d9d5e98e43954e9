"""``macbatch serve`` as users run it: option checks, the launchd plist, a taken port, and a
real process stopped by SIGTERM/SIGINT that exits 0."""

from __future__ import annotations

import plistlib
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from macbatch.server.command import serve_command
from tests.support.serve_process import start_server


def _invoke(args: list[str], env: dict[str, str] | None = None):
    app = typer.Typer()
    app.command()(serve_command)
    return CliRunner().invoke(app, args, env=env)


def test_non_loopback_host_needs_a_key() -> None:
    result = _invoke(["--host", "0.0.0.0", "--print-launchd-plist"], env={"MACBATCH_API_KEY": ""})
    assert result.exit_code == 2
    assert "--api-key" in result.output


@pytest.mark.parametrize("extra", [["--api-key", "k"], ["--insecure"]])
def test_non_loopback_host_with_key_or_insecure(extra: list[str], tmp_path: Path) -> None:
    env = {"MACBATCH_HOME": str(tmp_path), "MACBATCH_API_KEY": ""}
    result = _invoke(["--host", "0.0.0.0", "--print-launchd-plist", *extra], env=env)
    assert result.exit_code == 0, result.output


def test_launchd_plist_runs_the_same_command(tmp_path: Path) -> None:
    env = {"MACBATCH_HOME": str(tmp_path), "MACBATCH_API_KEY": ""}
    args = ["--model", "some/model", "--host", "::1", "--port", "9123", "--max-queue", "7",
            "--kv-bits", "4", "--indexer-keys", "fp8", "--keep-volatile-prompt-lines"]  # fmt: skip
    result = _invoke([*args, "--api-key", "s3cret", "--print-launchd-plist"], env=env)
    assert result.exit_code == 0, result.output
    job = plistlib.loads(result.stdout.encode())
    assert job["Label"] == "com.macbatch.serve"
    assert job["RunAtLoad"] is True
    assert job["EnvironmentVariables"]["MACBATCH_API_KEY"] == "s3cret"
    assert "s3cret" not in job["ProgramArguments"]  # not visible in `ps`
    assert Path(job["StandardErrorPath"]).parent == tmp_path / "logs"
    program, command, *options = job["ProgramArguments"]
    assert command == "serve" and Path(program).is_absolute()
    assert options[options.index("--kv-bits") + 1] == "4"
    assert options[options.index("--indexer-keys") + 1] == "fp8"
    assert "--keep-volatile-prompt-lines" in options
    # Fixpoint: the plist's own arguments (and environment) describe the same job.
    again = _invoke([*options, "--print-launchd-plist"], env={**env, **job["EnvironmentVariables"]})
    assert again.exit_code == 0, again.output
    assert again.stdout == result.stdout


def test_launchd_plist_sets_the_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service logs under MACBATCH_HOME, so it must also keep its data there: launchd starts
    it without the shell's environment (issue 61, item 13)."""
    monkeypatch.chdir(tmp_path)
    env = {"MACBATCH_HOME": "home", "MACBATCH_API_KEY": ""}  # relative: launchd starts in /
    result = _invoke(["--print-launchd-plist"], env=env)
    assert result.exit_code == 0, result.output
    job = plistlib.loads(result.stdout.encode())
    assert job["EnvironmentVariables"] == {"MACBATCH_HOME": str(tmp_path / "home")}
    assert Path(job["StandardErrorPath"]).parent == tmp_path / "home" / "logs"


def test_launchd_plist_without_data_directory_sets_no_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("MACBATCH_HOME", raising=False)
    result = _invoke(["--print-launchd-plist"], env={"MACBATCH_API_KEY": ""})
    assert result.exit_code == 0, result.output
    assert "EnvironmentVariables" not in plistlib.loads(result.stdout.encode())


def test_launchd_plist_has_absolute_paths(
    tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """launchd starts a job in /: a model given relative to here must still be found."""
    monkeypatch.chdir(tiny_model_path.parent)
    env = {"MACBATCH_HOME": str(tmp_path), "MACBATCH_API_KEY": ""}
    result = _invoke(["--model", tiny_model_path.name, "--print-launchd-plist"], env=env)
    assert result.exit_code == 0, result.output
    job = plistlib.loads(result.stdout.encode())
    arguments = job["ProgramArguments"]
    assert arguments[arguments.index("--model") + 1] == str(tiny_model_path.resolve())
    assert job["WorkingDirectory"] == str(tiny_model_path.parent.resolve())
    assert Path(job["StandardErrorPath"]).is_absolute()


def test_bad_kv_bits_is_refused_before_loading() -> None:
    result = _invoke(["--kv-bits", "3", "--print-launchd-plist"])
    assert result.exit_code == 2
    assert "kv_bits must be 8, 4 or None" in result.output


def test_bad_indexer_keys_is_refused_before_loading() -> None:
    result = _invoke(["--indexer-keys", "fp4", "--print-launchd-plist"])
    assert result.exit_code == 2
    assert "indexer_keys must be 'fp8' or None" in result.output


def test_bad_log_level() -> None:
    result = _invoke(["--log-level", "loud", "--print-launchd-plist"])
    assert result.exit_code == 2
    assert "--log-level" in result.output


def test_taken_port_fails_before_loading() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        result = _invoke(["--model", "/no/such/model", "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_gracefully(tiny_model_path: Path, sig: int) -> None:
    """In flight at the signal: a short request finishes; streams longer than the shutdown
    timeout end with a final "abort" chunk and [DONE] (the openai client sees a normal end), a
    non-streaming one gets a JSON 503; the process exits 0."""
    import openai

    # no speculation: prompt lookup on the tiny model's repetitive replies wrote all 4,000
    # tokens within the 2 s on an idle machine; one token per step they take several times it
    process, url = start_server(tiny_model_path, "--shutdown-timeout", "2", "--speculative", "off")
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    body = dict(model=str(tiny_model_path), prompt="how are you today?", temperature=0)
    try:
        with ThreadPoolExecutor(1) as pool:
            long = client.completions.create(**body, max_tokens=4000, stream=True)
            short = client.completions.create(**body, max_tokens=60, stream=True)
            first_long, first_short = next(iter(long)), next(iter(short))
            assert first_long.choices and first_short.choices
            whole = pool.submit(client.completions.create, **body, max_tokens=4000)
            time.sleep(0.5)  # the non-streaming request is in flight
            process.send_signal(sig)
            short_rest, long_rest = list(short), list(long)  # both end without an error
            assert short_rest[-1].choices[0].finish_reason in ("length", "stop")
            assert long_rest[-1].choices[0].finish_reason == "abort"
            with pytest.raises(openai.APIStatusError) as refused:
                whole.result(timeout=60)
        assert refused.value.status_code == 503
        assert refused.value.body["code"] == "server_shutdown"
        assert process.wait(timeout=30) == 0
        assert "macbatch serve: weights in float32: " in process.stderr.read()  # says why
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=1)
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()
