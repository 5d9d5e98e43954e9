"""Mamba 2 layers' recurrence in two parts at a cut, so a verification leaves its rollback
snapshot inside one call of the layer (``model/state_cut.py``).

Mamba 2 mixers (Nemotron-H, Granite 4.0-H, Falcon-H1, PLaMo 2) run their state-space scan
through mlx-lm's ``ssm_update``. Inside a cut (``state_cut.cut_at``) this runs it over the
tokens before the cut and then the rest, from the state the first part left, and hands that
state to the cut; the scan is per token, so the two parts compute what one call would. Outside a
cut, and everywhere outside the engine's step, it is mlx-lm's own call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from macbatch.engine.model import state_cut
from macbatch.engine.model.reroute import reroute

# ssm_update's arguments with one entry per token (axis 1); the others are per layer
_PER_TOKEN = ("hidden_states", "B", "C", "dt")


def install() -> None:
    """Route mlx-lm's ``ssm_update``, in every loaded model module that imported it, through
    ``_dispatcher``."""
    from mlx_lm.models import ssm

    for name in reroute(ssm, "ssm_update", _dispatcher):
        state_cut.route(name)


def _dispatcher(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        cut = state_cut.current()
        if cut is None:
            return original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        named = bound.arguments
        plain = named["mask"] is None and named["lengths"] is None
        if not state_cut.splits(cut, named["hidden_states"].shape[1], plain):
            return original(*args, **kwargs)

        def part(span: slice, start: mx.array | None) -> tuple[mx.array, mx.array]:
            sliced = {key: named[key][:, span] for key in _PER_TOKEN}
            return original(**dict(named, **sliced, state=start))

        return state_cut.in_two_parts(cut, part, named["state"])

    return dispatch
