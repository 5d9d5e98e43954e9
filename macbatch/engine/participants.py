"""The step's side participants: what takes part in a step beside the scheduler, the KV manager
and the runner, behind the hooks the step calls in its phases (anchor: vLLM's KV connector,
whose ``start_load_kv`` / ``wait_for_save`` the model runner calls around its forward). The
engine iterates a short list of the ones a model has (``participants_of``): the vision rows of a
packed step, the drafter fed the step's hidden states (an MTP layer), the disk tier copying
prompt blocks out with the step. A plain text model's list is empty, and its step calls none.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from macbatch.engine.core.scheduler import Scheduler, StepPlan
from macbatch.engine.kv.disk.tier import DiskTier
from macbatch.engine.kv.manager import KVManager
from macbatch.engine.model.batch import PackedBatch
from macbatch.engine.multimodal.vision import VisionEncoder
from macbatch.engine.speculative.drafter_pages import DrafterPages
from macbatch.engine.speculative.speculator import Speculator
from macbatch.engine.worker.model_runner import ModelRunner


class StepParticipant:
    """The phases of a step a participant may take part in; each does nothing unless a
    participant overrides it."""

    def packed(self, batch: PackedBatch, plan: StepPlan) -> None:
        """The step's batch is packed and its forward not built yet: add rows of its own."""

    def launching(self, plan: StepPlan, step: int) -> Sequence[mx.array]:
        """The step (the engine's ``step``-th) is forwarded and sampled, about to start on the
        device: the arrays to evaluate with it."""
        return ()

    def stepped(self, plan: StepPlan, in_flight: bool) -> None:
        """The step is done on the host (``in_flight``: its tokens are read by the next)."""

    def done(self, step: int) -> None:
        """The ``step``-th step is done on the device: its tokens are being read."""

    def close(self) -> None:
        """The engine stops stepping."""


class VisionRows(StepParticipant):
    """A packed step's image rows, embeddings, blocks and M-RoPE positions (the runner's vision
    encoder, docs/vision.md)."""

    def __init__(self, encoder: VisionEncoder) -> None:
        self.encoder = encoder

    def packed(self, batch: PackedBatch, plan: StepPlan) -> None:
        self.encoder.add_to_step(batch, plan.chunks)


class DrafterObservation(StepParticipant):
    """The step's hidden states handed to the drafter (``Drafter.observe``: an MTP layer drafts
    from them), with the batch size it drafts at."""

    def __init__(self, speculator: Speculator, runner: ModelRunner, scheduler: Scheduler) -> None:
        self.speculator, self.runner, self.scheduler = speculator, runner, scheduler

    def launching(self, plan: StepPlan, step: int) -> Sequence[mx.array]:
        hidden = self.runner.hidden
        if hidden is None:
            return ()
        return self.speculator.observe(plan.chunks, hidden, len(self.scheduler.running))


class DiskCopies(StepParticipant):
    """The disk tier below the prefix cache (kv/disk/): blocks worth keeping copied out with
    the step, or at once when no step is in flight to ride along with."""

    def __init__(self, tier: DiskTier, scheduler: Scheduler) -> None:
        self.tier, self.scheduler = tier, scheduler

    def launching(self, plan: StepPlan, step: int) -> Sequence[mx.array]:
        return self.tier.capture(step)

    def done(self, step: int) -> None:
        """The step's copies go to the writer (done, so this does not wait)."""
        self.tier.flush(step)

    def stepped(self, plan: StepPlan, in_flight: bool) -> None:
        """With no step in flight, blocks named since the last step are copied out now; with
        nothing to run, wait a moment for a waiting request's blocks being read from disk
        (instead of spinning)."""
        if not in_flight:
            self.tier.capture_now()
            if not plan.chunks and self.scheduler.waiting:
                self.tier.wait(0.005)

    def close(self) -> None:
        """Write what the tier holds."""
        self.tier.close()


def participants_of(
    runner: ModelRunner, kv: KVManager, scheduler: Scheduler, speculator: Speculator | None
) -> list[StepParticipant]:
    """The participants of this engine's steps, in the order each phase calls them."""
    found: list[StepParticipant] = []
    encoder = runner.vision.encoder
    if encoder is not None:
        found.append(VisionRows(encoder))
    if speculator is not None and isinstance(runner.draft, DrafterPages):
        found.append(DrafterObservation(speculator, runner, scheduler))
    if kv.disk is not None:
        found.append(DiskCopies(kv.disk, scheduler))
    return found
