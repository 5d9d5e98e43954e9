"""What the server says about its models: ``/v1/models`` cards (every servable model, loaded or
not, its tasks and memory) and ``/metrics`` (with several models, each engine's samples carry a
``model`` label)."""

from __future__ import annotations

import re
from typing import Any

from macbatch.models.local import tasks_of
from macbatch.models.memory import weights_bytes
from macbatch.models.pool import ModelPool
from macbatch.server.admission import Admission
from macbatch.server.embeddings import model_capabilities
from macbatch.server.metrics import ServerMetrics

_SERVER_WIDE = frozenset({"macbatch_http_responses_total"})  # counted by route, not by model


def model_card(models: ModelPool, name: str) -> dict[str, Any]:
    entry, loaded = models.catalog[name], models.loaded.get(name)
    card = {"id": name, "object": "model", "created": 0, "owned_by": "macbatch"}
    if loaded is not None:
        stats = loaded.thread.stats()
        about = model_capabilities(loaded) | {"loaded": True}
        if loaded.images.refused is None:
            about["tasks"].append("vision")
        kv = 0 if stats is None else stats.kv_cache_bytes
        about["memory"] = {"weights_bytes": loaded.need.weights, "kv_cache_bytes": kv}
    else:
        about = {"loaded": False, "tasks": [] if entry.path is None else tasks_of(entry.path)}
        weights = None if entry.path is None else weights_bytes(entry.path)
        about["memory"] = {"weights_bytes": weights, "kv_cache_bytes": 0}
    return card | {"macbatch": about}


def adapter_cards(models: ModelPool, name: str) -> list[dict[str, Any]]:
    """One card per adapter of model ``name``, as ``name:adapter`` (docs/models.md,
    "Fine-tunes"): rank, kind and targets while it is loaded."""
    loaded = models.loaded.get(name)
    refs = {} if loaded is None else loaded.thread.info.model.adapters
    cards = []
    for adapter, path in models.catalog[name].adapter_paths.items():
        ref = refs.get(adapter)
        about: dict[str, Any] = {"base": name, "adapter": adapter, "path": path}
        about["loaded"] = ref is not None
        if ref is not None:
            about |= {"kind": ref.kind, "rank": ref.rank, "targets": list(ref.targets)}
            about["bytes"] = ref.nbytes
        card = {"id": f"{name}:{adapter}", "object": "model", "created": 0, "owned_by": "macbatch"}
        cards.append(card | {"macbatch": about})
    return cards


def render_metrics(
    server: ServerMetrics,
    per_model: dict[str, ServerMetrics],
    models: ModelPool,
    admission: Admission,
) -> str:
    """One model: its counters are the server's, as ever. Several: the server-wide counts, then
    each model's (loaded, or that answered anything) under a ``model`` label, one family each."""
    if len(models.catalog) == 1:
        loaded = models.loaded.get(models.default)
        stats = None if loaded is None else loaded.thread.stats()
        up = loaded is not None and loaded.thread.alive
        return server.render(stats, up, admission.pending_of(models.default))
    families: dict[str, list[str]] = {}
    _add(families, server.render(None, True, 0), None, keep=_SERVER_WIDE)
    for name, counted in per_model.items():
        loaded = models.loaded.get(name)
        if loaded is None and not counted.finished:
            continue
        stats = None if loaded is None else loaded.thread.stats()
        up = loaded is not None and loaded.thread.alive
        text = counted.render(stats, up, admission.pending_of(name))
        _add(families, text, name, skip=_SERVER_WIDE)
    return "".join(line + "\n" for lines in families.values() for line in lines)


def _add(
    families: dict[str, list[str]],
    text: str,
    model: str | None,
    keep: frozenset[str] | None = None,
    skip: frozenset[str] = frozenset(),
) -> None:
    """Fold one exposition into ``families`` (name -> HELP, TYPE, samples), labelling samples."""
    family = ""
    for line in text.splitlines():
        if line.startswith("# HELP "):
            family = line.split()[2]
        if family in skip or (keep is not None and family not in keep):
            continue
        if line.startswith("#"):
            if family not in families:
                families[family] = []
            if line not in families[family]:
                families[family].append(line)
        else:
            families[family].append(line if model is None else _labelled(line, model))


def _labelled(sample: str, model: str) -> str:
    label = f'model="{label_value(model)}"'
    name, rest = re.match(r"([^{ ]+)(.*)", sample).groups()  # type: ignore[union-attr]
    if rest.startswith("{"):
        return f"{name}{{{label},{rest[1:]}"
    return f"{name}{{{label}}}{rest}"


def label_value(text: str) -> str:
    """``text`` as a label value of the exposition format: backslash, double quote and line feed
    escaped (a model's folder name may hold any of them; unescaped, a line feed starts a line
    of its own, a sample anyone naming a folder could inject)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
