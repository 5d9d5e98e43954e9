"""``macbatch pull`` / ``rm`` / ``models`` against a local stand-in of the hub's HTTP API
(``HF_ENDPOINT`` pointed at it; the commands run as child processes, as a user runs them):
the files arrive whole (re-read against the source), with a progress bar of bytes, speed and
time left; a dropped transfer resumes from the bytes already written (a ranged GET); a file
whose bytes do not match the declared sha256 is refused and removed."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hub_standin import COMMIT, Hub, running
from tests.support.tiny import save_model

REPO = "acme/tiny-chat"
BIG = "padding.safetensors"  # past huggingface-hub's 10 MiB write chunk, so a cut leaves bytes
CHUNK = 10 * 2**20


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    folder = save_model(tmp_path / "source", arch="qwen3")
    (folder / BIG).write_bytes(os.urandom(CHUNK + 2 * 2**20))
    return folder


def macbatch(endpoint: str, home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(home), "MACBATCH_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "macbatch", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def snapshot(home: Path) -> Path:
    return home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT


def test_pull_downloads_every_file_with_progress_and_says_how_to_use_it(
    source: Path, tmp_path: Path
) -> None:
    hub = Hub(REPO, source)
    with running(hub) as url:
        done = macbatch(url, tmp_path / "home", "pull", REPO)
    assert done.returncode == 0, done.stderr
    for path in source.iterdir():
        assert (snapshot(tmp_path / "home") / path.name).read_bytes() == path.read_bytes()
    total = sum(p.stat().st_size for p in source.iterdir())
    # bytes of the total, [elapsed<left, speed]
    bar = rf"{total / 1e6:.1f}MB/{total / 1e6:.1f}MB \[\d\d:\d\d<\d\d:\d\d, [\d.]+[kM]?B/s\]"
    assert re.search(bar, done.stderr), done.stderr[-500:]
    assert f"macbatch chat --model {REPO}" in done.stdout


def test_a_dropped_transfer_resumes_from_the_bytes_written(source: Path, tmp_path: Path) -> None:
    hub = Hub(REPO, source, cut_after={BIG: CHUNK + 4096})
    with running(hub) as url:
        done = macbatch(url, tmp_path / "home", "pull", REPO)
    assert done.returncode == 0, done.stderr
    gets = [rng for method, path, rng in hub.requests if method == "GET" and path.endswith(BIG)]
    assert gets == [None, f"bytes={CHUNK}-"]  # the second asks only for the rest
    assert (snapshot(tmp_path / "home") / BIG).read_bytes() == (source / BIG).read_bytes()


def test_a_bad_checksum_is_refused_and_the_file_removed(source: Path, tmp_path: Path) -> None:
    hub = Hub(REPO, source, corrupt={"model.safetensors"})
    with running(hub) as url:
        done = macbatch(url, tmp_path / "home", "pull", REPO)
        assert done.returncode == 1
        assert "model.safetensors of acme/tiny-chat arrived damaged" in done.stderr
        assert not (snapshot(tmp_path / "home") / "model.safetensors").exists()
        hub.corrupt.clear()
        again = macbatch(url, tmp_path / "home", "pull", REPO)
    assert again.returncode == 0, again.stderr
    got = (snapshot(tmp_path / "home") / "model.safetensors").read_bytes()
    assert got == (source / "model.safetensors").read_bytes()


def test_models_lists_a_pulled_model_and_rm_removes_it(source: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running(Hub(REPO, source)) as url:
        assert macbatch(url, home, "pull", REPO).returncode == 0
        listed = json.loads(macbatch(url, home, "models", "--json").stdout)
        [row] = [r for r in listed if r["name"] == REPO]
        on_disk = sum(p.stat().st_size for p in source.glob("*.safetensors"))
        assert row["size_bytes"] == on_disk and row["architecture"] == "qwen3"
        assert row["tasks"] == ["generate", "embed", "score"] and row["fits_in_memory"]
        kept = macbatch(url, home, "rm", REPO, stdin="n\n")
        assert kept.returncode == 1 and snapshot(home).exists()
        assert "remove acme/tiny-chat (0.01 GiB)?" in kept.stdout
        removed = macbatch(url, home, "rm", REPO, "--yes")
        assert removed.returncode == 0 and not snapshot(home).exists()
        listed = json.loads(macbatch(url, home, "models", "--json").stdout)
        assert REPO not in [r["name"] for r in listed]


def test_a_file_list_climbing_out_of_the_cache_deletes_nothing(
    source: Path, tmp_path: Path
) -> None:
    """Issue 61: a tree row naming ``../../../../x/notes.txt`` (the commit lists no such file)
    with an LFS digest once made the checksum check delete that file outside the cache."""
    home = tmp_path / "home"
    outside = home / "x" / "notes.txt"
    outside.parent.mkdir(parents=True)
    outside.write_text("the user's notes")
    row = {"type": "file", "oid": "0" * 40, "size": 16, "path": "../../../../x/notes.txt"}
    row["lfs"] = {"oid": "1" * 64, "size": 16, "pointerSize": 134}
    with running(Hub(REPO, source, listed_only=[row])) as url:
        done = macbatch(url, home, "pull", REPO)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "a path outside the model's folder" in done.stderr
    assert outside.read_text() == "the user's notes"


@pytest.mark.parametrize("repo", ["../x", "a/..", "a/b\nc", "a/" + "b" * 3000, "abc"])
def test_a_bad_model_id_is_refused_with_the_rule(repo: str, tmp_path: Path) -> None:
    done = macbatch("http://127.0.0.1:9", tmp_path / "home", "pull", repo)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "is not a Hugging Face model id: OWNER/NAME" in done.stderr
    assert len(done.stderr) < 500


def test_an_unreachable_hub_fails_at_once_with_what_to_check(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    done = macbatch(endpoint, tmp_path / "home", "pull", REPO)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot reach the hub at {endpoint}" in done.stderr
    assert "Retrying" not in done.stderr  # no round of retries first


@pytest.mark.parametrize("model", ["demo", REPO])
def test_rm_before_any_download_says_so_in_its_own_words(tmp_path: Path, model: str) -> None:
    """Issue 65: with no hub cache yet `rm` passed on huggingface-hub's advice about its
    `cache_dir` argument and HF_HUB_CACHE; the demo model, bundled, is never in that cache."""
    done = macbatch("http://127.0.0.1:9", tmp_path / "home", "rm", model, "--yes")
    assert done.returncode == 1
    assert "cache_dir" not in done.stderr and "HF_HUB_CACHE" not in done.stderr
    if model == "demo":
        assert "part of macbatch" in done.stderr
    else:
        assert f"{model!r} is not downloaded" in done.stderr


def test_pull_takes_a_short_name(tmp_path: Path) -> None:
    """``pull qwen3:0.6b`` fetches the catalogue's repo (issue 65, item 13); a misspelled short
    name gets the closest ones and fetches nothing."""
    repo = "mlx-community/Qwen3-0.6B-4bit"
    source = save_model(tmp_path / "source", arch="qwen3")
    with running(Hub(repo, source)) as url:
        done = macbatch(url, tmp_path / "home", "pull", "qwen3:0.6b")
        typo = macbatch(url, tmp_path / "home2", "pull", "qwen3:0.7b")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "home" / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots"
    assert (folder / COMMIT / "config.json").read_bytes() == (source / "config.json").read_bytes()
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", typo.stderr).split())  # at any wrapping width
    assert typo.returncode == 2 and "did you mean 'qwen3:1.7b' or 'qwen3:0.6b'" in said
    assert not (tmp_path / "home2" / "hub").exists()
