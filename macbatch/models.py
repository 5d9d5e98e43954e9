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
        model_type = json.loads((path / "config.json").read_text()).get("model_type", "?")
    except (OSError, ValueError):
        model_type = "unreadable config.json"
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return LocalModel(name=name, model_type=str(model_type), size_bytes=size, path=path)
