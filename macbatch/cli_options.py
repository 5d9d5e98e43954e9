"""Command-line options that several commands share, defined once."""

from __future__ import annotations

from typing import Any

import typer


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
        help="Store the KV cache in 8 or 4 bits: about 1.9x or 3.5x the context per GiB of "
        "cache (default: float pages, or for `run` the job file's kv_bits; see docs/kernel.md "
        "for accuracy).",
    )
