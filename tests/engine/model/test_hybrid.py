"""Hybrid models (recurrent layers among attention layers) through the packed, paged engine:
greedy tokens equal mlx-lm's own single-request generation for every family, with chunked
prefill, requests joining a running batch, preemption, and loading from the Hugging Face layout
(float and 4-bit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import (
    GREEDY,
    STAGGERED,
    assert_loading_matches_mlx_lm,
    assert_preemption_recomputes_identically,
    assert_staggered_batch_matches_mlx_lm,
    random_prompts,
    run_staggered,
)
from tests.support.tiny import HYBRID_CONFIGS, build_model


@pytest.mark.parametrize("arch", list(HYBRID_CONFIGS))
def test_staggered_batch_with_chunked_prefill(arch, tiny_tokenizer):
    """Nine requests join at different steps; a 24-token budget splits the longer prompts over
    several steps, so a recurrent layer resumes a prompt from its slot's state while decodes
    of other requests share the same forward."""
    model = build_model(arch)
    engine = Engine(model, tiny_tokenizer, EngineConfig(**STAGGERED))
    assert engine.runner.adapter.hybrid
    assert_staggered_batch_matches_mlx_lm(engine, model)


@pytest.mark.parametrize("arch", ["qwen3_5", "falcon_h1"])
def test_preemption_recomputes_from_a_fresh_state(arch, tiny_tokenizer):
    """A pool too small for everyone preempts; the recomputed requests start from zero state
    (their slot went to others meanwhile) and give mlx-lm's tokens."""
    model = build_model(arch)
    assert_preemption_recomputes_identically(model, tiny_tokenizer, enable_prefix_caching=True)


@pytest.mark.parametrize("arch", ["qwen3_5", "falcon_h1"])
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "4-bit"])
def test_loaded_from_the_hugging_face_layout(quantized, arch, tmp_path: Path):
    """``Engine.load`` of a saved checkpoint (and of mlx-lm's own 4-bit conversion of it) gives
    the tokens of ``mlx_lm.load`` + ``generate_step`` on the same files."""
    assert_loading_matches_mlx_lm(tmp_path, arch, quantized, group_size=64)


@pytest.mark.parametrize("arch", ["qwen3_5", "nemotron_h", "falcon_h1"])
def test_a_conversation_resumes_from_state_checkpoints(arch, tiny_tokenizer):
    """Each turn's prompt is the previous turn's prompt and reply plus new tokens (a chat, an
    agent loop): from turn 2 on the request resumes after the longest cached prefix that has a
    recurrent-state checkpoint, and its tokens stay mlx-lm's."""
    model = build_model(arch)
    config = EngineConfig(num_blocks=256, block_size=8, max_num_batched_tokens=48)
    engine = Engine(model, tiny_tokenizer, config)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompt: list[int] = []
    cached = []
    for turn, new in enumerate(random_prompts([30, 9, 17, 4, 25, 11], seed=7)):
        prompt = prompt + new
        [out] = engine.generate([prompt], params)
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens), f"turn {turn}"
        cached.append(out.metrics.cached_tokens)
        prompt = prompt + out.token_ids
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    assert engine.stats().prefix_cache_hit_rate > 0.5
    assert_pool_idle(engine)


def test_requests_sharing_a_prefix_in_one_batch(tiny_tokenizer):
    """Several requests with one long shared prefix, run together after a first one cached it:
    they resume from its checkpoint and decode side by side."""
    model = build_model("qwen3_5")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=256, block_size=8))
    shared = random_prompts([40], seed=11)[0]
    engine.generate([shared + [5]], GREEDY)
    prompts = [shared + tail for tail in random_prompts([3, 9, 1, 6], seed=12)]
    outs = engine.generate(prompts, GREEDY)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)
        assert out.metrics.cached_tokens == 40
    assert_pool_idle(engine)


@pytest.mark.parametrize("length", [40, 43], ids=["on a block boundary", "past one"])
def test_the_same_prompt_again_resumes(length, tiny_tokenizer):
    """The same prompt twice (a job rerun, a retried request): the second resumes as far as a
    prompt can, one token short of its end rounded down to a block, also when the prompt ends
    exactly on a block boundary (its checkpoint is then taken one block earlier)."""
    model = build_model("qwen3_5")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=256, block_size=8))
    prompt = random_prompts([length], seed=31)[0]
    first, again = (engine.generate([prompt], GREEDY)[0] for _ in range(2))
    expected = mlx_lm_greedy(model, prompt, GREEDY.max_tokens)
    assert first.token_ids == again.token_ids == expected
    assert (first.metrics.cached_tokens, again.metrics.cached_tokens) == (0, (length - 1) // 8 * 8)
    assert_pool_idle(engine)


def test_a_shared_prompt_gets_its_own_checkpoint(tiny_tokenizer):
    """A job's rows share a system prompt, then differ. The first row checkpoints only at its
    own last block boundary (past the shared part); the second finds the shared K/V cached
    without a checkpoint, so it leaves one at the end of the shared blocks, and every later row
    resumes there."""
    model = build_model("qwen3_5")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=256, block_size=8))
    system = random_prompts([37], seed=21)[0]  # 4 whole blocks shared (32 tokens), then 5 more
    rows = [system + tail for tail in random_prompts([19, 6, 11, 8], seed=22)]
    cached = []
    for row in rows:
        [out] = engine.generate([row], GREEDY)
        assert out.token_ids == mlx_lm_greedy(model, row, GREEDY.max_tokens)
        cached.append(out.metrics.cached_tokens)
    assert cached == [0, 0, 32, 32]
    assert_pool_idle(engine)


def test_long_prompts_take_the_chunked_prefill(tiny_tokenizer, monkeypatch):
    """Prompts of several chunks (``gated_delta.CHUNK`` tokens) in one step run the chunked
    gated-delta prefill (each up to its last block boundary, where it leaves a checkpoint);
    their tokens and log-probabilities stay mlx-lm's, which steps through the prompt token by
    token here. Their depthwise convolutions run as shifted sums (``depthwise_conv``)."""
    from macbatch.engine.model.hooks import depthwise_conv, gated_delta
    from tests.support.oracle import mlx_lm_greedy_logprobs

    model = build_model("qwen3_5")
    engine = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=256, block_size=16))
    lengths: list[int] = []
    chunked = gated_delta.chunked_gated_delta

    def counting(*args):
        lengths.append(args[0].shape[1])
        return chunked(*args)

    monkeypatch.setattr(gated_delta, "chunked_gated_delta", counting)
    prompts = random_prompts([150, 3 * gated_delta.CHUNK + 5], seed=31)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=0)
    outs = engine.generate(prompts, params)
    layers = len(engine.runner.adapter.state_shapes)
    assert sorted(lengths) == [144] * layers + [192] * layers  # cut at the last 16-token block
    shifted = [m for _, m in model.named_modules() if type(m) is depthwise_conv.ShiftedConv1d]
    assert len(shifted) == layers
    for prompt, out in zip(prompts, outs):
        want = mlx_lm_greedy_logprobs(model, prompt, params.max_tokens)
        assert out.token_ids == [token for token, _ in want]
        assert out.logprobs == pytest.approx([lp for _, lp in want], abs=1e-4)


@pytest.mark.parametrize("arch", ["qwen3_5", "nemotron_h"])
def test_decode_rows_in_groups(arch, tiny_tokenizer, monkeypatch):
    """The one-token rows run in groups of at most two (``recurrent.GROUP_BYTES``, which keeps
    a step's state buffers off fresh mappings at Qwen3.5 sizes): reads, writes and checkpoints
    cross group boundaries, and the tokens stay mlx-lm's."""
    from macbatch.engine.model import recurrent

    model = build_model(arch)
    engine = Engine(
        model, tiny_tokenizer, EngineConfig(num_blocks=96, block_size=8, max_num_batched_tokens=24)
    )
    assert engine.runner.states is not None
    widest = max(a[0].nbytes for layer in engine.runner.states.states for a in layer)
    monkeypatch.setattr(recurrent, "GROUP_BYTES", 2 * widest)
    prompts = random_prompts([1, 5, 37, 12, 3, 60, 8, 25, 2], seed=5)
    results = run_staggered(engine, prompts, GREEDY)
    for i, prompt in enumerate(prompts):
        assert results[i] == mlx_lm_greedy(model, prompt, GREEDY.max_tokens), f"request {i}"
    assert_pool_idle(engine)
