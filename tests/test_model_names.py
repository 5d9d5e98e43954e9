"""Model names as every command takes them (issue 65, items 13 and 16): a short name of the
shipped catalogue becomes its mlx-community repo, a preset of presets.yaml its model and
settings, a local path or a full hub id is taken as written, and a name that is none of these
is refused with the closest names. All offline: the catalogue is re-read here with the csv
module (the oracle), nothing is fetched."""

from __future__ import annotations

import csv
import json
import plistlib
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from macbatch.batch.spec import load_job_file
from macbatch.cli import app
from macbatch.models.names import UnknownModel, resolve
from macbatch.models.presets import PresetError, read_presets
from tests.support.job_files import write_job

CATALOGUE = Path(__file__).resolve().parents[1] / "macbatch" / "models" / "shortnames.csv"
runner = CliRunner()


def _rows() -> list[dict[str, str]]:
    lines = [line for line in CATALOGUE.read_text().splitlines() if not line.startswith("#")]
    names = ["name", "aliases", "family", "params_b", "bits", "repo"]
    return list(csv.DictReader(lines, fieldnames=names))


@pytest.fixture
def presets(tmp_path, monkeypatch) -> Path:
    """A presets.yaml in a config directory of the test's own."""
    monkeypatch.setenv("MACBATCH_HOME", str(tmp_path))
    path = tmp_path / "presets.yaml"
    path.write_text(
        "terse:\n  model: qwen3:0.6b\n  system: One word only.\n  temperature: 0\n"
        "  max_tokens: 7\nlocal:\n  model: demo\n"
    )
    return path


def test_the_catalogue_is_sound() -> None:
    rows = _rows()
    assert 20 <= len(rows) <= 40
    names = [r["name"] for r in rows] + [a for r in rows for a in r["aliases"].split()]
    assert len(names) == len(set(names)), "a short name or alias is given twice"
    for row in rows:
        assert re.fullmatch(r"mlx-community/[\w.-]+", row["repo"]), row
        assert re.fullmatch(r"[a-z0-9.-]+:[a-z0-9.-]+", row["name"]), row
        assert resolve(row["name"], {}).model == row["repo"]
        for alias in row["aliases"].split():
            assert resolve(alias, {}).model == row["repo"]


def test_short_names_resolve_and_literal_names_win(tmp_path, monkeypatch) -> None:
    assert resolve("Qwen3:0.6B", {}).model == "mlx-community/Qwen3-0.6B-4bit"  # any case
    assert resolve("gemma3", {}).model == "mlx-community/gemma-3-4b-it-4bit"
    assert resolve("someone/qwen3", {}).model == "someone/qwen3"  # a full id as written
    assert resolve("demo", {}).model == "demo"
    folder = tmp_path / "gemma3"  # a local folder named like a short name is that folder
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve("gemma3", {}).model == "gemma3"
    with pytest.raises(UnknownModel, match=r"did you mean 'qwen3:1\.7b'"):
        resolve("qwen3:1.8b", {})
    with pytest.raises(UnknownModel, match="did you mean 'demo'"):
        resolve("dmeo", {})


def test_models_available_lists_the_catalogue_offline() -> None:
    listed = runner.invoke(app, ["models", "--available", "--json"])
    assert listed.exit_code == 0, listed.output
    shown = json.loads(listed.stdout)
    rows = _rows()
    assert [(s["name"], s["repo"]) for s in shown] == [(r["name"], r["repo"]) for r in rows]
    for s, r in zip(shown, rows, strict=True):  # the memory: parameters x (bits + scales)
        bits = int(r["bits"])
        assert s["weights_bytes"] == int(round(float(r["params_b"]) * 1e9) * (bits + 0.5) / 8)
    table = runner.invoke(app, ["models", "--available"])
    assert "mlx-community/Qwen3-0.6B-4bit" in table.stdout and "0.3 GiB" in table.stdout


def test_every_command_takes_a_short_name() -> None:
    plist = runner.invoke(app, ["serve", "-m", "qwen3:0.6b", "--print-launchd-plist"])
    assert plist.exit_code == 0, plist.output
    assert (
        "mlx-community/Qwen3-0.6B-4bit" in plistlib.loads(plist.stdout.encode())["ProgramArguments"]
    )
    for command in (["ask", "hi"], ["chat"], ["serve"], ["bench"]):
        refused = runner.invoke(app, [*command, "-m", "gemma4:1b"])
        assert refused.exit_code == 2, (command, refused.output)
        assert "gemma3:1b" in refused.output, command


def test_presets_are_model_names(presets) -> None:
    found = read_presets(presets)
    assert found["terse"].system == "One word only."
    terse = resolve("terse")
    assert terse.model == "mlx-community/Qwen3-0.6B-4bit"  # its model, itself a short name
    assert terse.preset is not None and terse.preset.sampling() == {
        "temperature": 0,
        "max_tokens": 7,
    }
    listed = runner.invoke(app, ["presets"])
    assert listed.exit_code == 0 and re.search(
        r"terse\s+qwen3:0\.6b\s+system_prompt=", listed.stdout
    )


def test_a_job_file_names_a_short_name_or_a_preset(presets, tmp_path) -> None:
    path = write_job(
        tmp_path,
        """
        model: terse
        jobs:
          - name: a
            prompts: ["hi"]
          - name: b
            model: gemma3:1b
            system: Be brief.
            sampling: {temperature: 0.5}
            prompts: ["hi"]
          - name: c
            prompts: ["hi"]
            sampling: {max_tokens: 3}
        """,
    )
    a, b, c = load_job_file(path).jobs
    assert a.model == c.model == "mlx-community/Qwen3-0.6B-4bit"
    assert a.system == "One word only." and a.sampling["max_tokens"] == 7
    assert a.sampling["temperature"] == 0
    assert c.sampling["max_tokens"] == 3  # the job's own wins over the preset's
    assert b.model == "mlx-community/gemma-3-1b-it-4bit" and b.system == "Be brief."
    assert b.sampling["temperature"] == 0.5


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ("x: [1]\n", "give at least `model: NAME`"),
        ("x:\n  model: demo\n  temprature: 1\n", "unknown key(s) temprature"),
        ("x:\n  model: demo\n  temperature: -1\n", "temperature"),
        ("a/b:\n  model: demo\n", "no '/'"),
    ],
)
def test_a_wrong_preset_is_named(presets, text, wrong) -> None:
    presets.write_text(text)
    with pytest.raises(PresetError, match=re.escape(wrong)):
        read_presets(presets)
    refused = runner.invoke(app, ["ask", "-m", "x", "hi"])
    assert refused.exit_code == 2
    assert str(presets) in re.sub(r"[\s│╭╮╰╯─]", "", refused.output)  # at any wrapping width
