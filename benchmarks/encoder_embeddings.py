"""Encoder embedding throughput: macbatch's packed encoder (no padding in the linear layers,
attention per group of similar lengths) against the peers on the same machine in the same run:
mlx-embeddings and sentence-transformers (torch, CPU), each in its own virtual environment as a
subprocess (``benchmarks/encoder_peer.py``), and our own padded batches of the same model
(batches in arrival order, each padded to its longest input, a key mask). Texts of long-tailed
token lengths from 16 to 2,048 (spans of docs/*.md), tokenized by every side with the same
real tokenizer. A random float32 checkpoint saved in the Hugging Face layout
(``benchmarks/encoder_checkpoint.py``): ``--shape bert`` BERT-base (hidden 768, 12 heads, FFN
3,072), ``--shape m3`` BGE-M3's XLM-R (hidden 1,024, 16 heads, FFN 4,096, 250,002 entries,
8,194 positions), cut to ``--layers``; CLS pooling, normalized; every side's vectors are
checked against ours (cosine >= 0.9999). A peer whose venv or package is missing is reported
as not installed. ``--engine`` also runs the corpus as requests through the encoder engine
(what serve and run drive: passes of ``--budget`` rows picked by length from the waiting
window).

    python3 -m venv /work/venvs/mlxemb && /work/venvs/mlxemb/bin/pip install \\
        mlx-embeddings mlx-cpu==0.32.4
    python3 -m venv /work/venvs/st && /work/venvs/st/bin/pip install torch==2.13.0 \\
        sentence-transformers
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.encoder_embeddings [--shape bert|m3] [--docs 64] [--layers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from benchmarks.common import warn_without_openblas
from benchmarks.embeddings import (
    corpus_arguments,
    describe_corpus,
    long_tailed_lengths,
    padded_batches,
)
from benchmarks.encoder_checkpoint import SHAPES, texts_of_lengths, write_checkpoint
from macbatch.commands.workload import Clock
from macbatch.engine import EngineConfig, PoolingParams
from macbatch.engine.encoder.engine import EncoderEngine
from macbatch.engine.encoder.model import EncoderModel
from macbatch.engine.encoder.varlen import Group, VarlenLayout

PEER_SCRIPT = Path(__file__).with_name("encoder_peer.py")
PEER_VENVS = {"mlx-embeddings": "/work/venvs/mlxemb", "sentence-transformers": "/work/venvs/st"}
NOT_INSTALLED = 3  # encoder_peer.py's exit status for a missing library
AGREE = 0.9999  # the lowest cosine a side's vectors may have against ours


@dataclass(frozen=True)
class Side:
    """One side's measurement: wall and CPU seconds, its lowest cosine against ours; or why it
    did not run."""

    name: str
    wall: float = 0.0
    cpu: float = 0.0
    cosine: float = 1.0
    missing: str | None = None


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


def padded_embed(model: nn.Module, docs: list[list[int]], batch: int) -> np.ndarray:
    vectors = []
    for group, ids in padded_batches(docs, batch):
        width = ids.shape[1]
        positions = np.tile(np.arange(width, dtype=np.int32), len(group))
        positions += model.config.position_offset
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


def run_peer(peer: str, venv: str, model: Path, texts: Path, batch: int, ours: np.ndarray) -> Side:
    """``peer`` embedding the texts in its own venv's interpreter; its vectors against ours."""
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        return Side(peer, missing=f"not installed (no {python})")
    out = texts.with_name(f"{peer}.npy")
    done = subprocess.run(
        [str(python), str(PEER_SCRIPT), peer, str(model), str(texts), str(out), f"--batch={batch}"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""),
    )  # fmt: skip
    if done.returncode == NOT_INSTALLED:
        return Side(peer, missing="not installed")
    if done.returncode != 0:
        raise RuntimeError(f"{peer} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    vectors = np.load(out)
    cosine = float((vectors * ours).sum(-1).min())
    return Side(peer, result["wall"], result["cpu"], cosine)


def print_table(tokens: int, sides: list[Side]) -> None:
    """tok/s (wall and this side's CPU time), ours over each side, the lowest cosine."""
    ours = sides[0]
    print(f"{'side':<24}{'tok/s wall':>11}{'tok/s CPU':>11}{'ours/side wall':>16}"
          f"{'ours/side CPU':>15}{'lowest cos':>12}")  # fmt: skip
    for side in sides:
        if side.missing:
            print(f"{side.name:<24}{side.missing}")
            continue
        speeds = f"{tokens / side.wall:>11,.0f}{tokens / side.cpu:>11,.0f}"
        ratios = f"{side.wall / ours.wall:>15.2f}x{side.cpu / ours.cpu:>14.2f}x"
        print(f"{side.name:<24}{speeds}{ratios}{side.cosine:>12.6f}")
    wrong = [s.name for s in sides if not s.missing and s.cosine < AGREE]
    if wrong:
        raise SystemExit(f"vectors disagree with ours (cosine < {AGREE}): {', '.join(wrong)}")


def measure_ours(
    encoder: EncoderModel, texts: list[str], docs: list[list[int]], args: argparse.Namespace
) -> tuple[list[Side], np.ndarray]:
    """The packed encoder from texts (tokenizing included, as the peers' time includes
    theirs), our padded batches from the same ids, and with ``--engine`` the encoder engine."""
    encoder.embed([encoder.tokenize(t) for t in texts[:4]])  # warm up
    padded_embed(encoder.model, docs[:4], 4)
    clock = Clock()
    packed = encoder.embed([encoder.tokenize(t) for t in texts], max_batch_tokens=args.budget)
    sides = [Side("macbatch packed", *clock.read())]
    if args.engine:
        clock = Clock()
        served = engine_embed(encoder, docs, args.budget)
        wall, cpu = clock.read()
        sides.append(
            Side("macbatch encoder engine", wall, cpu, float((served * packed).sum(-1).min()))
        )
    clock = Clock()
    plain = padded_embed(encoder.model, docs, args.batch)
    wall, cpu = clock.read()
    sides.append(Side("macbatch padded batches", wall, cpu, float((plain * packed).sum(-1).min())))
    return sides, packed


def main() -> None:
    parser = corpus_arguments(__doc__.splitlines()[0], 64, 128, 2048, 8192)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="bert")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--engine", action="store_true", help="also through the encoder engine")
    parser.add_argument("--no-peers", action="store_true", help="only our own sides")
    args = parser.parse_args()
    warn_without_openblas()
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="macbatch-encoder-bench-") as scratch:
        model_dir = write_checkpoint(Path(scratch) / args.shape, args.shape, args.layers)
        lengths = [max(16, n) for n in long_tailed_lengths(args.docs, args.median, args.longest)]
        texts = texts_of_lengths(model_dir, lengths)
        texts_file = Path(scratch) / "texts.json"
        texts_file.write_text(json.dumps(texts))
        encoder = EncoderModel.load(str(model_dir))
        docs = [list(encoder.tokenize(t).ids) for t in texts]
        tokens = describe_corpus([len(d) for d in docs], args.batch)
        sides, ours = measure_ours(encoder, texts, docs, args)
        del encoder  # the peers get the memory
        for peer, venv in {} if args.no_peers else PEER_VENVS.items():
            sides.append(run_peer(peer, venv, model_dir, texts_file, args.batch, ours))
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min)")
    print_table(tokens, sides)


if __name__ == "__main__":
    main()
