"""Speculative decoding keeps greedy outputs exactly the target's: mlx-lm's own greedy generation
is the oracle, for each drafter, across the parity architectures, through chunked prefill,
preemption, prefix-cache hits and quantized KV pages; rejected drafts give their blocks back."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.speculative.ngram import NgramDrafter
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.tiny import ARCH_CONFIGS, build_model

pytestmark = pytest.mark.usefixtures("eager_speculation")

# Prompts that repeat themselves (prompt lookup finds drafts) and one that does not; long
# enough to be prefilled in chunks at max_num_batched_tokens=16.
PROMPTS = [
    [40, 41, 42, 43, 44, 45, 46, 47, 40, 41, 42, 43, 44, 45, 46, 47, 40, 41, 42],
    [90 + (i % 5) for i in range(23)],
    [200, 17, 33, 250, 8, 300, 120, 64, 5],
]
MAX_TOKENS = 20


def _engine(model, tokenizer, speculative: str, draft=None, **config) -> Engine:
    settings = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    settings.update(config)
    return Engine(
        model,
        tokenizer,
        EngineConfig(speculative=speculative, num_speculative_tokens=4, **settings),
        draft_model=draft,
    )


def _greedy(engine: Engine, prompts=PROMPTS) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    outputs = [out.token_ids for out in engine.generate(prompts, params)]
    assert_pool_idle(engine)
    return outputs


@pytest.fixture(scope="module")
def models():
    return {arch: build_model(arch) for arch in ARCH_CONFIGS}


@pytest.mark.parametrize("arch", sorted(ARCH_CONFIGS))
@pytest.mark.parametrize("drafter", ["ngram", "draft-same", "draft-other"])
def test_greedy_outputs_are_mlx_lms_with_every_drafter(models, tiny_tokenizer, arch, drafter):
    model = models[arch]
    draft = {"draft-same": model, "draft-other": build_model("llama", seed=3)}.get(drafter)
    engine = _engine(model, tiny_tokenizer, "draft" if draft is not None else "ngram", draft)
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    stats = engine.stats()
    assert stats.speculation.verifications > 0 and stats.speculation.drafted > 0
    if drafter == "draft-same":  # the target drafting for itself: every draft holds
        assert stats.speculation.accepted == stats.speculation.drafted
        assert stats.steps < 3 * MAX_TOKENS  # several tokens per step
    if drafter == "draft-other":  # a random draft: most are rejected, and rolled back
        assert stats.speculation.accepted < stats.speculation.drafted


@pytest.mark.parametrize("kv_bits", [None, 8])
@pytest.mark.parametrize("num_blocks", [8, 64])  # 8 blocks of 8: requests are preempted
def test_preemption_and_prefix_cache_hits_with_float_and_quantized_kv(
    models, tiny_tokenizer, kv_bits, num_blocks
):
    model = models["qwen3"]
    off = _greedy(_engine(model, tiny_tokenizer, "off", kv_bits=kv_bits, num_blocks=num_blocks))
    engine = _engine(model, tiny_tokenizer, "ngram", kv_bits=kv_bits, num_blocks=num_blocks)
    assert _greedy(engine) == off
    assert engine.stats().speculation.accepted > 0
    if num_blocks == 8:
        assert engine.stats().preemptions > 0
    else:
        assert _greedy(engine) == off  # again: every prompt's blocks are in the prefix cache
        assert engine.stats().prefix_cache_hit_rate > 0.3
    if kv_bits is None:
        assert off == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]


def test_rejected_drafts_release_their_blocks(models, tiny_tokenizer):
    """A rejected draft's slots past the accepted tokens go back to the pool at once, and the
    prefix cache names only blocks of accepted tokens (they match the non-speculative run's)."""
    model = models["qwen3"]
    draft = build_model("llama", seed=3)
    engine = _engine(model, tiny_tokenizer, "draft", draft, pipelined=False)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    rid = engine.add_request(PROMPTS[2], params)
    request = engine._requests[rid]
    held = []  # after each synchronous step: the blocks held, and the tokens computed
    while engine.has_unfinished():
        engine.step()
        if not request.finished:
            held.append((len(engine.kv.block_table(rid)), request.num_computed_tokens))
    assert engine.stats().speculation.accepted < engine.stats().speculation.drafted
    assert held and all(blocks == -(-computed // 8) for blocks, computed in held)
    reference = _engine(model, tiny_tokenizer, "off")
    _greedy(reference, [PROMPTS[2]])
    assert engine.kv.pool.num_cached == reference.kv.pool.num_cached


def test_ngram_lookup_proposes_what_followed_the_latest_match():
    drafter = NgramDrafter(max_ngram=3)
    assert drafter.lookup([1, 2, 3, 4, 5, 9, 2, 3], 2) == [4, 5]  # "2 3" matched
    assert drafter.lookup([1, 2, 3, 7, 1, 2, 3, 8, 9, 1, 2, 3], 2) == [8, 9]  # the latest
    assert drafter.lookup([1, 2, 3, 7, 1, 2, 3], 4) == [7, 1, 2, 3]  # latest with 4 after
    assert drafter.lookup([5, 6, 7], 3) == []  # nothing repeats
    assert drafter.lookup([4, 4, 4, 4], 3) == [4]  # only one token follows any match


def test_refusals_say_what_to_do(models, tiny_tokenizer):
    with pytest.raises(ValueError, match="draft model"):
        _engine(models["qwen3"], tiny_tokenizer, "draft")
    with pytest.raises(ValueError, match="needs the checkpoint's MTP layer"):
        _engine(models["qwen3"], tiny_tokenizer, "mtp")
    with pytest.raises(ValueError, match="speculative must be one of"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ValueError, match="vocabulary"):
        _engine(models["qwen3"], tiny_tokenizer, "draft", build_model("llama", vocab_size=512))


def test_stops_inside_an_accepted_run_cut_it(models, tiny_tokenizer):
    """EOS-like stop tokens, stop strings and max_tokens that fall inside a run of accepted
    drafts end the reply exactly where they end it without speculation."""
    model = models["qwen3"]
    prompt = PROMPTS[0]
    reference = mlx_lm_greedy(model, prompt, MAX_TOKENS)
    text = tiny_tokenizer.decode(reference[:9])
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop_token_ids=[reference[6]]),
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, stop=text[-3:]),
        SamplingParams(max_tokens=7, temperature=0, ignore_eos=True, logprobs=1),
    ]
    off = _engine(model, tiny_tokenizer, "off").generate([prompt] * 3, params)
    engine = _engine(model, tiny_tokenizer, "draft", model)  # every draft holds: long runs
    on = engine.generate([prompt] * 3, params)
    for a, b in zip(off, on):
        assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)
    assert len(on[2].token_ids) == len(on[2].logprobs) == 7
    assert engine.stats().speculation.accepted > 0
    assert_pool_idle(engine)


def test_engine_load_loads_the_draft_model(tiny_model_path):
    """``EngineConfig.draft_model`` names a model directory that ``Engine.load`` loads beside the
    target (here the target itself: every draft holds)."""
    config = EngineConfig(
        speculative="draft", draft_model=str(tiny_model_path), num_blocks=64, block_size=8
    )
    engine = Engine.load(str(tiny_model_path), config)
    plain = Engine.load(str(tiny_model_path), EngineConfig(num_blocks=64, block_size=8))
    assert _greedy(engine) == _greedy(plain)
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted == spec.drafted
    # the draft's pages are in the target's blocks: what the prefix cache keeps holds both
    stats, draft = engine.stats(), engine.runner.draft
    assert draft is not None and stats.draft_kv_bytes == engine.kv.pool.num_occupied * (
        draft.bytes_per_block
    )
