"""Llama 4's chunked attention (``engine/model/attention_chunks.py``): each query attends to the
keys of its own chunk only. The cut metadata is held to a float64 numpy oracle of the chunked
mask, and a tiny llama4 served in a packed batch (chunked prefill across chunk boundaries, its
layer without RoPE scaling queries by position) gives mlx-lm's own greedy tokens and their
log-probabilities."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import macbatch.metal
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model.attention_chunks import chunked
from macbatch.engine.model.kv_probe import UnsupportedModelError
from macbatch.metal import AttentionMetadata, LayerParams
from tests.support.architectures import tiny_config
from tests.support.oracle import assert_matches_mlx_lm
from tests.support.staggered import random_prompts
from tests.support.tiny import model_of

CHUNK, BLOCK = 8, 4


def _oracle(q, keys, values, lens, q_lens, scale):
    """Float64 attention of each packed row over its own chunk's keys (``keys`` per sequence)."""
    out, row = [], 0
    for k, v, n, ql in zip(keys, values, lens, q_lens):
        for pos in range(n - ql, n):
            lo = pos // CHUNK * CHUNK
            s = (q[row] @ k[:, lo : pos + 1].transpose(0, 2, 1)) * scale  # [Hq=Hkv, 1, L]
            p = np.exp(s - s.max(-1, keepdims=True))
            out.append(((p / p.sum(-1, keepdims=True)) @ v[:, lo : pos + 1])[:, 0])
            row += 1
    return np.stack(out)


def test_cut_sequences_attend_within_their_chunks():
    rng = np.random.default_rng(0)
    heads, dim = 2, 8
    lens, q_lens = [3, 21, 17, 9], [1, 15, 1, 9]  # a decode row past a chunk; prefills across
    blocks = [list(rng.permutation(40)[: -(-n // BLOCK)]) for n in lens]
    width = max(map(len, blocks))
    tables = np.array([b + [0] * (width - len(b)) for b in blocks])
    k_pages = rng.standard_normal((40, heads, BLOCK, dim)).astype(np.float32)
    v_pages = rng.standard_normal((40, heads, BLOCK, dim)).astype(np.float32)
    q = rng.standard_normal((sum(q_lens), heads, dim)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(q_lens)])
    meta = chunked(AttentionMetadata.build(tables, np.array(lens), cu), CHUNK, BLOCK)
    layer = LayerParams(dim**-0.5)
    got = macbatch.metal.paged_attention(
        mx.array(q), mx.array(k_pages), mx.array(v_pages), meta, layer
    )
    keys = [k_pages[b].transpose(1, 0, 2, 3).reshape(heads, -1, dim) for b in blocks]
    values = [v_pages[b].transpose(1, 0, 2, 3).reshape(heads, -1, dim) for b in blocks]
    want = _oracle(q[:, :, None].astype(np.float64), keys, values, lens, q_lens, dim**-0.5)
    np.testing.assert_allclose(np.array(got), want, atol=1e-5)


def test_rows_in_their_first_chunk_keep_the_step_metadata():
    meta = AttentionMetadata.build(np.zeros((2, 2)), np.array([5, 8]), np.array([0, 5, 6]))
    assert chunked(meta, CHUNK, BLOCK) is meta


@pytest.fixture(scope="module")
def llama4():
    return model_of(tiny_config("llama4"))


def test_llama4_matches_mlx_lm_log_probabilities(llama4, tiny_tokenizer):
    config = EngineConfig(num_blocks=32, block_size=8, max_num_batched_tokens=16)
    engine = Engine(llama4, tiny_tokenizer, config)  # type: ignore[arg-type]
    prompts = random_prompts([3, 21, 12], seed=11)
    reply = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0)
    for prompt, out in zip(prompts, engine.generate(prompts, reply)):
        assert_matches_mlx_lm(llama4, prompt, out)


def test_blocks_that_split_a_chunk_are_refused(llama4, tiny_tokenizer):
    with pytest.raises(UnsupportedModelError, match="chunks of 8 positions"):
        Engine(llama4, tiny_tokenizer, EngineConfig(num_blocks=32, block_size=16))  # type: ignore[arg-type]
