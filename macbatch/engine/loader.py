"""Finds a model by name: the packaged demo model, a local directory, or a Hugging Face hub id."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from macbatch.engine.model.config_file import read_model_config
from macbatch.engine.speculative.mtp_weights import MtpNames, mtp_names

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper


# A config.json is a few KiB (the largest known, with long chat templates or quantization tables,
# well under a MiB): past this it is refused unread, before parsing it stalls or swells the load.
# A safetensors file's JSON header (names, dtypes, shapes): a MiB or two for the largest models.
MAX_HEADER_BYTES = 64 * 2**20
LAYER_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def weight_shapes(path: Path) -> dict[str, list[int]]:
    """Every tensor's shape, by name, from the headers of a checkpoint's safetensors files (the
    weights themselves are not read)."""
    shapes: dict[str, list[int]] = {}
    for weights in sorted(path.glob("*.safetensors")):
        with weights.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if not 0 < length <= min(MAX_HEADER_BYTES, weights.stat().st_size - 8):
                raise ValueError(f"{weights.name} is not a safetensors file (its header is cut)")
            try:
                header = json.loads(file.read(length))
            except ValueError:
                raise ValueError(f"{weights.name} is not a safetensors file") from None
        if not isinstance(header, dict):
            raise ValueError(f"{weights.name} is not a safetensors file")
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict):
                shapes[name] = list(entry.get("shape") or [])
    return shapes


def check_checkpoint(path: Path) -> None:
    """Refuse (ValueError, a short reason) a local checkpoint whose config its weights cannot
    back, BEFORE any model is built: mlx-lm builds every declared layer before it compares the
    weights, so a config declaring 10^9 layers over four never finishes loading, and 12,000
    take seconds and a GiB. Compared: the decoder layers declared and those the weight names
    hold (at least as many: DeepSeek's MTP layers come after them), the vocabulary and the
    embedding's rows."""
    config = read_model_config(path)
    text = config.get("text_config", config)
    shapes = weight_shapes(path)
    if not shapes or not isinstance(text, dict):
        return  # nothing to compare (mlx-lm says what is missing)
    declared = text.get("num_hidden_layers")
    held = {int(m.group(1)) for name in shapes if (m := LAYER_NAME.search(name))}
    if isinstance(declared, int) and held and declared > max(held) + 1:
        raise ValueError(
            f"its config.json declares {declared:,} layers (num_hidden_layers) and its weights "
            f"hold {max(held) + 1:,}: refused before building the model"
        )
    vocab = text.get("vocab_size")
    rows = [s[0] for n, s in shapes.items() if n.endswith("embed_tokens.weight") and s]
    if isinstance(vocab, int) and rows and vocab > max(rows):
        raise ValueError(
            f"its config.json declares a vocabulary of {vocab:,} tokens (vocab_size) and its "
            f"embedding has {max(rows):,} rows: refused before building the model"
        )


def resolve_model_path(name: str) -> Path | str:
    """A local directory for ``name``, or the hub id itself (mlx-lm downloads and caches it)."""
    if name == "demo":
        from macbatch.demo import MODEL_DIR

        if not (MODEL_DIR / "config.json").exists():
            raise ValueError(
                f"the demo model is missing from {MODEL_DIR}; rebuild it with "
                "`python scripts/train_demo_model.py`"
            )
        return MODEL_DIR
    if name == "demo-vision":  # built on this machine on first use (docs/vision.md)
        from macbatch.demo.vision import demo_vision_dir

        return demo_vision_dir()
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ValueError(f"{path} is not a model directory: it has no config.json")
        return path
    if name.startswith((".", "/", "~")):
        raise ValueError(f"no model directory at {path}")
    if name.count("/") != 1:
        raise ValueError(
            f"model '{name}' is neither a local directory nor a Hugging Face hub id "
            "(owner/name, e.g. mlx-community/Qwen3-0.6B-4bit), nor 'demo' / 'demo-vision'"
        )
    return name


def declared_head_dim(name: str) -> int | None:
    """The head dim a local model's config.json declares (None for hub ids and configs that do
    not say), so settings that depend on it fail before the weights load."""
    target = resolve_model_path(name)
    if isinstance(target, str):
        return None
    config = read_model_config(target)
    config = config.get("text_config", config)
    if config.get("head_dim"):
        return int(config["head_dim"])
    heads = config.get("num_attention_heads")
    return int(config["hidden_size"]) // int(heads) if heads and "hidden_size" in config else None


def load_model(name: str, lazy: bool = False) -> tuple[nn.Module, TokenizerWrapper]:
    """What ``mlx_lm.load`` does (the model through ``load_checkpoint``), with errors a user can
    act on (``lazy``: weights stay unread until used, so a rank that keeps only its shard never
    holds the whole model)."""
    from macbatch.engine.model.adapter import UnsupportedModelError
    from macbatch.engine.model.families import (
        ENCODER_DOES_NOT_GENERATE,
        family,
        library_type,
        unsupported_reason,
    )

    target = resolve_model_path(name)
    if not isinstance(target, str):  # a local checkpoint: refuse what cannot run before loading
        try:
            check_checkpoint(target)
        except ValueError as exc:
            raise ValueError(f"could not load model '{name}' from {target}: {exc}") from None
        declared = read_model_config(target)
        model_type = str(declared.get("model_type"))
        reason = unsupported_reason(model_type, declared.get("architectures"))
        if family(library_type(model_type)).encoder is not None:
            reason = ENCODER_DOES_NOT_GENERATE
        if reason:
            raise UnsupportedModelError(
                f"model '{name}' (model type '{model_type}') is not supported: {reason}"
            )
    try:
        path = _download(target) if isinstance(target, str) else target
        model, config = load_checkpoint(path, lazy)
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except Exception as exc:  # hub and file errors come in many types; all get the same framing
        where = "from the Hugging Face hub" if isinstance(target, str) else f"from {target}"
        raise ValueError(f"could not load model '{name}' {where}: {failure_reason(exc)}") from exc
    return model, tokenizer


def failure_reason(error: BaseException) -> str:
    """What went wrong in a library's load, in words: its message, or, for a bare ``assert``
    (mlx-lm's checks of a config: ``assert self.vocab_size > 0``), the check that failed and
    where, so the user learns which value of the config is wrong."""
    if str(error):
        return str(error)
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return type(error).__name__
    last = frames[-1]
    where = "/".join(Path(last.filename).parts[-3:])
    check = f"`{last.line}`" if last.line else type(error).__name__
    return f"the check {check} failed ({where}, line {last.lineno})"


def _download(repo_id: str) -> Path:
    """A hub model's folder in the local cache, downloaded first if needed (the files mlx-lm's
    ``load`` fetches)."""
    from huggingface_hub import snapshot_download
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    return Path(snapshot_download(repo_id, allow_patterns=DEFAULT_ALLOW_PATTERNS))


def load_tokenizer(path: Path, eos_token_ids: Any = None) -> TokenizerWrapper:
    """mlx-lm's tokenizer of the checkpoint at ``path``, handed a blank transformers config when
    transformers does not know its model type. Its ``AutoTokenizer`` reads the model's config
    first and, for a type it does not know, builds its generic config from config.json, whose
    RoPE validation fails on a ``longrope`` ``rope_scaling`` ('PreTrainedConfig' object has no
    attribute 'max_position_embeddings'): every Phi-4-multimodal (``phi4mm``) checkpoint. The
    generic config picks the tokenizer by the same fields (an empty model type and the
    ``tokenizer_class`` config.json names), so the blank one chooses the same tokenizer."""
    from mlx_lm.utils import load_tokenizer as mlx_lm_tokenizer
    from transformers import PreTrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = read_model_config(path)
    extra = None
    if config.get("model_type") not in CONFIG_MAPPING:
        fields = {"_name_or_path": str(path), "tokenizer_class": config.get("tokenizer_class")}
        extra = {"config": PreTrainedConfig.from_dict(fields)}
    return mlx_lm_tokenizer(path, extra, eos_token_ids=eos_token_ids)


def load_checkpoint(path: Path, lazy: bool) -> tuple[nn.Module, dict[str, Any]]:
    """mlx-lm's ``load_model`` of a local checkpoint (and its config), with its multi-token
    prediction weights (``mtp.*`` under any prefix, or DeepSeek/GLM's decoder layers from
    ``num_hidden_layers`` on: ``mtp_weights.py``) dropped before mlx-lm's strict load: no
    mlx-lm model holds them (``mtp_weights.py`` reads them itself), and mlx-lm's qwen3_next
    ``sanitize`` drops them only from checkpoints whose experts are not stacked yet, so every
    converted one that keeps them was refused. A family whose text model only mlx-vlm has is
    mlx-vlm's loader's (``model/vlm_text.py``)."""
    from mlx_lm.utils import load_model

    from macbatch.engine.model.families import Library, family, library_type

    model_type = library_type(str(read_model_config(path).get("model_type")))
    if family(model_type).library is Library.MLX_VLM:
        from macbatch.engine.model.vlm_text import load_vlm_checkpoint

        return load_vlm_checkpoint(path, model_type, lazy)
    return load_model(path, lazy=lazy, get_model_classes=_classes_without_mtp)


def _classes_without_mtp(config: dict[str, Any]) -> tuple[type, type]:
    """mlx-lm's model and arguments classes for ``config``, the model's sanitize preceded by
    dropping the MTP weights."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    return _dropping_mtp(model_class, mtp_names(config)), args_class


@functools.cache
def _dropping_mtp(model_class: type, names: MtpNames) -> type:
    """A subclass of ``model_class`` (same name and module: the family is read from them) whose
    ``sanitize`` drops the MTP weights, then runs the class's own where it has one."""

    def sanitize(self: Any, weights: dict[str, Any]) -> dict[str, Any]:
        weights = {k: v for k, v in weights.items() if names.split(k) is None}
        own = getattr(super(subclass, self), "sanitize", None)
        return own(weights) if own is not None else weights

    same = {"__module__": model_class.__module__, "__qualname__": model_class.__qualname__}
    subclass = type(model_class.__name__, (model_class,), {"sanitize": sanitize, **same})
    return subclass
