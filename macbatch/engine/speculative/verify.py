"""Verifying drafts inside the packed step, exactly.

A speculating request's chunk is its last token plus k drafts; the forward gives target logits
for k+1 rows, and row j is sampled as the request's next token would be after drafts ``0..j-1``
(``DraftRow``): its penalties count them, its seed key is its position in the reply, its
grammar mask is the grammar's state after them. So each row's sample is exactly the token the
request would get without speculation, given that context.

Drafters here propose deterministically (a point-mass draft distribution q, as prompt lookup
and a greedy draft model do). Speculative sampling accepts draft x with probability
min(1, p(x)/q(x)) = p(x) and, on rejection, samples from normalize(max(p - q, 0)): p without
x. Sampling t ~ p and accepting iff t == x does both at once: P(accept) = p(x), and a rejected
t is p conditioned on t != x. So the emitted run (``emitted_rows``) is the drafts up to the
first row whose sample differs, then that sample (or the bonus row's when all agree): for
greedy rows the longest matching prefix plus the target's next token; for any temperature,
top-p, top-k, penalty or seed the target's own distribution, and a seeded request gives the
same tokens with and without speculation. Logprobs are the target's rows'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from macbatch.engine.core.request import Request
from macbatch.engine.sample.params import SamplingParams
from macbatch.engine.structured_output.constraints import ConstraintState


@dataclass(eq=False)
class DraftRow:
    """Row j > 0 of a verification chunk as the sampler sees it: the request with its first j
    drafts appended (``prefix``), and the grammar's state after them (``constraint``)."""

    request: Request
    prefix: list[int]
    constraint: ConstraintState | None

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def seed(self) -> int:
        return self.request.seed

    @property
    def finished(self) -> bool:
        return self.request.finished

    @property
    def num_generated(self) -> int:
        return self.request.num_generated + len(self.prefix)

    @property
    def all_token_ids(self) -> list[int]:
        return self.request.all_token_ids + self.prefix

    @property
    def output_token_ids(self) -> list[int]:
        return self.request.output_token_ids + self.prefix

    def forced_token(self) -> int | None:
        """None: a request with a thinking budget never speculates (policy.py)."""
        return None


def draft_rows(request: Request, drafts: list[int]) -> tuple[list[int], list[DraftRow]]:
    """The drafts worth verifying and a row after each (row j: after ``drafts[:j]``; the last
    is the bonus row). A constrained request's
    drafts stop at the first its grammar refuses (masked to probability 0, the target would
    reject it anyway); each row's grammar is a copy advanced by the drafts before it, so the
    request's own matcher only ever sees accepted tokens: rejected ones need no rollback."""
    state = request.constraint
    if state is None:
        return drafts, [DraftRow(request, drafts[:j], None) for j in range(1, len(drafts) + 1)]
    matcher = state.matcher.deep_copy()
    rows: list[DraftRow] = []
    for j, token in enumerate(drafts):
        if matcher.is_stopped() or not matcher.consume_token(token):
            return drafts[:j], rows
        rows.append(DraftRow(request, drafts[: j + 1], ConstraintState(matcher.deep_copy())))
    return drafts, rows


def emitted_rows(drafts: Sequence[int], sampled: Sequence[int]) -> int:
    """How many of the k+1 rows' samples a verification emits: the samples up to and
    including the first that differs from its row's draft (all k+1 when every draft holds)."""
    for j, token in enumerate(drafts):
        if sampled[j] != token:
            return j + 1
    return len(drafts) + 1
