"""The top-level command line: doctor, models, bench (the front ends test their own commands)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from macbatch.cli import app
from macbatch.commands.workload import run_pooling_workload, run_workload, synthetic_prompts
from macbatch.engine import Engine, EngineConfig

runner = CliRunner()


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("chat", "run", "serve", "doctor", "models", "bench"):
        assert re.search(rf"│ {command}\s", result.output), command


def test_doctor_reports_the_attention_path():
    import mlx.core as mx

    from macbatch.metal import attention_backend

    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0
    lines = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in result.output.splitlines()
    )
    assert lines["attention"] == attention_backend()
    if not mx.metal.is_available():  # doctor built and proved the CPU kernel (g++ is installed)
        assert lines["attention"] == "CPU kernel (self-test passed)"
        assert lines["cpu kernel"] == "built, self-test passed"
    assert lines["device"] == str(mx.default_device())
    demo = Engine.load("demo")
    stats = demo.stats()
    blocks = stats.kv_blocks_total
    cap = demo.config.max_num_seqs * demo.info.max_model_len // demo.config.block_size
    assert blocks <= stats.kv_blocks_cap == cap
    assert lines["kv cache (demo)"].startswith(
        f"{blocks:,} blocks of 16 tokens = {blocks * 16:,} tokens, "
        f"{sum(a.nbytes for a in demo.runner.store.arrays()) / 2**20:,.1f} MiB, 0.0 MiB used ("
    )


def test_models_prints_a_table(tmp_path, monkeypatch):
    """Name, architecture, quantization, size on disk and context, for the demo model and a
    4-bit model in a Hugging Face cache laid out as the hub client writes it."""
    import json

    snapshot = tmp_path / "models--mlx-community--Tiny-4bit" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    config = {
        "model_type": "qwen3",
        "max_position_embeddings": 40960,
        "quantization": {"group_size": 64, "bits": 4},
    }
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model.safetensors").write_bytes(b"\0" * 3 * 2**20)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setattr("huggingface_hub.utils._cache_manager.HF_HUB_CACHE", str(tmp_path))
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0, result.output
    rows = [re.split(r"\s{2,}", line.strip()) for line in result.output.splitlines()]
    header = ["NAME", "ARCHITECTURE", "QUANTIZATION", "SIZE", "CONTEXT", "TASKS", "FITS"]
    assert rows[0] == header
    tasks = "generate,embed,score"
    assert rows[1] == ["demo", "llama", "none", rows[1][3], "512", tasks, "yes"]
    tiny = ["mlx-community/Tiny-4bit", "qwen3", "4-bit (group 64)", "3.0 MiB", "40,960"]
    assert rows[2] == [*tiny, tasks, "yes"]


def test_bench_runs_a_model_from_disk(tiny_model_path):
    args = [
        "bench",
        "--model",
        str(tiny_model_path),
        "--requests",
        "3",
        "--max-tokens",
        "4",
        "--min-prompt",
        "5",
        "--max-prompt",
        "9",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert re.search(r"3 requests, \d+ prompt tokens, 4 new", result.output)
    assert "generated tok/s" in result.output


def test_bench_speculates_with_a_draft_model_and_reports_acceptance(tiny_model_path):
    model = str(tiny_model_path)
    args = ["bench", "--model", model, "--requests", "2", "--max-tokens", "8"]
    args += ["--min-prompt", "5", "--max-prompt", "9", "--draft-model", model]
    result = runner.invoke(app, [*args, "--num-speculative-tokens", "3"])
    assert result.exit_code == 0, result.output
    assert re.search(r"speculative: 100% of \d+ drafted tokens accepted", result.output)


def test_speculative_options_are_checked_before_loading():
    for extra, message in [
        (["--speculative", "eagle"], "speculative must be one of"),
        (["--speculative", "draft"], "needs a draft model"),
        (["--speculative", "ngram", "--draft-model", "x"], "drafts only for --speculative auto"),
        (["--num-speculative-tokens", "0"], "num_speculative_tokens must be an integer"),
    ]:
        result = runner.invoke(app, ["bench", "--model", "/no/such/model", *extra])
        assert result.exit_code == 2, result.output
        words = " ".join(re.sub("[│╭╮╰╯─]", " ", result.output).split())  # any wrapping width
        assert message in words
        assert "loading" not in words


def test_bench_bad_model_is_a_clear_error():
    result = runner.invoke(app, ["bench", "--model", "/no/such/model"])
    assert result.exit_code == 1
    assert "no model directory at /no/such/model" in result.output


def test_workload_accounting(tiny_model_path):
    """Every request makes max_tokens; every prompt token and every generated token but the last
    of each request goes through exactly one step."""
    engine = Engine.load(
        str(tiny_model_path), EngineConfig(num_blocks=64, max_num_batched_tokens=16)
    )
    prompts = synthetic_prompts(5, 3, 30, engine.info.model.vocab_size, seed=1)
    result = run_workload(engine, prompts, max_tokens=6)
    assert result.generated_tokens == 5 * 6
    assert len(result.first_token) == 5
    assert sum(result.step_tokens) == result.prompt_tokens + 5 * (6 - 1)
    assert max(result.step_tokens) <= 16


def test_bench_with_prompts_that_do_not_fit_fails_instead_of_printing_rates():
    args = ["bench", "--model", "demo", "--requests", "3", "--min-prompt", "600"]
    result = runner.invoke(app, [*args, "--max-prompt", "700", "--max-tokens", "4"])
    assert result.exit_code == 1
    assert "3 of 3 requests failed" in result.output
    assert "no request succeeded" in result.output
    assert "tok/s" not in result.output


def test_workload_counts_failed_requests_apart(tiny_model_path):
    """Requests that cannot fit are reported, and the rates count only the ones that ran."""
    engine = Engine.load(str(tiny_model_path), EngineConfig(num_blocks=4, block_size=8))
    prompts = [[7] * 10, [7] * 40, [8] * 12]  # the pool holds 32 tokens
    result = run_workload(engine, prompts, max_tokens=4)
    assert result.succeeded == 2 and len(result.failures) == 1
    assert "leaves no room for a reply" in result.failures[0]
    assert result.prompt_tokens == 22 and result.generated_tokens == 8


def _macbatch(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line as users run it (``python -m macbatch``), with no terminal size set."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["MACBATCH_NO_REEXEC"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "macbatch", *args], capture_output=True, text=True, env=env
    )


def test_version_and_short_help_on_every_command():
    import macbatch

    assert _macbatch("--version").stdout.strip() == f"macbatch {macbatch.__version__}"
    for command in ([], ["run"], ["chat"], ["serve"], ["bench"], ["models"], ["doctor"]):
        result = _macbatch(*command, "-h")
        assert result.returncode == 0, (command, result.stderr)
        assert result.stdout.lstrip().startswith(f"Usage: macbatch {' '.join(command)}".strip())


def test_run_help_names_values_plainly():
    text = _macbatch("run", "--help").stdout
    assert "Usage: macbatch run [OPTIONS] FILE" in text
    assert "{file}" not in text and "<bool>" not in text and "<list[str]>" not in text
    assert re.search(r"--max-in-flight\s+INTEGER", text)


def test_help_states_the_engines_draft_lengths_without_loading_mlx():
    """``--num-speculative-tokens``'s help quotes the engine's own defaults, and the command
    line still starts without importing MLX (``--help`` stays instant)."""
    from macbatch.engine import DEFAULT_SPECULATIVE_TOKENS

    text = " ".join(_macbatch("serve", "--help").stdout.replace("│", " ").split())
    quoted = ", ".join(f"{m} {n}" for m, n in DEFAULT_SPECULATIVE_TOKENS.items())
    assert f"(default: {quoted})." in text
    probe = "import sys, macbatch.cli; print('mlx.core' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )


def test_bench_embeds(tiny_model_path):
    args = ["bench", "--model", str(tiny_model_path), "--embed", "--requests", "3"]
    result = runner.invoke(app, [*args, "--min-prompt", "5", "--max-prompt", "9"])
    assert result.exit_code == 0, result.output
    assert re.search(r"3 inputs to embed, \d+ tokens", result.output)
    assert re.search(r"tok/s embedded, [\d.,]+ inputs/s, \d+ engine steps", result.output)


def test_pooling_workload_accounting(tiny_model_path):
    """Every prompt that fits is embedded once and every one of its tokens goes through one
    step; one that does not fit is counted as a failure."""
    engine = Engine.load(str(tiny_model_path), EngineConfig(num_blocks=4, block_size=8))
    prompts = [[7] * 10, [7] * 40, [8] * 12]  # the pool holds 32 tokens
    result, vectors = run_pooling_workload(engine, prompts)
    assert len(vectors) == 2 and result.succeeded == 2 and len(result.failures) == 1
    assert result.prompt_tokens == 22 == sum(result.step_tokens)


@pytest.mark.skipif(sys.platform != "linux", reason="the BLAS re-exec is Linux's")
def test_the_command_line_works_in_a_folder_holding_a_macbatch_directory(tmp_path):
    """Issue 65: the re-exec ran `python -m macbatch`, which puts the current directory first on
    the import path, so an empty `macbatch/` there (the folder above a clone) shadowed the
    package. Run as the console script runs, from such a folder, with the re-exec on."""
    from macbatch.blas import choose

    if choose().path is None:
        pytest.skip("no OpenBLAS to preload here: the command line does not re-execute")
    folder = tmp_path / "x"
    (folder / "macbatch").mkdir(parents=True)
    # a package of that name (an empty folder shadows an editable install the same way: its
    # finder comes after the path's, which takes the folder as a namespace package)
    (folder / "macbatch" / "__init__.py").write_text("")
    script = tmp_path / "bin" / "macbatch"  # what pip writes for [project.scripts]
    script.parent.mkdir()
    script.write_text("import sys\nfrom macbatch.cli import main\nsys.exit(main())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MACBATCH_NO_REEXEC", "LD_PRELOAD")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, str(script), "--version"],
        cwd=folder,
        capture_output=True,
        text=True,
        env=env,
    )
    import macbatch

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"macbatch {macbatch.__version__}"


def test_shared_options_say_nothing_of_another_command():
    """Issue 65: --kv-bits is declared once for chat, serve, bench and run; its help talked of
    `run`'s job file in chat --help."""
    from macbatch.cli import command

    for name, sub in command().commands.items():
        for param in sub.params:
            if "--kv-bits" in getattr(param, "opts", []) and name != "run":
                assert "`run`" not in (param.help or ""), (name, param.help)


def test_doctor_describes_an_adapter(tmp_path):
    """Rank, targets and bytes of an adapter mlx-lm's tuner made; a folder of none fails."""
    from tests.support.lora import ATTENTION, save_adapter

    adapter = save_adapter(tmp_path / "attn", seed=1, keys=ATTENTION, rank=4)
    result = runner.invoke(app, ["doctor", "--adapter", str(adapter)])
    assert result.exit_code == 0, result.output
    lines = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in result.output.splitlines()
    )
    assert lines["format"] == "mlx-lm lora, rank 4, scale 2"
    assert lines["targets"] == "k_proj, o_proj, q_proj, v_proj (8 layers)"
    # 2 layers x (q: 64x4 + 4x64, k: 64x4 + 4x32, v: the same, o: 64x4 + 4x64) float32
    assert lines["bytes"] == f"{2 * 4 * (512 + 384 + 384 + 512):,}"
    missing = runner.invoke(app, ["doctor", "--adapter", str(tmp_path / "none")])
    assert missing.exit_code == 1 and "no adapter_config.json" in missing.output
