"""The every-architecture test's workload and its verdicts: one engine per module, several
requests batched with chunked prefill in a pool small enough to preempt, then a prompt that
resumes from another's cached prefix, every reply held to mlx-lm's own greedy generation; and a
refused module's load, which must fail with the families table's reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model.families import unsupported_reason
from tests.support.architectures import tiny_config
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import random_prompts
from tests.support.tiny import model_of

REPLY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
# 8 blocks of 8 tokens for four prompts that need 11: someone is preempted; a 16-token budget
# chunks the 23-token prompt
WORKLOAD = dict(num_blocks=8, block_size=8, max_num_batched_tokens=16)
BATCHED = [6, 23, 12, 17]


def assert_served_like_mlx_lm(name: str, tokenizer) -> None:
    """``name``'s tiny model, served by one engine, answers as mlx-lm does."""
    model = model_of(tiny_config(name))
    engine = Engine(model, tokenizer, EngineConfig(**WORKLOAD))  # type: ignore[arg-type]
    prompts = random_prompts(BATCHED, seed=5)
    outs = engine.generate(prompts, REPLY)
    assert engine.stats().preemptions > 0, "the workload must preempt"
    # a prompt whose first two blocks another prompt has just filled
    (first,) = random_prompts([19], seed=6)
    resumed = first[:16] + random_prompts([5], seed=7)[0]
    outs += engine.generate([first], REPLY) + engine.generate([resumed], REPLY)
    assert outs[-1].metrics is not None and outs[-1].metrics.cached_tokens > 0, "no prefix hit"
    for i, (prompt, out) in enumerate(zip([*prompts, first, resumed], outs)):
        assert out.error is None, out.error
        assert out.token_ids == mlx_lm_greedy(model, prompt, REPLY.max_tokens), f"request {i}"
    assert_pool_idle(engine)


def assert_refused_at_load(name: str, folder: Path) -> None:
    """Loading a checkpoint of ``name`` fails before its weights are read, with the families
    table's reason."""
    reason = unsupported_reason(name)
    assert reason is not None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(tiny_config(name)))
    with pytest.raises(ValueError, match="is not supported") as refusal:
        Engine.load(str(folder))
    assert reason in str(refusal.value)
