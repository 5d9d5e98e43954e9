"""What ``Engine.load`` would find in a local model, without reading its weights (``macbatch
doctor MODEL``): the engine's own dtype rule and adapter run on the lazily loaded (memory-mapped,
unread) model and probe its graph without evaluating it, so the answers are the ones loading it
would reach, at the cost of a config read. Here rather than in the front end so that it needs
none of the engine's internals."""

from __future__ import annotations

from pathlib import Path

from mlx.utils import tree_reduce

from macbatch.engine.model.adapter import ModelAdapter, model_type_of, text_model
from macbatch.engine.model.compute_dtype import available_memory_bytes, settle_compute_dtype
from macbatch.engine.stores import fp8_keys
from macbatch.engine.stores.pages import PageFormat


def probe_model(path: Path, rows: list[tuple[str, str]]) -> str | None:
    """Append what loading the model at ``path`` would find to ``rows`` as (what, found), each
    as soon as it is found so that a failure still shows what came before it, and return why
    the engine could not serve the model (None: it could). ``ValueError`` when mlx-lm cannot
    load it or the adapter cannot run it: nothing further can be probed."""
    from macbatch.engine.loader import load_checkpoint

    try:
        model, _ = load_checkpoint(path, lazy=True)
    except Exception as exc:  # an unknown model_type, missing weights ...: all mean "cannot load"
        raise ValueError(f"mlx-lm cannot load it: {exc}") from exc
    outer_type = model_type_of(model)
    inner_type = model_type_of(text_model(model))
    shown = outer_type if inner_type == outer_type else f"{outer_type} (text model: {inner_type})"
    rows.append(("architecture", shown))
    try:
        dtype = settle_compute_dtype(model, None, owns_model=True)
    except ValueError as exc:
        return str(exc)
    rows.append(("compute dtype", f"{dtype.dtype} ({dtype.reason})"))
    try:
        adapter = ModelAdapter(model)  # UnsupportedModelError (a ValueError) says why not
    except Exception as exc:  # an architecture whose forward fails on the probe: same answer
        raise ValueError(f"the paged engine cannot run it: {exc}") from exc
    if adapter.holds_caches:  # DeepSeek V4: nothing paged
        rows.append(("layers", f"{len(adapter.state_shapes)} (attention over the library's own "
                     "caches, held per request, not paged)"))  # fmt: skip
        rows.append(("KV bytes/token", "not counted: its window and compressed rows stay in the "
                     "library's own caches (docs/engine.md, \"DeepSeek V4\")"))  # fmt: skip
    else:
        _cache_rows(adapter, rows)
    # what the weights take once loaded and cast (lazy arrays know their size unread)
    needed = tree_reduce(lambda total, array: total + array.nbytes, model.parameters(), 0)
    free = available_memory_bytes()
    rows.append(("memory", f"{_size(needed)} of weights, {_size(free)} free"))
    if needed > free:
        return (
            f"its weights need {_size(needed)} and {_size(free)} is free; "
            "free memory or pick a smaller (quantized) model"
        )
    return None


def _cache_rows(adapter: ModelAdapter, rows: list[tuple[str, str]]) -> None:
    """The layers, KV bytes per token and recurrent state of a model whose caches are pages and
    fixed-size states."""
    # a lightning indexer's keys are store layers of their own (value_dim 0), not attention's
    index_shapes = [shape for shape in adapter.layer_shapes if shape.value_dim == 0]
    attention = len(adapter.kv_layers)
    paged = len(adapter.layer_shapes) - len(index_shapes)
    shared = f", {attention - paged} reuse another layer's K/V" if paged < attention else ""
    recurrent = len(adapter.state_shapes)
    both = sum(len(entry) > 1 for entry in adapter.recurrent)  # attention and state side by side
    latent = sum(shape.value_dim is not None for shape in adapter.layer_shapes)
    every = bool(adapter.layer_shapes) and latent == len(adapter.layer_shapes)
    pages = "latent pages (MLA: one row per token)" if every else "KV pages"
    kinds = f"{paged} with {pages}{shared}"
    if index_shapes:
        kinds += f", {len(index_shapes)} with a sparse-attention indexer's keys"
    if recurrent:
        kinds = (
            f"{kinds}, {recurrent} recurrent" if paged else f"{recurrent} recurrent, no KV pages"
        )
    if both:
        kinds += f"; {both} run both side by side"
    idle = adapter.kv_used.count(False)  # attention off, or a linear map in its place
    if idle:  # (Nemotron-NAS)
        kinds += f"; {idle} without attention"
    rows.append(("layers", f"{attention + idle + recurrent - both} ({kinds})"))
    per_token = PageFormat(adapter.kv_dtype).bytes_per_block(adapter.layer_shapes, 1)
    kv_dtype = str(adapter.kv_dtype).removeprefix("mlx.core.")
    indexed = ""
    if index_shapes:
        keys = PageFormat(adapter.kv_dtype).bytes_per_block(index_shapes, 1)
        indexed = f", {keys:,} of them the indexer's keys"
        fp8 = PageFormat(adapter.kv_dtype, indexer_keys="fp8")
        if all(fp8_keys.fits(s.head_dim) for s in index_shapes):  # --indexer-keys fp8's
            fp8_total = fp8.bytes_per_block(adapter.layer_shapes, 1)
            indexed += f"; {fp8_total:,} with --indexer-keys fp8"
    rows.append(("KV bytes/token", f"{per_token:,} ({kv_dtype}{indexed})"))
    if recurrent:
        state = sum(s.nbytes for s in adapter.state_shapes)
        rows.append(("state bytes/request", f"{state:,} (recurrent layers, fixed size)"))


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:,.1f} MiB"
