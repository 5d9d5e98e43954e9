"""A recurrent layer's state after the first tokens of a call, taken inside that one call.

A speculating request's verification chunk must leave its recurrent state after its first token
(the snapshot to roll back to, ``RecurrentStateGroup._verify_flow``) as well as after the whole
chunk. Cut into two layer calls, the whole decoder layer (projections, MLP) runs twice on 1 and
then ``k`` tokens: its weights are read twice per verification, where decoding is bound by
reading them (a 5-row verification of a Qwen3.5-shaped model cost 2.2 one-row steps, mlx-lm's
own 5-row forward 1.8).

Inside ``cut_at(n)`` the layer runs once over all its tokens; the hooks it passes through record
what the state after ``n`` tokens is made of: the depthwise convolution its input
(``depthwise_conv.ShiftedConv1d``; the window after ``n`` tokens is a slice of it), the
recurrence its state after ``n`` tokens (the dispatchers of ``gated_delta`` for Gated DeltaNet
and ``ssm_cut`` for Mamba 2 run it in two parts: ``in_two_parts``). ``Cut.after_cut`` assembles
them in the order of mlx-lm's recurrent caches (LFM2's short convolution has the window alone).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import mlx.core as mx


@dataclass
class Cut:
    """What one layer call recorded of its state after ``at`` tokens."""

    at: int
    conv_inputs: list[mx.array] = field(default_factory=list)
    states: list[mx.array] = field(default_factory=list)

    def after_cut(self, final: list[mx.array]) -> list[mx.array]:
        """The layer's cache arrays after ``at`` tokens, from its ``final`` ones (every
        recurrent layer of mlx-lm's: the convolution window, then the recurrence's state where
        it has one)."""
        if len(self.conv_inputs) != 1 or len(self.states) != len(final) - 1:
            raise RuntimeError(
                f"a cut layer call with {len(final)} cache arrays passed "
                f"{len(self.conv_inputs)} depthwise convolutions and {len(self.states)} "
                "routed recurrences (one, and one per array after the first, expected)"
            )
        window = final[0].shape[1]
        return [self.conv_inputs[0][:, self.at : self.at + window], *self.states]


def in_two_parts(
    cut: Cut,
    part: Callable[[slice, mx.array | None], tuple[mx.array, mx.array]],
    state: mx.array | None,
) -> tuple[mx.array, mx.array]:
    """A recurrence over a call's tokens as ``part`` (outputs ``[B, T, ...]`` and the state
    after the tokens of a slice, from ``state``) before and after the cut, leaving the state
    between them to ``cut``."""
    y_head, middle = part(slice(0, cut.at), state)
    cut.states.append(middle)
    y_tail, end = part(slice(cut.at, None), middle)
    return mx.concatenate([y_head, y_tail], axis=1), end


def splits(cut: Cut, length: int, unmasked: bool) -> bool:
    """Whether a recurrence over ``length`` tokens runs in two parts at ``cut``."""
    return unmasked and 0 < cut.at < length


def route(module: str) -> None:
    """Note that ``module`` (a model module's name) runs its recurrence through a dispatcher
    that leaves its state at a cut (``routes``)."""
    _routed.add(module)


def routes(cls: type) -> bool:
    """Whether ``cls`` (a layer class) runs its recurrence through such a dispatcher."""
    return cls.__module__ in _routed


_routed: set[str] = set()
_active: list[Cut] = []


@contextlib.contextmanager
def cut_at(at: int) -> Iterator[Cut]:
    """While inside, the recurrent layer called records its state after ``at`` tokens (the
    engine's step runs one layer call at a time: steps of several engines take turns,
    ``engine/device.py``)."""
    cut = Cut(at)
    _active.append(cut)
    try:
        yield cut
    finally:
        _active.pop()


def current() -> Cut | None:
    """The cut being recorded (None: none)."""
    return _active[-1] if _active else None
