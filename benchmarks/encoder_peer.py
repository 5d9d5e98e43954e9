"""One peer embedding library over a saved encoder checkpoint, run by
``benchmarks/encoder_embeddings.py`` as a subprocess in the peer's own virtual environment
(mlx-embeddings is GPL and never a dependency of macbatch; sentence-transformers pulls torch):
it embeds the texts with the library's own public path, as its README shows, and prints one
JSON line with its wall and CPU seconds; the vectors go to a .npy the caller compares with its
own. Imports nothing of macbatch (it runs where macbatch is not installed).

    /work/venvs/st/bin/python benchmarks/encoder_peer.py sentence-transformers MODEL TEXTS OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

NOT_INSTALLED = 3  # the exit status that says the library is missing from this interpreter

Embedder = Callable[[list[str]], np.ndarray]


def sentence_transformers(model_dir: str, batch: int) -> Embedder:
    """``SentenceTransformer.encode`` on the CPU: its modules (CLS pooling, Normalize) and its
    own batching (sorted by length, each batch padded to its longest)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")

    def embed(texts: list[str]) -> np.ndarray:
        return model.encode(texts, batch_size=batch, convert_to_numpy=True)

    return embed


def mlx_embeddings(model_dir: str, batch: int) -> Embedder:
    """mlx-embeddings' ``load`` and forward, batches in the order given, each padded to its
    longest, as its README batches texts. Its ``text_embeds`` mean-pools BERT and XLM-R, so
    the CLS row of ``last_hidden_state`` is taken and normalized (the README's ``raw_embeds``),
    as the checkpoint's Pooling module says."""
    import mlx.core as mx
    from mlx_embeddings.utils import load

    model, tokenizer = load(model_dir)
    limit = json.loads(Path(model_dir, "sentence_bert_config.json").read_text())["max_seq_length"]

    def embed(texts: list[str]) -> np.ndarray:
        out = []
        for start in range(0, len(texts), batch):
            inputs = tokenizer(
                texts[start : start + batch],
                return_tensors="mlx",
                padding=True,
                truncation=True,
                max_length=limit,
            )
            outputs = model(inputs["input_ids"], attention_mask=inputs["attention_mask"])
            cls = outputs.last_hidden_state[:, 0, :]
            vectors = cls / mx.linalg.norm(cls, axis=-1, keepdims=True)
            mx.eval(vectors)
            out.append(np.array(vectors.astype(mx.float32)))
        return np.concatenate(out)

    return embed


PEERS: dict[str, Callable[[str, int], Embedder]] = {
    "sentence-transformers": sentence_transformers,
    "mlx-embeddings": mlx_embeddings,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("model", help="the checkpoint directory (Hugging Face layout)")
    parser.add_argument("texts", help="a JSON list of texts")
    parser.add_argument("out", help="where the vectors go (.npy)")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    try:
        embed = PEERS[args.peer](args.model, args.batch)
    except ImportError as error:
        print(json.dumps({"error": f"not installed ({error})"}))
        sys.exit(NOT_INSTALLED)
    texts = json.loads(Path(args.texts).read_text())
    embed(texts[:4])  # warm up, as the caller warms its own side
    wall, cpu = time.perf_counter(), time.process_time()
    vectors = embed(texts)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    np.save(args.out, vectors.astype(np.float32))
    print(json.dumps({"wall": wall, "cpu": cpu, "rows": len(vectors)}))


if __name__ == "__main__":
    main()
