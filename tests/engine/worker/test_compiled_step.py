"""The compiled decode step (engine/worker/compiled_step.py) computes what the uncompiled forward
does:
the same logits bit for bit on the same step, the same greedy ids as mlx-lm's own generation, and
a clean fallback wherever it cannot run (hybrid models, a backend that plans on the host, steps
that are not small decodes)."""

from __future__ import annotations

import mlx.core as mx
import pytest

import macbatch.metal as metal
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.worker.compiled_step import MAX_BATCH
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.staggered import random_prompts, run_staggered
from tests.support.tiny import build_model

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def _engine(model, tokenizer, after: int | None = 0, **config) -> Engine:
    config = dict(num_blocks=64, block_size=8, max_num_batched_tokens=32) | config
    return Engine(model, tokenizer, EngineConfig(compile_decode_after=after, **config))


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text", "gpt_oss", "gemma4", "glm4_moe_lite"])
def test_compiled_decode_matches_mlx_lm(arch, tiny_tokenizer):
    """Staggered requests (one alone at first, then a few together, chunked prefills between)
    decode compiled from the first step and match mlx-lm's single-request greedy ids; gemma3
    has a sliding-window cache group, gpt_oss sinks and experts, gemma4 (a multimodal wrapper)
    layers that read another layer's K/V, glm4_moe_lite latent pages (MLA: one page array a
    layer, no values)."""
    model = build_model(arch)
    engine = _engine(model, tiny_tokenizer)
    prompts = random_prompts([5, 19, 3, 30], seed=7)
    results = run_staggered(engine, prompts, GREEDY, join_every=12)
    for i, prompt in enumerate(prompts):
        assert results[i] == mlx_lm_greedy(model, prompt, GREEDY.max_tokens), f"request {i}"
    compiled = engine.runner.compiled
    assert compiled is not None and compiled.compiled_shapes >= 3  # widths and batch sizes
    assert_pool_idle(engine)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3_text"])
def test_compiled_logits_equal_uncompiled(arch, tiny_tokenizer):
    """On the same decode step, the compiled forward's logits equal the uncompiled forward's
    bit for bit (one request, then three)."""
    model = build_model(arch)
    engine = _engine(model, tiny_tokenizer, pipelined=False)
    for count in (1, 3):
        for prompt in random_prompts([9 + i for i in range(count)], seed=count):
            engine.add_request(prompt, SamplingParams(max_tokens=30, temperature=0))
        for _ in range(12):  # prefilled and decoding
            engine.step()
        batch = engine._pack(engine.scheduler.schedule(), None)
        assert batch.num_tokens == count
        runner = engine.runner
        assert runner.compiled is not None
        compiled = runner.compiled.forward(batch)
        plain = runner.adapter.forward(batch, runner.kv_stores)  # writes the same K/V again
        assert compiled is not None and plain is not None and compiled.hidden is None
        assert mx.array_equal(compiled.logits, plain).item()
        for request_id in list(engine._requests):
            engine.abort(request_id)
        engine.step()


@pytest.mark.parametrize("kv_bits", [8, 4])
def test_compiled_decode_over_quantized_pages(kv_bits, tiny_tokenizer):
    """Quantized K/V pages: the compiled step quantizes its writes as the uncompiled one does,
    and the ids match mlx-lm attending over the same rounded values."""
    model = build_model("qwen3")
    engine = _engine(model, tiny_tokenizer, kv_bits=kv_bits)
    prompts = random_prompts([6, 21], seed=3)
    results = run_staggered(engine, prompts, GREEDY, join_every=15)
    for i, prompt in enumerate(prompts):
        expected = mlx_lm_greedy(model, prompt, GREEDY.max_tokens, kv_bits, kv_group_size=16)
        assert results[i] == expected, f"request {i}"
    assert engine.runner.compiled is not None and engine.runner.compiled.compiled_shapes


def test_sampling_is_unchanged_by_compiling(tiny_tokenizer):
    """Seeded sampling with filters, penalties and logprobs gives the same tokens and logprobs
    compiled and uncompiled (sampling itself runs outside the compiled graph)."""
    model = build_model("qwen3")
    params = SamplingParams(
        max_tokens=30, temperature=0.8, top_p=0.9, top_k=20, seed=5, logprobs=2,
        repetition_penalty=1.1, ignore_eos=True,
    )  # fmt: skip
    prompts = random_prompts([8, 13], seed=11)
    outs = [_engine(model, tiny_tokenizer, after).generate(prompts, params) for after in (0, None)]
    for compiled, plain in zip(*outs):
        assert compiled.token_ids == plain.token_ids
        assert compiled.logprobs == plain.logprobs
        assert compiled.top_logprobs == plain.top_logprobs


def test_compiles_only_after_enough_steps(tiny_tokenizer):
    """``compile_decode_after``: the first that many small decode steps run uncompiled (a short
    request never compiles), and None never compiles."""
    model = build_model("qwen3")
    prompt = random_prompts([5])[0]
    short = _engine(model, tiny_tokenizer, after=64)
    short.generate([prompt], SamplingParams(max_tokens=20, temperature=0))
    assert short.runner.compiled is not None and short.runner.compiled.compiled_shapes == 0
    long = _engine(model, tiny_tokenizer, after=8)
    out = long.generate([prompt], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    assert long.runner.compiled is not None and long.runner.compiled.compiled_shapes > 0
    assert out[0].token_ids == mlx_lm_greedy(model, prompt, 20)
    assert _engine(model, tiny_tokenizer, after=None).runner.compiled is None


def test_large_batches_and_prefill_steps_run_uncompiled(tiny_tokenizer):
    """More than ``MAX_BATCH`` decoding requests, or a step with a prefill chunk, take the
    uncompiled forward; the ids still match mlx-lm."""
    model = build_model("qwen3")
    engine = _engine(model, tiny_tokenizer, max_num_batched_tokens=64)
    prompts = random_prompts([4] * (MAX_BATCH + 1), seed=2)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    outs = engine.generate(prompts, params)
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, params.max_tokens)
    assert engine.runner.compiled is not None and engine.runner.compiled.compiled_shapes == 0


def test_backend_that_plans_on_the_host_falls_back(tiny_tokenizer, monkeypatch):
    """The pure-MLX reference plans from the host copies of the metadata, which a replayed
    graph would not update: its steps run uncompiled, and still match mlx-lm."""
    monkeypatch.setenv(metal.ENV, "reference")
    model = build_model("qwen3")
    engine = _engine(model, tiny_tokenizer)
    prompt = random_prompts([7])[0]
    out = engine.generate([prompt], GREEDY)[0]
    assert out.token_ids == mlx_lm_greedy(model, prompt, GREEDY.max_tokens)
    assert engine.runner.compiled is not None and engine.runner.compiled.compiled_shapes == 0


def test_hybrid_models_are_not_compiled(tiny_tokenizer):
    """A hybrid's recurrent layers gather and scatter state slots the host plans: no compiled
    step is built, and decoding matches mlx-lm as before."""
    model = build_model("qwen3_5")
    engine = _engine(model, tiny_tokenizer)
    assert engine.runner.compiled is None
    prompt = random_prompts([6])[0]
    out = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0))[0]
    assert out.token_ids == mlx_lm_greedy(model, prompt, 12)


def test_compiled_steps_write_the_pages_in_place(tiny_tokenizer):
    """A pipelined compiled step of a one-layer model is encoded while the step before it is
    still in flight; its page writes must still happen in place (MLX copies an array it cannot
    write in place): the peak memory of many steps stays far below a second pool."""
    model = build_model("qwen3", num_hidden_layers=1)
    engine = _engine(model, tiny_tokenizer, num_blocks=16384)  # 64 MiB of pages
    pool = engine.runner.kv_stores.nbytes
    engine.add_request(random_prompts([5])[0], SamplingParams(max_tokens=60, temperature=0))
    for _ in range(8):
        engine.step()
    mx.synchronize()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    while engine.has_unfinished():
        engine.step()
    assert engine.runner.compiled is not None and engine.runner.compiled.compiled_shapes
    assert mx.get_peak_memory() - before < pool // 4


def test_a_growing_pool_recompiles(tiny_tokenizer):
    """An elastic pool that grows mid-decode changes the pages' shapes: the compiled step is
    traced again over the new pages, and the ids still match mlx-lm."""
    model = build_model("qwen3")
    config = EngineConfig(
        block_size=8, max_num_seqs=2, max_num_batched_tokens=32, kv_start_mib=0.0,
        compile_decode_after=0,
    )  # fmt: skip
    engine = Engine(model, tiny_tokenizer, config)
    start = engine.kv.pool.num_blocks
    prompts = random_prompts([5, 9], seed=4)
    outs = engine.generate(prompts, SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    assert engine.kv.pool.num_blocks > start
    for prompt, out in zip(prompts, outs):
        assert out.token_ids == mlx_lm_greedy(model, prompt, 60)
    compiled = engine.runner.compiled
    assert compiled is not None and compiled.compiled_shapes > 2
