"""Images through a vision model: images per second of a captioning batch through macbatch (one
packed step for every request) vs mlx-vlm's own ``generate`` on the same model, images and
prompts, and time to first token of a chat's second turn about one image vs its first (the
second hits the encode cache and the prefix cache). ``--model``: a mistral3 VLM directory.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.vision --model DIR [--images 32] [--tokens 16]
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import warn_without_openblas
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.inputs.prompt import PromptInput
from macbatch.engine.multimodal.images import load_image

QUESTION = "Describe this picture."


def random_pngs(count: int, folder: Path) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="PNG")
        paths.append(folder / f"{i}.png")
        paths[-1].write_bytes(out.getvalue())
    return paths


def chat(paths: list[Path], texts: list[str]) -> PromptInput:
    """A conversation: user turn i shows image i (if any) and asks texts[i]."""
    messages = []
    for i, text in enumerate(texts):
        if i:
            messages.append({"role": "assistant", "content": "ok"})
        parts = [
            {"type": "image", "image": load_image(p.read_bytes(), str(p))} for p in paths[i : i + 1]
        ]
        messages.append({"role": "user", "content": [*parts, {"type": "text", "text": text}]})
    return PromptInput(messages)


def macbatch_images_per_s(model: str, paths: list[Path], tokens: int) -> float:
    engine = Engine.load(model, EngineConfig(max_num_seqs=len(paths)))
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    engine.generate([chat(paths[:1], [QUESTION])], params)  # warm up
    started = time.perf_counter()
    engine.generate([chat([p], [QUESTION]) for p in paths[1:]], params)
    return (len(paths) - 1) / (time.perf_counter() - started)


PEER_PROMPT = f"<s>[INST][IMG]{QUESTION}[/INST]"


def mlx_vlm_images_per_s(model: str, paths: list[Path], tokens: int) -> tuple[float, list[str]]:
    """mlx-vlm's ``generate``, one image after another, and its replies. Its ``batch_generate``
    is not the peer: in mlx-vlm 0.7.10 on mistral3 a batch of one image raises "Number of image
    token positions (13) does not match number of image features (12)", and a batch of several
    runs but answers differently from ``generate`` (greedy; see ``batch_generate_check``)."""
    from mlx_vlm import generate, load

    vlm, processor = load(model)
    generate(vlm, processor, PEER_PROMPT, image=[str(paths[0])], max_tokens=tokens, temperature=0)
    started = time.perf_counter()
    texts = [
        generate(vlm, processor, PEER_PROMPT, image=[str(p)], max_tokens=tokens, temperature=0).text
        for p in paths[1:]
    ]
    return (len(paths) - 1) / (time.perf_counter() - started), texts


def batch_generate_check(model: str, paths: list[Path], tokens: int, texts: list[str]) -> str:
    """mlx-vlm's ``batch_generate`` over the same images: its speed, and how many of its
    replies equal ``generate``'s (a peer must agree before its speed means anything)."""
    from mlx_vlm import batch_generate, load

    vlm, processor = load(model)
    started = time.perf_counter()
    try:
        out = batch_generate(
            vlm, processor, images=[str(p) for p in paths[1:]],
            prompts=[PEER_PROMPT] * (len(paths) - 1), max_tokens=tokens,
        )  # fmt: skip
    except ValueError as error:
        return f"raised {error}"
    rate = (len(paths) - 1) / (time.perf_counter() - started)
    same = sum(a == b for a, b in zip(out.texts, texts))
    return f"{rate:.1f} images/s, but {same} of {len(texts)} replies equal generate's"


def second_turn_ttft(model: str, path: Path) -> tuple[float, float]:
    engine = Engine.load(model, EngineConfig())
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    [first] = engine.generate([chat([path], [QUESTION])], params)
    [second] = engine.generate([chat([path], [QUESTION, "And the colours?"])], params)
    assert first.metrics.time_to_first_token_s and second.metrics.time_to_first_token_s
    return first.metrics.time_to_first_token_s, second.metrics.time_to_first_token_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    warn_without_openblas()
    with tempfile.TemporaryDirectory() as folder:
        paths = random_pngs(args.images + 1, Path(folder))
        ours = macbatch_images_per_s(args.model, paths, args.tokens)
        peer, texts = mlx_vlm_images_per_s(args.model, paths, args.tokens)
        print(f"captioning {args.images} images, {args.tokens} tokens each:")
        print(
            f"  macbatch {ours:.1f} images/s, mlx-vlm generate (one at a time) "
            f"{peer:.1f} images/s: {ours / peer:.2f}x"
        )
        check = batch_generate_check(args.model, paths, args.tokens, texts)
        print(f"  mlx-vlm batch_generate (not the peer): {check}")
        first, second = second_turn_ttft(args.model, paths[0])
        print(
            f"chat about one image: time to first token turn 1 {first * 1e3:.0f} ms, "
            f"turn 2 {second * 1e3:.0f} ms ({first / second:.2f}x faster: the image is neither "
            "encoded nor prefilled again)"
        )


if __name__ == "__main__":
    main()
