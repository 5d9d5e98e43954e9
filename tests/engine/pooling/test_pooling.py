"""Pooling requests against a direct forward of the same mlx-lm model on one unpadded input:
batched with generation requests, chunked, under preemption, from the prefix cache; freed at
once; the reranker's yes/no score; and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from macbatch.engine import (
    Engine,
    EngineConfig,
    PoolingParams,
    PromptTooLongError,
    SamplingParams,
    UnsupportedModelError,
)
from macbatch.engine.pooling.embedding_profile import profile_of
from tests.support.oracle import assert_pool_idle, mlx_lm_greedy
from tests.support.pooling_oracle import cosine, direct_pooled, direct_yes_probability
from tests.support.real_tokenizers import load_real_tokenizer, model_for
from tests.support.sentence_transformers import QWEN3_QUERY_PROMPT, write_sentence_transformers
from tests.support.tiny import build_model, save_model

TEXTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog " * 6,
    "MLX runs on Apple silicon; macbatch batches many prompts at once.",
    "Summarize the following article in one sentence. " * 9,
    "a",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? . , ; : ' \"" * 3,
]


@pytest.fixture(scope="module")
def qwen3():
    return model_for("qwen3"), load_real_tokenizer("qwen3")


def _engine(model, tokenizer, **config) -> Engine:
    return Engine(model, tokenizer, EngineConfig(block_size=8, **config))


def _assert_matches(output, model, ids, method, normalize=True, dimensions=None) -> None:
    expected = direct_pooled(model, ids, method, normalize, dimensions)
    vector = output.embedding
    assert vector.dtype == np.float32 and vector.shape == expected.shape
    assert cosine(vector, expected) >= 0.99999
    assert abs(np.linalg.norm(vector) - np.linalg.norm(expected)) <= 1e-4 * max(
        1.0, float(np.linalg.norm(expected))
    )


@pytest.mark.parametrize("method", ["last", "mean", "cls"])
def test_pooled_with_generation_chunked_and_preempted(qwen3, method):
    """Pooling requests share packed steps with generating ones, in chunks of at most 16
    tokens, in a pool small enough to preempt: every vector matches the direct forward's, the
    generated tokens still match mlx-lm's, and every block is back afterwards."""
    model, tokenizer = qwen3
    engine = _engine(model, tokenizer, num_blocks=14, max_num_batched_tokens=16)
    generation = [tokenizer.encode(t) for t in TEXTS[:2]]
    pooling = PoolingParams(method=method, normalize=False)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    prompts = generation + TEXTS
    outputs = engine.generate(prompts, [greedy] * 2 + [pooling] * len(TEXTS))
    assert engine.stats().preemptions > 0
    for ids, out in zip(generation, outputs[:2]):
        assert out.token_ids == mlx_lm_greedy(model, ids, 12)
        assert out.embedding is None
    for text, out in zip(TEXTS, outputs[2:]):
        assert out.token_ids == [] and out.finish_reason.value == "stop"
        _assert_matches(out, model, tokenizer.encode(text), method, normalize=False)
    assert_pool_idle(engine)


def test_normalized_and_matryoshka(qwen3):
    model, tokenizer = qwen3
    engine = _engine(model, tokenizer, num_blocks=64)
    ids = tokenizer.encode(TEXTS[1])
    full, cut = engine.generate(
        [TEXTS[1]] * 2, [PoolingParams(method="mean"), PoolingParams(method="mean", dimensions=24)]
    )
    _assert_matches(full, model, ids, "mean")
    _assert_matches(cut, model, ids, "mean", dimensions=24)
    assert abs(np.linalg.norm(cut.embedding) - 1.0) < 1e-5 and cut.embedding.shape == (24,)


def test_pipelined_and_synchronous_agree(qwen3):
    model, tokenizer = qwen3
    params = PoolingParams(method="mean")
    vectors = [
        [o.embedding for o in _engine(model, tokenizer, pipelined=p).generate(TEXTS, params)]
        for p in (True, False)
    ]
    for a, b in zip(*vectors):
        np.testing.assert_array_equal(a, b)


def test_last_token_pooling_resumes_from_prefix_cache_mean_does_not(qwen3):
    """Last-token pooling may start from cached blocks (it reads only the last row); mean
    pooling needs every row, so it recomputes them, and both still match the oracle."""
    model, tokenizer = qwen3
    engine = _engine(model, tokenizer, num_blocks=64)
    shared = TEXTS[3] + " and then some more"
    engine.generate([TEXTS[3]], PoolingParams())
    last, mean = engine.generate([shared, shared], [PoolingParams(), PoolingParams(method="mean")])
    assert last.metrics.cached_tokens > 0 and mean.metrics.cached_tokens == 0
    _assert_matches(last, model, tokenizer.encode(shared), "last")
    _assert_matches(mean, model, tokenizer.encode(shared), "mean")


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_5", "lfm2"])
def test_other_families(arch, tiny_tokenizer):
    """A sliding-window model (gemma3_text, window 8) pools over its whole prompt too, and
    hybrids (qwen3_5, lfm2) carry their recurrent state across the chunks."""
    model = build_model(arch)
    engine = _engine(model, tiny_tokenizer, num_blocks=64, max_num_batched_tokens=8)
    text = TEXTS[1]
    for method in ("last", "mean"):
        (out,) = engine.generate([text], PoolingParams(method=method))
        _assert_matches(out, model, tiny_tokenizer.encode(text), method)


def test_abort_frees_a_pooling_request(qwen3):
    model, tokenizer = qwen3
    engine = _engine(model, tokenizer, num_blocks=64, max_num_batched_tokens=8)
    rid = engine.add_request(TEXTS[3], PoolingParams(method="mean"))
    engine.step()
    engine.abort(rid)
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert [o.finish_reason.value for o in outputs if o.finished] == ["abort"]
    assert outputs[-1].embedding is None
    assert_pool_idle(engine)


def test_refusals(qwen3):
    model, tokenizer = qwen3
    engine = _engine(model, tokenizer, num_blocks=64, max_model_len=32)
    long_text = TEXTS[1] * 3
    with pytest.raises(PromptTooLongError, match="longer than the model's context"):
        engine.add_request(long_text, PoolingParams())
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("", PoolingParams())
    with pytest.raises(ValueError, match="dimensions"):
        engine.add_request("hi", PoolingParams(dimensions=65))
    with pytest.raises(ValueError, match="pooling method"):
        PoolingParams(method="max")
    (cut,) = engine.generate([long_text], PoolingParams(truncate=True))
    assert cut.metrics.prompt_tokens == 32
    _assert_matches(cut, model, tokenizer.encode(long_text)[:32], "last")


def test_reranker_scores_match_the_models_own_logits(qwen3, tmp_path):
    """Yes/no scores equal P(yes) from the model's full forward to 1e-4, rank the same, and
    pairs with one query share its prefix blocks."""
    model, tokenizer = qwen3
    engine = Engine(model, tokenizer, EngineConfig(block_size=8, num_blocks=128, reranker=True))
    rerank = engine.info.model.embedding.rerank
    assert rerank is not None and rerank.score_tokens == (9693, 2152)  # "yes", "no"
    query = "what does macbatch batch?"
    prompts = [rerank.prompt_ids(tokenizer, query, d) for d in TEXTS]
    params = PoolingParams(score_tokens=rerank.score_tokens)
    # the first pair first: the others then find the query's blocks cached
    outputs = engine.generate(prompts[:1], params) + engine.generate(prompts[1:], params)
    expected = [direct_yes_probability(model, ids, *rerank.score_tokens) for ids in prompts]
    scores = [o.score for o in outputs]
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    assert np.argsort(scores).tolist() == np.argsort(expected).tolist()
    assert all(o.metrics.cached_tokens >= 40 for o in outputs[1:])
    assert all(o.embedding is None for o in outputs)


def test_profile_from_sentence_transformers_files(tmp_path, tiny_tokenizer):
    """Qwen3-Embedding's files: last-token pooling, a Normalize module, its query prompt."""
    from mlx_lm.utils import load_tokenizer

    path = write_sentence_transformers(save_model(tmp_path / "Qwen3-Embedding-tiny"))
    profile = profile_of(load_tokenizer(path), str(path), 64)
    assert profile.pooling == "last" and profile.normalize and profile.embedding_model
    assert profile.prompts == {"query": QWEN3_QUERY_PROMPT, "document": ""}
    assert profile.rerank is None
    write_sentence_transformers(path, ("mean_tokens",), normalize=False)
    profile = profile_of(load_tokenizer(path), str(path), 64)
    assert profile.pooling == "mean" and not profile.normalize
    write_sentence_transformers(path, ("mean_tokens", "cls_token"))
    with pytest.raises(ValueError, match="exactly one"):
        profile_of(load_tokenizer(path), str(path), 64)
    plain = profile_of(tiny_tokenizer, "demo", 64)
    assert plain.pooling == "last" and plain.normalize and not plain.embedding_model


def test_encoder_checkpoints_do_not_load_as_generation_models(tmp_path):
    """A BERT-family checkpoint is refused by the paged engine before its weights load, saying
    what serves it (its own engine: ``load_engine``)."""
    path = save_model(tmp_path / "bge-tiny")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, model_type="bert")))
    with pytest.raises(UnsupportedModelError, match="an encoder model: it embeds and scores"):
        Engine.load(str(path))


def test_blocks_go_back_when_the_last_chunk_is_dispatched(qwen3):
    """Freed at once: once the step computing its last chunk is dispatched the request holds no
    block (they idle in the prefix cache), before its vector is even read."""
    model, tokenizer = qwen3
    engine = _engine(model, tokenizer, num_blocks=64, max_num_batched_tokens=16)
    rid = engine.add_request(TEXTS[1], PoolingParams(method="mean"))
    steps = 0
    while engine.scheduler.running or engine.scheduler.waiting:
        assert engine.step() == []
        steps += 1
    assert steps == -(-len(tokenizer.encode(TEXTS[1])) // 16)  # one step per chunk
    assert (engine.kv.pool.refcounts == 0).all() and engine.kv.pool.num_cached > 0
    [output] = engine.step()  # the pipelined step reads the last one's vector now
    assert output.request_id == rid and output.finished and output.embedding is not None
