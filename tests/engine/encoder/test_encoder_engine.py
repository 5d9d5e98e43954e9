"""The encoder engine (``load_engine`` of an encoder checkpoint, driven by ``EngineThread``)
against the float64 numpy oracle: long-tailed inputs with mixed pooling packed into shared
passes, cross-encoder pairs with their token types, BGE-M3's sparse and ColBERT outputs; beside
a generation engine on the same device whose tokens still equal mlx-lm's; and its refusals."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mlx_lm
import numpy as np
import pytest

from macbatch.engine import (
    EngineConfig,
    EngineThread,
    FinishReason,
    PoolingParams,
    PromptInput,
    SamplingParams,
    TextPair,
    Turns,
    load_engine,
)
from tests.support.encoder_checkpoints import long_tailed_texts, write_encoder, write_m3_heads
from tests.support.encoder_oracle import (
    cosines,
    oracle_colbert,
    oracle_embedding,
    oracle_hidden,
    oracle_lexical,
    oracle_score,
)
from tests.support.oracle import mlx_lm_greedy
from tests.support.sentence_transformers import write_sentence_transformers

BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PASS_TOKENS = 300  # rows of one pass: the 24 inputs take several


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    path, weights, config = write_encoder(tmp_path_factory.mktemp("enc") / "bge", "bert")
    write_sentence_transformers(path, ("mean_tokens",), normalize=True, prompts={})
    sparse, colbert = write_m3_heads(path)
    thread = EngineThread(
        lambda: load_engine(str(path), EngineConfig(max_num_batched_tokens=PASS_TOKENS))
    ).start()
    thread.wait_ready(120)
    special = {tokenizer_of(path).token_to_id(t) for t in BERT_SPECIALS}
    yield thread, weights, config, (sparse, colbert, special)
    thread.shutdown()


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    path, weights, config = write_encoder(
        tmp_path_factory.mktemp("rerank") / "bge-reranker", "bert", classifier=True
    )
    thread = EngineThread(lambda: load_engine(str(path))).start()
    thread.wait_ready(120)
    yield thread, weights, config
    thread.shutdown()


def tokenizer_of(path: Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json"))


def _finals(thread: EngineThread, jobs: list[tuple[object, PoolingParams]]) -> list:
    async def run() -> list:
        requests = [thread.prepare(prompt_of(p), params) for p, params in jobs]
        outputs = [None] * len(requests)
        stream = thread.stream_prepared(requests)
        async for index, out in stream:
            outputs[index] = out
        return outputs

    return asyncio.run(run())


def prompt_of(prompt: Any) -> PromptInput:
    return PromptInput(prompt)


def _params(i: int) -> PoolingParams:
    """Mixed requests in the same passes: the model's mean pooling, CLS rows, Matryoshka cuts."""
    if i % 5 == 0:
        return PoolingParams(method="cls")
    return PoolingParams(dimensions=16) if i % 3 == 0 else PoolingParams()


def test_packed_passes_equal_the_oracle(embedder) -> None:
    thread, weights, config, _ = embedder
    texts = long_tailed_texts(24, seed=4)
    before = thread.stats().steps
    outputs = _finals(thread, [(t, _params(i)) for i, t in enumerate(texts)])
    steps = thread.stats().steps - before
    lengths = [o.metrics.prompt_tokens for o in outputs]
    assert sum(lengths) > 3 * PASS_TOKENS and max(lengths) > 4 * int(np.median(lengths))
    assert 3 <= steps < len(texts) // 2  # several passes, each holding many requests
    for i, out in enumerate(outputs):
        params = _params(i)
        ids = thread.encode_prompt(texts[i])
        want = oracle_embedding(
            weights, config, ids, params.method or "mean", True, params.dimensions
        )
        assert out.finish_reason is FinishReason.STOP and out.embedding.dtype == np.float32
        assert out.embedding.shape == want.shape
        assert cosines(out.embedding, want) >= 0.99999
        assert abs(np.linalg.norm(out.embedding) - 1.0) <= 1e-4


def test_bge_m3_sparse_and_colbert_through_the_engine(embedder) -> None:
    thread, weights, config, (sparse, colbert, special) = embedder
    texts = long_tailed_texts(6, seed=11)
    outputs = _finals(thread, [(t, PoolingParams(lexical=True, colbert=True)) for t in texts])
    for text, out in zip(texts, outputs):
        ids = thread.encode_prompt(text)
        hidden = oracle_hidden(weights, config, ids, [0] * len(ids))
        want = oracle_lexical(hidden, ids, sparse, special)
        assert out.lexical_weights.keys() == want.keys()
        np.testing.assert_allclose(
            [out.lexical_weights[k] for k in want], list(want.values()), atol=1e-4
        )
        assert cosines(out.colbert_vectors, oracle_colbert(hidden, colbert)).min() >= 0.99999


def test_cross_encoder_pairs_carry_their_token_types(cross_encoder) -> None:
    thread, weights, config = cross_encoder
    docs = long_tailed_texts(10, seed=5)
    query = "how are blocks freed"
    outputs = _finals(thread, [(TextPair(query, d), PoolingParams()) for d in docs])
    for doc, out in zip(docs, outputs):
        request = thread.prepare(prompt_of(TextPair(query, doc)), PoolingParams())
        ids, types = request.prompt_token_ids, request.token_types
        assert types is not None and types[0] == 0 and types[-1] == 1  # the document: type 1
        assert abs(out.score - oracle_score(weights, config, ids, types)) <= 1e-5
    zero = oracle_score(weights, config, ids, [0] * len(ids))
    assert abs(zero - outputs[-1].score) > 1e-4  # the types change the score


def test_beside_a_generation_engine_on_the_same_device(embedder, tiny_model_path: Path) -> None:
    """An encoder's rows cannot share a decoder's forward (other weights), so the two engines
    take turns of one device; the decoder's greedy tokens still equal mlx-lm's."""
    from macbatch.engine import Engine

    encoder, weights, config, _ = embedder
    turns = Turns()
    decoder = EngineThread(lambda: Engine.load(str(tiny_model_path)), device=turns).start()
    decoder.wait_ready(120)
    try:
        prompts = [[1, 2, 3, 4], [5, 6, 7]]
        greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

        async def both() -> tuple[list, list]:
            generating = [decoder.prepare(prompt_of(p), greedy) for p in prompts]
            texts = long_tailed_texts(8, seed=2)
            embedding = [encoder.prepare(prompt_of(t), PoolingParams()) for t in texts]
            outs_g: list = [None] * 2
            outs_e: list = [None] * len(texts)

            async def gather(stream, into) -> None:
                async for index, out in stream:
                    into[index] = out

            await asyncio.gather(
                gather(decoder.stream_prepared(generating), outs_g),
                gather(encoder.stream_prepared(embedding), outs_e),
            )
            return outs_g, list(zip(texts, outs_e))

        generated, embedded = asyncio.run(both())
        model = mlx_lm.load(str(tiny_model_path))[0]
        for prompt, out in zip(prompts, generated):
            assert out.token_ids == mlx_lm_greedy(model, prompt, 6)
        for text, out in embedded:
            want = oracle_embedding(weights, config, encoder.encode_prompt(text), "mean", True)
            assert cosines(out.embedding, want) >= 0.99999
    finally:
        decoder.shutdown()


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ("hi", SamplingParams(max_tokens=2), "it embeds and scores, not generates"),
        (TextPair("a", "b"), PoolingParams(), "no head that scores pairs"),
        ("", PoolingParams(), "prompt is empty"),
        ([1] * 600, PoolingParams(), "ask for truncation"),
        ("hi", PoolingParams(dimensions=65), "more than the model's 64"),
    ],
)
def test_refusals(embedder, prompt, params, message) -> None:
    thread = embedder[0]
    with pytest.raises(ValueError, match=message):
        thread.prepare(prompt_of(prompt), params)


def test_a_cross_encoder_only_scores(cross_encoder) -> None:
    thread = cross_encoder[0]
    with pytest.raises(ValueError, match="cross-encoder: it scores"):
        thread.prepare(prompt_of("a text"), PoolingParams())
    with pytest.raises(ValueError, match="BGE-M3's heads"):
        thread.prepare(prompt_of(TextPair("a", "b")), PoolingParams(lexical=True))
    assert thread.info.model.tasks == ("score", "rerank")
