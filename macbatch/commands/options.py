"""Command-line options that several commands share, defined once."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import typer

from macbatch.engine import (  # MLX-free: --help
    DEFAULT_SPECULATIVE_TOKENS,
    SPECULATIVE_MODES,
    check_speculative,
)

# The values --kv-bits takes, as `metal.quant.KV_BITS` (which imports MLX) checks them.
KV_BITS_CHOICES = "8|4"


def _check_kv_bits(value: int | None) -> int | None:
    from macbatch.metal.quant import check_kv_quantization  # MLX: not on `macbatch --help`

    try:
        check_kv_quantization(value, None)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def kv_bits_option() -> Any:
    """``--kv-bits 8|4``: quantized KV pages (checked before any model loads)."""
    return typer.Option(
        None,
        "--kv-bits",
        callback=_check_kv_bits,
        show_default=False,
        metavar=f"[{KV_BITS_CHOICES}]",
        help="Store the KV cache in 8 or 4 bits: about 1.9x or 3.5x the context per GiB of "
        "cache (default: float pages, or for `run` the job file's kv_bits; see docs/kernel.md "
        "for accuracy).",
    )


def _check_speculative(value: str | None) -> str | None:
    try:
        if value is not None:
            check_speculative(value, 1)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def speculative_option(default: str | None = "auto") -> Any:
    """``--speculative auto|off|ngram|draft|mtp``: speculative decoding (docs/speculative.md);
    ``default`` None: the command has its own default (``run``: the job file's)."""
    return typer.Option(
        default,
        "--speculative",
        callback=_check_speculative,
        metavar=f"[{'|'.join(SPECULATIVE_MODES)}]",
        help="Speculative decoding: auto (mtp where the checkpoint has MTP heads, else off), "
        "mtp (the checkpoint's own multi-token-prediction heads: Qwen3.5, Qwen3.6, Qwen3-Next), "
        "ngram (drafts copied from the prompt and reply: extraction, summaries, code edits), "
        "draft (a small model, --draft-model), off. Outputs are the same either way; see "
        "docs/speculative.md.",
    )


def draft_model_option() -> Any:
    """``--draft-model PATH``: the drafter of ``--speculative draft`` (implies it)."""
    return typer.Option(
        None,
        "--draft-model",
        show_default=False,
        help="A small model with the same tokenizer that drafts tokens (a local directory or a "
        "Hugging Face id); implies --speculative draft.",
    )


def _check_num_speculative_tokens(value: int | None) -> int | None:
    try:
        check_speculative("off", value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def num_speculative_tokens_option() -> Any:
    """``--num-speculative-tokens K``: the most tokens drafted per request per step."""
    return typer.Option(
        None,
        "--num-speculative-tokens",
        callback=_check_num_speculative_tokens,
        show_default=False,
        help="The most tokens drafted per request per step (each request's length adapts to "
        "how many of its drafts are accepted). Default: "
        f"{DEFAULT_SPECULATIVE_TOKENS['ngram']} for ngram, "
        f"{DEFAULT_SPECULATIVE_TOKENS['draft']} for draft, "
        f"{DEFAULT_SPECULATIVE_TOKENS['mtp']} for mtp.",
    )


def speculative_config(
    mode: str, draft_model: str | None, num_tokens: int | None
) -> dict[str, Any]:
    """The ``EngineConfig`` fields of the three speculative options; ``--draft-model`` alone
    means ``--speculative draft``, and a draft mode without a model (or a model for another
    mode) is refused."""
    if draft_model and mode in ("off", "auto"):
        mode = "draft"
    if draft_model and mode != "draft":
        raise typer.BadParameter(
            f"a draft model drafts only for --speculative draft, not {mode}",
            param_hint="--draft-model",
        )
    if mode == "draft" and not draft_model:
        raise typer.BadParameter(
            "--speculative draft needs a draft model: --draft-model PATH",
            param_hint="--speculative",
        )
    return {"speculative": mode, "draft_model": draft_model, "num_speculative_tokens": num_tokens}


def cache_dir_option() -> Any:
    """``--cache-dir PATH``: where the disk tier keeps KV blocks."""
    return typer.Option(
        None,
        "--cache-dir",
        show_default=False,
        help="Where prompt KV blocks are kept on disk across restarts (default: kv-cache/ in the "
        "data directory; see docs/engine.md, 'The disk tier').",
    )


def cache_disk_gb_option() -> Any:
    """``--cache-disk-gb N``: the disk tier's byte cap."""
    return typer.Option(
        None,
        "--cache-disk-gb",
        min=0.0,
        show_default=False,
        help="GiB of disk the KV block cache may use, least recently used evicted first "
        "(default: 20, or a tenth of the free space if smaller).",
    )


def no_disk_cache_option() -> Any:
    """``--no-disk-cache``: RAM prefix cache only."""
    return typer.Option(
        False,
        "--no-disk-cache",
        help="Keep the prefix cache in RAM only: write no KV blocks to disk.",
    )


def disk_cache_config(
    cache_dir: Path | str | None, cache_disk_gb: float | None, no_disk_cache: bool
) -> dict[str, Any]:
    """The ``EngineConfig`` fields of the disk-cache options: on by default, under the data
    directory."""
    if no_disk_cache:
        return {"disk_cache_dir": None, "disk_cache_bytes": None}
    from macbatch.config import data_dir

    directory = Path(cache_dir).expanduser() if cache_dir else data_dir() / "kv-cache"
    size = None if cache_disk_gb is None else int(cache_disk_gb * 2**30)
    return {"disk_cache_dir": str(directory), "disk_cache_bytes": size}


BUNDLED_MODELS = ("demo", "demo-vision")  # the names the engine's loader resolves itself


def model_problem(name: str) -> str | None:
    """Why ``name`` cannot name a model (None: it can), with a did-you-mean for a misspelled
    bundled model, checked before a command creates anything: a typo such as ``dmeo`` must not
    leave an output directory, a ledger or a history behind, nor wait for a hub lookup."""
    from macbatch.engine import resolve_model_path

    try:
        resolve_model_path(name)
    except ValueError as error:
        close = difflib.get_close_matches(name, BUNDLED_MODELS, n=1, cutoff=0.6)
        return str(error) + (f"; did you mean '{close[0]}'?" if close else "")
    return None
