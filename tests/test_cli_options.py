"""Each engine knob is declared once, as a field of ``EngineKnobs``: the options of every command
that runs an engine, read from the click command tree users get, come from that table (its
flag, help, default and checks), no command declares one of its own, and ``--help`` shows the
table's help. serve's own options come from ``ServeSettings`` the same way."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from typer.testing import CliRunner

from macbatch.cli import app, command
from macbatch.commands.fields import flag_of
from macbatch.commands.options import EngineKnobs
from macbatch.engine import EngineConfig
from macbatch.server.command import ServeSettings

KNOBS = {f.name: f for f in dataclasses.fields(EngineKnobs)}
# the engine knobs each command offers (ask and doctor run the engine at its defaults)
OFFERED = {
    "serve": {
        "max_num_seqs", "kv_blocks", "kv_bits", "speculative", "draft_model",
        "num_speculative_tokens", "cache_dir", "cache_disk_gb", "no_disk_cache", "reranker",
        "no_self_check", "indexer_keys",
    },
    "run": {
        "max_num_seqs", "kv_bits", "speculative", "draft_model", "num_speculative_tokens",
        "cache_dir", "cache_disk_gb", "no_disk_cache", "no_self_check", "indexer_keys",
    },
    "chat": {
        "kv_blocks", "kv_bits", "speculative", "draft_model", "num_speculative_tokens",
        "cache_dir", "cache_disk_gb", "no_disk_cache", "no_self_check", "indexer_keys",
    },
    "bench": {"max_num_batched_tokens", "speculative", "draft_model", "num_speculative_tokens"},
    "ask": {"no_self_check"},
    "doctor": {"no_self_check"},
}  # fmt: skip
RENAMED = {("run", "max_num_seqs"): "--max-seqs", ("bench", "max_num_batched_tokens"): "--budget"}


def _options(name: str) -> list[Any]:
    """The command's options as ``macbatch`` builds them (typer's own copy of click's)."""
    commands = getattr(command(), "commands")  # noqa: B009 (a group: mypy sees a Command)
    return [p for p in commands[name].params if p.param_type_name == "option"]


@pytest.mark.parametrize("name", OFFERED)
def test_every_engine_option_comes_from_the_table(name: str) -> None:
    knob_flags = {n for f in KNOBS.values() for n in flag_of(f).names} | set(RENAMED.values())
    offered = set()
    for option in _options(name):
        if option.name not in KNOBS:  # the command's own: it must not reuse a knob's flag
            assert not knob_flags & {*option.opts, *option.secondary_opts}, option.opts
            continue
        offered.add(option.name)
        field, flag = KNOBS[option.name], flag_of(KNOBS[option.name])
        assert option.help == flag.help
        assert option.opts == [RENAMED.get((name, option.name), flag.names[0])]
        if (name, option.name) != ("run", "speculative"):  # run's: the job file's
            assert option.default == field.default
        for check in ("min", "max"):
            assert getattr(option, check) == flag.options.get(check)
        assert (option.callback is None) == ("callback" not in flag.options)
    assert offered == OFFERED[name]


def test_serve_options_are_its_settings_and_the_knobs() -> None:
    own = {"api_key", "print_launchd_plist", "print_systemd_unit", "install_service"}
    settings = {f.name: f for f in dataclasses.fields(ServeSettings)}
    for option in _options("serve"):
        if option.name in own or option.name in KNOBS:
            continue
        flag = flag_of(settings[option.name])
        assert option.help == flag.help
        assert option.opts[0] == flag.names[0].split("/")[0]
    assert {o.name for o in _options("serve")} == own | OFFERED["serve"] | set(settings)


def _words(text: str) -> str:
    """The words of a help text, without the box and the markdown marks (code, emphasis)."""
    return " ".join(re.sub(r"[│╭╮╰╯─`*]", " ", text).split())


@pytest.mark.parametrize("name", ["serve", "run", "chat", "bench"])
def test_help_shows_the_tables_help(name: str) -> None:
    """Each knob's help, as ``--help`` prints it (wide, so no line of it wraps into another
    column's text)."""
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    shown = _words(result.output).replace("  ", " ")
    for knob in OFFERED[name]:
        assert _words(flag_of(KNOBS[knob]).help) in shown, knob


def test_the_knobs_defaults_are_the_engines() -> None:
    """A knob the command line gives a number by default gives the engine's own default."""
    engine = EngineConfig()
    assert EngineKnobs().max_num_seqs == engine.max_num_seqs
    assert EngineKnobs().max_num_batched_tokens == engine.max_num_batched_tokens


def test_every_engine_field_has_its_doc() -> None:
    for field in dataclasses.fields(EngineConfig):
        assert field.metadata.get("doc"), field.name
