"""The engine's knobs on the command line, each declared once: a field of ``EngineKnobs`` with
its flag, help and checks (``fields.option``); serve, run, chat and bench each pick the ones
they offer (``fields.Pick``) and turn them into ``EngineConfig`` fields the same way
(``EngineKnobs.engine_fields``). The checks shared by several commands live here too."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from macbatch.commands.fields import option
from macbatch.engine import (  # MLX-free: --help
    DEFAULT_SPECULATIVE_TOKENS,
    DRAFT_MODEL_METHODS,
    SPECULATIVE_MODES,
    check_speculative,
)

if TYPE_CHECKING:
    from macbatch.models.names import Resolved

# The values --kv-bits takes, as `metal.quant.KV_BITS` (which imports MLX) checks them.
KV_BITS_CHOICES = "8|4"

# --help's groups of the engine's knobs (one line each there; docs/serve.md says the rest)
ENGINE = "Engine"
SPECULATIVE_PANEL = "Speculative decoding"
DISK_PANEL = "Disk KV cache"


def _check_kv_bits(value: int | None) -> int | None:
    from macbatch.metal.quant import check_kv_quantization  # MLX: not on `macbatch --help`

    try:
        check_kv_quantization(value, None)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _check_indexer_keys(value: str | None) -> str | None:
    from macbatch.engine import check_indexer_keys  # MLX: not on --help

    try:
        check_indexer_keys(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _check_disk_size(value: float | None) -> float | None:
    """Parse time, before any job file is read: inf and 1e400 pass typer's float and min."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a size: give the GiB the cache may use, e.g. 20")
    return value


def _check_speculative(value: str | None) -> str | None:
    try:
        if value is not None:
            check_speculative(value, 1)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def _check_num_speculative_tokens(value: int | None) -> int | None:
    try:
        check_speculative("off", value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    return value


def speculative_config(
    mode: str, draft_model: str | None, num_tokens: int | None
) -> dict[str, Any]:
    """The ``EngineConfig`` fields of the three speculative options. ``--draft-model`` drafts
    for ``auto`` (where the checkpoint has no MTP heads: ``Engine.load``) and the methods that
    draft with it (its config says which); ``off`` with one means ``draft``; a draft mode
    without a model, or a model for another mode, is refused."""
    if draft_model and mode == "off":
        mode = "draft"
    drafting = ("auto", *DRAFT_MODEL_METHODS)
    if draft_model and mode not in drafting:
        raise typer.BadParameter(
            f"a draft model drafts only for --speculative {', '.join(drafting)}, not {mode}",
            param_hint="--draft-model",
        )
    if mode in DRAFT_MODEL_METHODS and not draft_model:
        raise typer.BadParameter(
            f"--speculative {mode} needs a draft model: --draft-model PATH",
            param_hint="--speculative",
        )
    return {"speculative": mode, "draft_model": draft_model, "num_speculative_tokens": num_tokens}


def disk_cache_config(
    cache_dir: Path | str | None,
    cache_disk_gb: float | None,
    no_disk_cache: bool,
    models: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The ``EngineConfig`` fields of the disk-cache options: on by default, under the data
    directory, its cap the default for the largest of ``models`` (``default_cap_bytes``: the
    cap covers the whole directory) unless --cache-disk-gb gives one."""
    if no_disk_cache:
        return {"disk_cache_dir": None, "disk_cache_bytes": None}
    from macbatch.config import data_dir
    from macbatch.engine import default_cap_bytes
    from macbatch.models.names import expected_weights_bytes

    directory = Path(cache_dir).expanduser() if cache_dir else data_dir() / "kv-cache"
    if cache_disk_gb is not None:
        size = int(cache_disk_gb * 2**30)
    else:
        known = [w for w in map(expected_weights_bytes, models) if w is not None]
        size = default_cap_bytes(directory, max(known) if known else None)
    return {"disk_cache_dir": str(directory), "disk_cache_bytes": size}


def disk_cache_line(fields: dict[str, Any]) -> str:
    """The one line serve, run and chat say at start about the disk tier (``disk_cache_config``'s
    fields)."""
    if fields["disk_cache_dir"] is None:
        return "disk KV cache: off (--no-disk-cache)"
    return (
        f"disk KV cache: up to {fields['disk_cache_bytes'] / 2**30:,.2f} GiB in "
        f"{fields['disk_cache_dir']} (--cache-disk-gb, --no-disk-cache)"
    )


@dataclass(frozen=True)
class EngineKnobs:
    """The engine settings a command line can give (``EngineConfig`` documents what each one
    does; the help here says it for users). Defaults are the front ends': speculative decoding
    on where the checkpoint has MTP heads, the disk tier on."""

    max_num_seqs: int = option(
        64,
        "--max-num-seqs",
        min=1,
        help="Requests generating at once (the running batch).",
        rich_help_panel=ENGINE,
    )
    max_num_batched_tokens: int = option(
        1024,
        "--max-num-batched-tokens",
        min=1,
        help="Tokens per engine step (chunked prefill).",
        rich_help_panel=ENGINE,
    )
    kv_blocks: int | None = option(
        None,
        "--kv-blocks",
        min=1,
        help="KV cache blocks of 16 tokens, fixed (default: grows with use).",
        rich_help_panel=ENGINE,
    )
    kv_bits: int | None = option(
        None,
        "--kv-bits",
        callback=_check_kv_bits,
        show_default=False,
        metavar=f"[{KV_BITS_CHOICES}]",
        help="KV cache in 8 or 4 bits: 1.9x / 3.5x the context (docs/kernel.md).",
        rich_help_panel=ENGINE,
    )
    indexer_keys: str | None = option(
        None,
        "--indexer-keys",
        callback=_check_indexer_keys,
        show_default=False,
        metavar="[fp8]",
        help="fp8 indexer keys (docs/engine.md).",
        rich_help_panel=ENGINE,
    )
    speculative: str | None = option(  # None: run's job file decides
        "auto",
        "--speculative",
        callback=_check_speculative,
        metavar="MODE",
        help=f"{', '.join(SPECULATIVE_MODES)}; auto: MTP heads, else --draft-model, else "
        "prompt lookup (docs/speculative.md).",
        rich_help_panel=SPECULATIVE_PANEL,
    )
    draft_model: str | None = option(
        None,
        "--draft-model",
        show_default=False,
        help="A small model with the same tokenizer, or a DFlash or Eagle-3 drafter.",
        rich_help_panel=SPECULATIVE_PANEL,
    )
    num_speculative_tokens: int | None = option(
        None,
        "--num-speculative-tokens",
        callback=_check_num_speculative_tokens,
        show_default=False,
        help="Most tokens drafted per request per step (default: "
        f"ngram {DEFAULT_SPECULATIVE_TOKENS['ngram']}, "
        f"draft {DEFAULT_SPECULATIVE_TOKENS['draft']}, "
        f"mtp {DEFAULT_SPECULATIVE_TOKENS['mtp']}, "
        f"dflash {DEFAULT_SPECULATIVE_TOKENS['dflash']}, "
        f"eagle3 {DEFAULT_SPECULATIVE_TOKENS['eagle3']}).",
        rich_help_panel=SPECULATIVE_PANEL,
    )
    cache_dir: str | None = option(
        None,
        "--cache-dir",
        show_default=False,
        help="Where prompt KV blocks persist (default: kv-cache/ in the data directory).",
        rich_help_panel=DISK_PANEL,
    )
    cache_disk_gb: float | None = option(
        None,
        "--cache-disk-gb",
        min=0.0,
        callback=_check_disk_size,
        show_default=False,
        help="GiB of disk it may use (default: docs/engine.md, 'The disk tier').",
        rich_help_panel=DISK_PANEL,
    )
    no_disk_cache: bool = option(
        False,
        "--no-disk-cache",
        help="Keep the prefix cache in RAM only.",
        rich_help_panel=DISK_PANEL,
    )
    no_self_check: bool = option(
        False,
        "--no-self-check",
        help="Skip the load-time check against mlx-lm (docs/models.md, 'The self-check').",
        rich_help_panel=ENGINE,
    )
    reranker: bool = option(
        False,
        "--reranker",
        help="The model is a yes/no reranker whatever its name (docs/embeddings.md).",
        rich_help_panel=ENGINE,
    )

    def speculative_fields(self) -> dict[str, Any]:
        """The speculative options' ``EngineConfig`` fields (``speculative_config``)."""
        return speculative_config(
            self.speculative or "auto", self.draft_model, self.num_speculative_tokens
        )

    def disk_fields(self, models: tuple[str, ...] = ()) -> dict[str, Any]:
        """The disk-cache options' ``EngineConfig`` fields (``disk_cache_config``) for a command
        running ``models``."""
        return disk_cache_config(self.cache_dir, self.cache_disk_gb, self.no_disk_cache, models)

    def engine_fields(self, models: tuple[str, ...] = ()) -> dict[str, Any]:
        """Every ``EngineConfig`` field these knobs give, for a command that offers them all the
        front ends' way (run, whose job file has its say, picks its own); ``models``: those it
        starts with (the disk cap follows them)."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "num_blocks": self.kv_blocks,
            "kv_bits": self.kv_bits,
            "indexer_keys": self.indexer_keys,
            "reranker": self.reranker or None,  # None: recognised by its name
            "self_check": not self.no_self_check,
            **self.speculative_fields(),
            **self.disk_fields(models),
        }


# the knobs that go together into EngineConfig (speculative_fields, disk_fields)
SPECULATIVE = ("speculative", "draft_model", "num_speculative_tokens")
# the knobs of a command that loads a model and offers nothing else: ask, doctor
LOAD_ONLY = ("no_self_check",)
DISK_CACHE = ("cache_dir", "cache_disk_gb", "no_disk_cache")


def api_key_option(help: str, **options: Any) -> Any:
    """``--api-key``, also read from ``MACBATCH_API_KEY``: serve's, and ps's for such a serve."""
    return typer.Option(
        None, "--api-key", envvar="MACBATCH_API_KEY", show_default=False, help=help, **options
    )


def model_problem(name: str) -> str | None:
    """Why a resolved model ``name`` cannot name a model (None: it can), checked before a
    command creates anything: a typo such as ``dmeo`` must not leave an output directory, a
    ledger or a history behind, nor wait for a hub lookup."""
    from macbatch.engine import resolve_model_path
    from macbatch.models.names import UnknownModel, resolve

    try:
        resolve_model_path(resolve(name, presets={}).model)
    except (ValueError, UnknownModel) as error:
        return str(error)
    return None


def resolve_model(name: str, param_hint: str = "--model", check: bool = True) -> Resolved:
    """What a command's model option means (``models/names.resolve``: a preset, a short name,
    a path or hub id), refused as a bad value of ``param_hint`` when it means nothing (and,
    with ``check``, when ``model_problem`` finds it cannot name a model)."""
    from macbatch.models.names import resolve
    from macbatch.models.presets import PresetError

    try:
        resolved = resolve(name)
    except (ValueError, PresetError) as error:
        raise typer.BadParameter(str(error), param_hint=param_hint) from None
    if check and (problem := model_problem(resolved.model)) is not None:
        raise typer.BadParameter(problem, param_hint=param_hint)
    return resolved


def resolved_models(given: list[str] | None, default: str) -> tuple[str, ...]:
    """A repeatable model option's models, each resolved (serve's ``--model``, whose pool says
    itself why a model it cannot load does not load)."""
    return tuple(resolve_model(name, check=False).model for name in given or [default])
