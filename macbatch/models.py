"""Which models macbatch can run without downloading: the packaged demo model and the models
already in the Hugging Face hub cache."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalModel:
    name: str
    model_type: str
    size_bytes: int
    path: Path
    quantization: str  # "4-bit (group 64)", "mxfp4", "none", or "?" when unreadable
    context: int | None  # max_position_embeddings, when the config says


def local_models() -> list[LocalModel]:
    """The demo model first, then cached hub models with a config.json (largest revision)."""
    from macbatch.demo import MODEL_DIR

    found = []
    if (MODEL_DIR / "config.json").exists():
        found.append(_describe("demo", MODEL_DIR))
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
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    if not isinstance(config, dict):
        return LocalModel(name, "unreadable config.json", size, path, "?", None)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    context = config.get("max_position_embeddings") or text.get("max_position_embeddings")
    return LocalModel(
        name=name,
        model_type=str(config.get("model_type", "?")),
        size_bytes=size,
        path=path,
        quantization=_quantization(config.get("quantization") or config.get("quantization_config")),
        context=int(context) if isinstance(context, int) else None,
    )


def _quantization(spec: object) -> str:
    """mlx-lm's ``quantization`` entry in words: bits and group size, or the named mode."""
    if not isinstance(spec, dict):
        return "none"
    mode = spec.get("mode", "affine")
    if mode != "affine":
        return str(mode)
    bits, group = spec.get("bits"), spec.get("group_size")
    return f"{bits}-bit (group {group})" if bits else "?"
