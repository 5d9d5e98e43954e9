"""A Gated DeltaNet layer's state after the first tokens of a call, taken inside that one call.

A speculating request's verification chunk must leave its recurrent state after its first token
(the snapshot to roll back to, ``RecurrentStateGroup._verify_flow``) as well as after the whole
chunk. Cut into two layer calls, the whole decoder layer (projections, MLP) runs twice on 1 and
then ``k`` tokens: its weights are read twice per verification, where decoding is bound by
reading them (a 5-row verification of a Qwen3.5-shaped model cost 2.2 one-row steps, mlx-lm's
own 5-row forward 1.8).

Inside ``cut_at(n)`` the layer runs once over all its tokens; the two hooks it passes through
record what the state after ``n`` tokens is made of: the depthwise convolution its input
(``depthwise_conv.ShiftedConv1d``; the window after ``n`` tokens is a slice of it), the gated
delta recurrence its matrix state after ``n`` tokens (``gated_delta``'s dispatcher runs the
recurrence in two parts). ``Cut.states`` assembles them in mlx-lm's Gated DeltaNet cache order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import mlx.core as mx


@dataclass
class Cut:
    """What one layer call recorded of its state after ``at`` tokens."""

    at: int
    conv_inputs: list[mx.array] = field(default_factory=list)
    states: list[mx.array] = field(default_factory=list)

    def after_cut(self, final: list[mx.array]) -> list[mx.array]:
        """The layer's cache arrays after ``at`` tokens, from its ``final`` ones (mlx-lm's Gated
        DeltaNet: the convolution window, then the recurrence's state)."""
        if len(self.conv_inputs) != 1 or len(self.states) != 1 or len(final) != 2:
            raise RuntimeError(
                "a cut layer call must pass one depthwise convolution and one gated delta "
                f"recurrence (saw {len(self.conv_inputs)} and {len(self.states)})"
            )
        window = final[0].shape[1]
        return [self.conv_inputs[0][:, self.at : self.at + window], self.states[0]]


_active: list[Cut] = []


@contextlib.contextmanager
def cut_at(at: int) -> Iterator[Cut]:
    """While inside, the Gated DeltaNet layer called records its state after ``at`` tokens."""
    cut = Cut(at)
    _active.append(cut)
    try:
        yield cut
    finally:
        _active.pop()


def current() -> Cut | None:
    """The cut being recorded (None: none)."""
    return _active[-1] if _active else None
