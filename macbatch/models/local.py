"""Which models macbatch can run without downloading: the packaged demo model, the models
already in the Hugging Face hub cache, and model directories under the ``--models-dir``
directories a user names (docs/models.md, "How models are found")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macbatch.engine import (
    BadConfig,
    declared_context_length,
    read_model_config,
    unavailable_reason,
)


@dataclass(frozen=True)
class LocalModel:
    name: str
    model_type: str
    size_bytes: int
    path: Path
    quantization: str  # "4-bit (group 64)", "mxfp4", "none", or "?" when unreadable
    context: int | None  # max_position_embeddings, when the config says
    problem: str | None = None  # why its config.json cannot be read (it is listed all the same)


def local_models(models_dirs: tuple[Path, ...] = ()) -> list[LocalModel]:
    """The demo model first, then the model directories (those holding a config.json) right
    under each of ``models_dirs``, named by their folder, then cached hub models with a
    config.json (largest revision). A name found twice keeps its first place."""
    from macbatch.demo import MODEL_DIR

    found = []
    if (MODEL_DIR / "config.json").exists():
        found.append(_describe("demo", MODEL_DIR))
    for directory in models_dirs:
        for path in sorted(directory.expanduser().iterdir()) if directory.is_dir() else ():
            if (path / "config.json").is_file():
                found.append(_describe(path.name, path))
    return _unique(found + _cached())


def _unique(models: list[LocalModel]) -> list[LocalModel]:
    by_name: dict[str, LocalModel] = {}
    for model in models:
        by_name.setdefault(model.name, model)
    return list(by_name.values())


def _cached() -> list[LocalModel]:
    found: list[LocalModel] = []
    try:
        from huggingface_hub import scan_cache_dir

        cache = scan_cache_dir()
    except Exception:  # no cache directory yet, or an unreadable one: nothing cached to list
        return found
    for repo in sorted(cache.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            if (revision.snapshot_path / "config.json").exists():
                found.append(_describe(repo.repo_id, revision.snapshot_path))
                break
    return found


def _describe(name: str, path: Path) -> LocalModel:
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    try:
        config = read_model_config(path)
    except BadConfig as error:
        return LocalModel(name, "?", size, path, "?", None, problem=str(error))
    return LocalModel(
        name=name,
        model_type=str(config.get("model_type", "?")),
        size_bytes=size,
        path=path,
        quantization=describe_quantization(config),
        context=declared_context_length(config),
    )


def describe_quantization(config: dict[str, Any]) -> str:
    """A config.json's weight quantization in words: mlx-lm's ``quantization`` entry (bits,
    group size, mode) or a Hugging Face ``quantization_config`` (its ``quant_method``)."""
    quant = config.get("quantization") or config.get("quantization_config")
    if not isinstance(quant, dict):
        return "none"
    mode = quant.get("mode") or quant.get("quant_method") or "affine"
    words = f"{quant.get('bits', '?')}-bit (group {quant.get('group_size', '?')})"
    if mode != "affine":
        words = f"{mode}, {words}" if "bits" in quant else str(mode)
    mixed = sum(1 for v in quant.values() if isinstance(v, dict))
    return f"{words}, {mixed} layers with their own settings" if mixed else words


def encoder_summary(path: Path) -> str | None:
    """An encoder's pooling, dimensions and longest input (or its head), read from its files;
    None for any other model."""
    from macbatch.engine import encoder_facts

    encoder = encoder_facts(path)
    return None if encoder is None else encoder.describe()


def tasks_of(path: Path) -> list[str]:
    """What a model would do once loaded, read from its files (the loaded engine decides the
    same from its checkpoint): every model generates, embeds and scores; a model whose name says
    "rerank" is a reranker (as ``EngineConfig.reranker`` None decides); one that reads images
    here adds "vision". An encoder embeds and scores, or (a cross-encoder) scores and reranks."""
    from macbatch.engine import encoder_facts

    encoder = encoder_facts(path)
    if encoder is not None:
        return encoder.tasks
    tasks = ["generate", "embed", "score"]
    if "rerank" in path.name.lower() or "rerank" in str(path.parent.parent.name).lower():
        tasks.append("rerank")
    if unavailable_reason(path, path.name) is None:
        tasks.append("vision")
    return tasks
