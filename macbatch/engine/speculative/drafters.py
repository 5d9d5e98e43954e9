"""The drafters' registry: each method's drafter, built from the runner of the draft model and
the KV manager, and the engine's speculator over the configured one."""

from __future__ import annotations

from collections.abc import Callable

import mlx.nn as nn

from macbatch.engine.config import EngineConfig
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.speculative.dflash import DFlashDrafter
from macbatch.engine.speculative.dflash_model import DFlashModel, is_dflash_config, load_dflash
from macbatch.engine.speculative.dflash_runner import DFlashRunner
from macbatch.engine.speculative.draft_model import DraftModelDrafter
from macbatch.engine.speculative.draft_runner import DraftRunner
from macbatch.engine.speculative.drafter_checkpoint import read_local_config
from macbatch.engine.speculative.eagle3_model import Eagle3Model, is_eagle3_config, load_eagle3
from macbatch.engine.speculative.eagle3_runner import Eagle3Runner
from macbatch.engine.speculative.mtp import MtpDrafter
from macbatch.engine.speculative.mtp_model import MtpHead
from macbatch.engine.speculative.mtp_runner import MtpRunner
from macbatch.engine.speculative.ngram import NgramDrafter
from macbatch.engine.speculative.protocol import Drafter
from macbatch.engine.speculative.speculator import Speculator

# what the model runner holds beside the target: a draft model's, an MTP layer's, a DFlash or
# an Eagle-3 drafter's runner (None: none)
Draft = DraftRunner | MtpRunner | DFlashRunner | Eagle3Runner | None


def _draft(draft: Draft, kv: KVManager) -> Drafter:
    if not isinstance(draft, DraftRunner):
        raise ValueError("speculative 'draft' needs a draft model (--draft-model PATH)")
    return DraftModelDrafter(draft, kv)


def _mtp(draft: Draft, kv: KVManager) -> Drafter:
    if not isinstance(draft, MtpRunner):
        raise ValueError(
            "speculative 'mtp' needs the checkpoint's MTP layer (Engine.load reads it; "
            "Engine(..., draft_model=load_mtp_head(...)) for a model built in code)"
        )
    return MtpDrafter(draft, kv)


def _dflash(draft: Draft, kv: KVManager) -> Drafter:
    if not isinstance(draft, DFlashRunner):
        raise ValueError("speculative 'dflash' needs a DFlash drafter (--draft-model PATH)")
    return DFlashDrafter(draft, kv)


def _eagle3(draft: Draft, kv: KVManager) -> Drafter:
    if not isinstance(draft, Eagle3Runner):
        raise ValueError("speculative 'eagle3' needs an Eagle-3 drafter (--draft-model PATH)")
    return MtpDrafter(draft, kv)  # it drafts as an MTP layer does (eagle3_runner.py)


# each method's drafter (keys: methods.SPECULATIVE_METHODS), from the runner of the draft model
# or the MTP layer (None without one) and the KV manager
DRAFTERS: dict[str, Callable[[Draft, KVManager], Drafter]] = {
    "ngram": lambda _draft, _kv: NgramDrafter(),
    "draft": _draft,
    "mtp": _mtp,
    "dflash": _dflash,
    "eagle3": _eagle3,
}


def drafter_kind(draft: object) -> str | None:
    """The method a drafting model given to the engine drafts by (``methods.resolved_mode``):
    "mtp", "dflash", "eagle3", "draft" (any other model: a plain draft model), or None (none)."""
    if draft is None:
        return None
    kinds = {MtpHead: "mtp", DFlashModel: "dflash", Eagle3Model: "eagle3"}
    return next((kind for cls, kind in kinds.items() if isinstance(draft, cls)), "draft")


def load_draft_model(path: str | None) -> nn.Module:
    """The draft model at ``path`` (a local directory or a hub id): a DFlash or an Eagle-3
    drafter where its config is one (dflash_model.py, eagle3_model.py), else as mlx-lm loads
    it."""
    if not path:
        raise ValueError("speculative 'draft' needs a draft model (--draft-model PATH)")
    from mlx_lm import load

    from macbatch.engine.loader import failure_reason

    try:
        raw = read_local_config(path) or {}
        if is_dflash_config(raw):
            return load_dflash(path)
        if is_eagle3_config(raw):
            return load_eagle3(path)
        return load(path)[0]
    except Exception as error:  # mlx-lm's errors come in many types: all name the draft
        reason = failure_reason(error)
        raise ValueError(
            f"cannot load the draft model '{path}' (--draft-model): {reason}"
        ) from None


def speculator_for(config: EngineConfig, draft: Draft, kv: KVManager) -> Speculator | None:
    """The engine's speculator (None when ``config.speculative`` is "off"); ``ValueError``
    saying why when it cannot run. ``draft``: the model runner's draft (draft_runner.py)."""
    if config.speculative == "off":
        return None
    drafter = DRAFTERS[config.speculative](draft, kv)
    return Speculator(drafter, config.draft_length)
