"""An MTP layer nobody drafts with costs no prompt pass: a request the policy does not expect to
draft soon (``SpeculationPolicy.drafts_soon``) has none of its prompt rows run through the MTP
layer, and when it drafts anyway (a probe) its reply is still the target's. Oracles: mlx-lm's
greedy generation of the target, and the positions of the rows the MTP runner was handed."""

from __future__ import annotations

import numpy as np
import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.speculative import mtp, step_costs
from macbatch.engine.speculative.policy import MAX_REST, MIN_ACCEPTANCE, SpeculationPolicy
from tests.support.mtp import PROMPTS, mtp_target, predicting_mtp_head, random_mtp_head
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy

MAX_TOKENS = 16
# a new request's reply longer than the longest rest (a failing drafter's next request starts
# from the rest the last one reached): it probes
NEW_TOKENS = MAX_REST + 8
# a prompt none of PROMPTS shares a block with, three chunks at a 16-token budget
NEW_PROMPT = [100 + (i * 7) % 90 for i in range(40)]


@pytest.fixture
def unmeasured(monkeypatch: pytest.MonkeyPatch) -> None:
    """No break-even measured: the step times of a busy machine do not decide whether drafting
    pays at a batch size (policy tests measure it on a fake clock); acceptance alone does."""
    monkeypatch.setattr(step_costs.StepCosts, "break_even", lambda self, batch: None)
    monkeypatch.setattr(step_costs.StepCosts, "wants_plain", lambda self, batch: False)


def _engine(model, tokenizer, head, **config) -> Engine:
    settings = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    settings.update(config)
    config = EngineConfig(speculative="mtp", num_speculative_tokens=3, **settings)
    return Engine(model, tokenizer, config, draft_model=head)


def _greedy(engine: Engine, prompts: list[list[int]], tokens: int = MAX_TOKENS) -> list[list[int]]:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    return [o.token_ids for o in engine.generate(prompts, params)]


def _stepped_positions(engine: Engine) -> list[int]:
    """A list that the positions of every row the MTP runner runs are appended to from now on
    (its prompt pass, catch-ups and drafts)."""
    runner = engine.runner.draft
    step = runner.step
    positions: list[int] = []

    def recording(batch, hidden):
        positions.extend(np.array(batch.positions).tolist())
        return step(batch, hidden)

    runner.step = recording
    return positions


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("predicts", [False, True])
def test_a_new_request_s_prompt_pass_runs_only_where_drafts_hold(
    arch, predicts, tiny_tokenizer, unmeasured
):
    """After requests whose drafts failed (a random MTP layer: the drafter's acceptance so far
    below MIN_ACCEPTANCE), a new request's prompt rows are not run through the MTP layer, yet
    it probes (a catch-up from its first decode row) and replies as mlx-lm does; after drafts
    that held, every prompt row is written and its drafts hold."""
    model = mtp_target(arch)
    head = predicting_mtp_head(model) if predicts else random_mtp_head(model)
    engine = _engine(model, tiny_tokenizer, head)
    policy = engine.speculator.policy
    for _ in range(4):
        assert _greedy(engine, PROMPTS) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
        if policy.prior < MIN_ACCEPTANCE:
            break
    assert (policy.prior < MIN_ACCEPTANCE) != predicts
    before = engine.stats().speculation
    positions = _stepped_positions(engine)
    new = _greedy(engine, [NEW_PROMPT], NEW_TOKENS)
    assert new == [mlx_lm_greedy(model, NEW_PROMPT, NEW_TOKENS)]
    prompt_rows = {p for p in positions if p < len(NEW_PROMPT) - 1}
    assert prompt_rows == (set(range(len(NEW_PROMPT) - 1)) if predicts else set())
    after = engine.stats().speculation
    assert after.verifications > before.verifications  # it drafted (a probe, if it failed)
    if predicts:
        assert after.accepted - before.accepted > (after.drafted - before.drafted) / 2
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("num_blocks", [10, 64])  # 10 blocks of 8: requests are preempted
def test_requests_that_skipped_their_prompt_pass_draft_from_their_decode_rows(
    arch, num_blocks, tiny_tokenizer, eager_speculation, monkeypatch
):
    """A policy that never expects a request to draft soon, and requests that draft anyway
    (every step they may): no prompt row is written, each catch-up starts at the request's
    first decode row, the replies are mlx-lm's (preempted, and from the prefix cache, too), and
    a layer that predicts the target still has most drafts held."""
    monkeypatch.setattr(SpeculationPolicy, "drafts_soon", lambda self, request_id, batch: False)
    model = mtp_target(arch)
    engine = _engine(model, tiny_tokenizer, predicting_mtp_head(model), num_blocks=num_blocks)
    positions = _stepped_positions(engine)
    expected = [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert _greedy(engine, PROMPTS) == expected
    assert _greedy(engine, PROMPTS) == expected  # again: prefix-cache hits, or preemptions
    assert min(positions) >= min(len(p) for p in PROMPTS) - 1
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted > spec.drafted / 2
    if num_blocks == 10:
        assert engine.stats().preemptions > 0
    assert_pool_idle(engine)


@pytest.mark.parametrize("drafts_soon", [False, True])
def test_a_request_not_expected_to_draft_keeps_few_hidden_rows(
    drafts_soon, tiny_tokenizer, monkeypatch
):
    """Requests that decode long without drafting (a policy that never chooses them) keep the
    hidden states of their last ``IDLE_KEPT`` decode steps when not expected to draft soon, and
    every step's when they are (up to ``MAX_KEPT``); the replies are mlx-lm's either way."""
    monkeypatch.setattr(SpeculationPolicy, "choose", lambda self, running, now=None: [])
    monkeypatch.setattr(SpeculationPolicy, "drafts_soon", lambda self, request, batch: drafts_soon)
    model = mtp_target("qwen3_5")
    engine = _engine(model, tiny_tokenizer, predicting_mtp_head(model), num_blocks=128)
    drafter = engine.speculator.drafter
    observe = drafter.observe
    most: dict[str, int] = {}

    def recording(chunks, hidden, drafting):
        arrays = observe(chunks, hidden, drafting)
        for request_id, segments in drafter._hidden.items():
            kept = sum(s.rows.shape[0] for s in segments)
            most[request_id] = max(most.get(request_id, 0), kept)
        return arrays

    drafter.observe = recording
    tokens = 2 * mtp.IDLE_KEPT
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    outs = [o.token_ids for o in engine.generate(PROMPTS, params)]
    assert outs == [mlx_lm_greedy(model, p, tokens) for p in PROMPTS]
    if drafts_soon:  # the prompt's last row (the rest written at once) and every decode's
        assert sorted(most.values()) == [tokens] * len(PROMPTS)
    else:
        assert sorted(most.values()) == [mtp.IDLE_KEPT] * len(PROMPTS)
    assert_pool_idle(engine)
