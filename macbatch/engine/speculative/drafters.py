"""The drafters' registry: each method's drafter, built from the runner of the draft model and
the KV manager, and the engine's speculator over the configured one."""

from __future__ import annotations

from collections.abc import Callable

import mlx.nn as nn

from macbatch.engine.config import EngineConfig
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.speculative.draft_model import DraftModelDrafter
from macbatch.engine.speculative.draft_runner import DraftRunner
from macbatch.engine.speculative.mtp import MtpDrafter
from macbatch.engine.speculative.mtp_runner import MtpRunner
from macbatch.engine.speculative.ngram import NgramDrafter
from macbatch.engine.speculative.protocol import Drafter
from macbatch.engine.speculative.speculator import Speculator


def _draft(draft: DraftRunner | MtpRunner | None, kv: KVManager) -> Drafter:
    if not isinstance(draft, DraftRunner):
        raise ValueError("speculative 'draft' needs a draft model (--draft-model PATH)")
    return DraftModelDrafter(draft, kv)


def _mtp(draft: DraftRunner | MtpRunner | None, kv: KVManager) -> Drafter:
    if not isinstance(draft, MtpRunner):
        raise ValueError(
            "speculative 'mtp' needs the checkpoint's MTP layer (Engine.load reads it; "
            "Engine(..., draft_model=load_mtp_head(...)) for a model built in code)"
        )
    return MtpDrafter(draft, kv)


# each method's drafter (keys: methods.SPECULATIVE_METHODS), from the runner of the draft model
# or the MTP layer (None without one) and the KV manager
DRAFTERS: dict[str, Callable[[DraftRunner | MtpRunner | None, KVManager], Drafter]] = {
    "ngram": lambda _draft, _kv: NgramDrafter(),
    "draft": _draft,
    "mtp": _mtp,
}


def load_draft_model(path: str | None) -> nn.Module:
    """The draft model at ``path`` (a local directory or a hub id), as mlx-lm loads it."""
    if not path:
        raise ValueError("speculative 'draft' needs a draft model (--draft-model PATH)")
    from mlx_lm import load

    from macbatch.engine.loader import failure_reason

    try:
        return load(path)[0]
    except Exception as error:  # mlx-lm's errors come in many types: all name the draft
        reason = failure_reason(error)
        raise ValueError(
            f"cannot load the draft model '{path}' (--draft-model): {reason}"
        ) from None


def speculator_for(
    config: EngineConfig, draft: DraftRunner | MtpRunner | None, kv: KVManager
) -> Speculator | None:
    """The engine's speculator (None when ``config.speculative`` is "off"); ``ValueError``
    saying why when it cannot run. ``draft``: the model runner's draft (draft_runner.py)."""
    if config.speculative == "off":
        return None
    drafter = DRAFTERS[config.speculative](draft, kv)
    return Speculator(drafter, config.draft_length)
