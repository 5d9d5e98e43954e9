"""Encoder embedding throughput: macbatch's packed encoder (no padding in the linear layers,
attention per group of similar lengths) against padded batches of the same model (what
mlx-embeddings and sentence-transformers do: batches in arrival order, each padded to its
longest input, a key mask), on long-tailed lengths from 16 to 2,048 tokens. A random
BERT-base-shaped float32 model (hidden 768, 12 heads, FFN 3072) cut to a few layers; CLS
pooling, normalized; both sides' vectors are checked to agree. ``--engine`` also runs the same
corpus as requests through the encoder engine (what serve and run drive: one pass of
``--budget`` rows a step, picked by length from a window of the waiting requests).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.encoder_embeddings [--docs 64] [--layers 2]
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer, models

from benchmarks.common import warn_without_openblas
from benchmarks.embeddings import (
    corpus_arguments,
    describe_corpus,
    long_tailed_lengths,
    padded_batches,
    report,
)
from macbatch.commands.workload import Clock
from macbatch.engine import EngineConfig, PoolingParams
from macbatch.engine.encoder.bert import Encoder
from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.encoder.engine import EncoderEngine
from macbatch.engine.encoder.model import EncoderInput, EncoderModel
from macbatch.engine.encoder.varlen import Group, VarlenLayout
from macbatch.engine.pooling.embedding_profile import EmbeddingProfile


def bert_base(layers: int) -> EncoderConfig:
    return EncoderConfig.from_dict(
        {"model_type": "bert", "vocab_size": 30522, "hidden_size": 768,
         "num_hidden_layers": layers, "num_attention_heads": 12, "intermediate_size": 3072,
         "max_position_embeddings": 2048}
    )  # fmt: skip


def padded_layout(lengths: list[int]) -> VarlenLayout:
    """One group of every input padded to the longest, its pad rows kept as rows (computed by
    every layer, as a padded batch computes them)."""
    width = max(lengths)
    keys = np.zeros((len(lengths), width), dtype=bool)
    for b, n in enumerate(lengths):
        keys[b, :n] = True
    every = mx.arange(len(lengths) * width)
    group = Group(
        gather=every,
        keys=mx.array(keys[:, None, None, :]),
        valid=every,
        lengths=mx.array(keys.sum(1, keepdims=True).astype(np.float32)),
        batch=len(lengths),
        length=width,
    )
    return VarlenLayout(groups=(group,), restore=every, members=mx.arange(len(lengths)))


def padded_embed(model: Encoder, docs: list[list[int]], batch: int) -> np.ndarray:
    vectors = []
    for group, ids in padded_batches(docs, batch):
        width = ids.shape[1]
        positions = np.tile(np.arange(width, dtype=np.int32), len(group))
        layout = padded_layout([len(d) for d in group])
        hidden = model(mx.array(ids.reshape(-1)), mx.array(positions),
                       mx.zeros(ids.size, dtype=mx.int32), layout)  # fmt: skip
        cls = hidden[mx.arange(len(group)) * width].astype(mx.float32)
        cls = cls / mx.linalg.norm(cls, axis=-1, keepdims=True)
        vectors.append(np.array(cls))
    return np.concatenate(vectors)


def engine_embed(encoder: EncoderModel, docs: list[list[int]], budget: int) -> np.ndarray:
    """The corpus as requests through the encoder engine, every one queued at once."""
    engine = EncoderEngine(encoder, EngineConfig(max_num_batched_tokens=budget), "bench")
    requests = [engine.prepare_request(d, PoolingParams(), None) for d in docs]
    for request in requests:
        engine.enqueue(request)
    vectors = {}
    while engine.has_unfinished():
        vectors.update((out.request_id, out.embedding) for out in engine.step())
    return np.stack([vectors[r.request_id] for r in requests])


def main() -> None:
    parser = corpus_arguments(__doc__.splitlines()[0], 64, 128, 2048, 8192)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--engine", action="store_true", help="also through the encoder engine")
    args = parser.parse_args()
    warn_without_openblas()
    model = Encoder(bert_base(args.layers))
    mx.eval(model.parameters())
    blank = Tokenizer(models.WordPiece({"[UNK]": 0}, unk_token="[UNK]"))
    encoder = EncoderModel(model, blank, EmbeddingProfile(pooling="cls", hidden_size=768), "bench")
    rng = np.random.default_rng(1)
    lengths = [max(16, n) for n in long_tailed_lengths(args.docs, args.median, args.longest)]
    docs = [rng.integers(1000, 30000, size=n).tolist() for n in lengths]
    inputs = [EncoderInput(tuple(d), (0,) * len(d)) for d in docs]
    tokens = describe_corpus(lengths, args.batch)
    encoder.embed(inputs[:4])  # warm up
    padded_embed(model, docs[:4], 4)
    clock = Clock()
    packed = encoder.embed(inputs, max_batch_tokens=args.budget)
    packed_wall, packed_cpu = clock.read()
    clock = Clock()
    plain = padded_embed(model, docs, args.batch)
    padded_wall, padded_cpu = clock.read()
    worst = float((packed * plain).sum(-1).min())
    report("encoder", tokens, (packed_wall, packed_cpu), (padded_wall, padded_cpu), worst)
    if args.engine:
        clock = Clock()
        served = engine_embed(encoder, docs, args.budget)
        wall, cpu = clock.read()
        report("engine", tokens, (wall, cpu), (padded_wall, padded_cpu),
               float((served * plain).sum(-1).min()))  # fmt: skip


if __name__ == "__main__":
    main()
