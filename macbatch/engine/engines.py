"""Which engine a model name gets: an encoder checkpoint (engine/encoder/: BERT, RoBERTa, ...)
its own encoder engine, any other model the paged engine (``Engine.load``). The one place that
decides it, for every front end that loads a model to serve or run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from macbatch.engine.config import EngineConfig
from macbatch.engine.loader import resolve_model_path

if TYPE_CHECKING:
    from macbatch.engine.encoder.engine import EncoderEngine
    from macbatch.engine.engine import Engine

# what an encoder checkpoint needs from the hub: its config, tokenizer, weights, its
# sentence-transformers files and BGE-M3's heads
ENCODER_FILES = ["*.json", "*.safetensors", "*.txt", "*.pt"]


def load_engine(name: str, config: EngineConfig | None = None) -> Engine | EncoderEngine:
    from macbatch.engine.encoder.engine import EncoderEngine
    from macbatch.engine.engine import Engine

    path = encoder_directory(name)
    if path is not None:
        return EncoderEngine.load(path, name, config)
    return Engine.load(name, config)


def encoder_directory(name: str) -> Path | None:
    """The directory of ``name`` when it is an encoder checkpoint (a hub id's config is read
    first, and the rest fetched only for an encoder; a config that cannot be fetched leaves
    the paged engine's load to say why)."""
    from macbatch.engine.encoder.facts import encoder_facts

    target = resolve_model_path(name)
    if isinstance(target, Path):
        return target if encoder_facts(target) is not None else None
    from huggingface_hub import hf_hub_download, snapshot_download

    try:
        config = Path(hf_hub_download(target, "config.json"))
    except Exception:  # hub errors come in many types; Engine.load reports them in words
        return None
    if encoder_facts(config.parent) is None:
        return None
    return Path(snapshot_download(target, allow_patterns=ENCODER_FILES))
