"""What Gemma 4's image blocks cost (engine/model/image_blocks.py): one step prefilling many
image
prompts, with the dense fix-up of every image block's rows after each layer's paged attention vs
the kernel's causal rows alone (the fix-up switched off: wrong ids, the same work otherwise), in
the same process, prefix cache off so every run prefills everything. ``--model``: a gemma4 VLM
directory with ``use_bidirectional_attention: "vision"``.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.image_blocks --model DIR [--prompts 16] [--runs 5]
"""

from __future__ import annotations

import argparse
import time

import macbatch.engine.model.adapter as adapter
from benchmarks.common import warn_without_openblas
from benchmarks.vision import random_pngs
from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.inputs.prompt import PromptInput
from macbatch.engine.multimodal.images import load_image


def prompts(count: int) -> list[PromptInput]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        images = [load_image(p.read_bytes(), str(p)) for p in random_pngs(count, Path(folder))]
    return [
        PromptInput(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": image},
                        {"type": "text", "text": f"describe picture {i}"},
                    ],
                }
            ]
        )
        for i, image in enumerate(images)
    ]


def best_prefill(engine: Engine, todo: list[PromptInput], runs: int) -> tuple[float, float]:
    """The best wall and CPU seconds of ``runs`` one-token generations of ``todo``."""
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    engine.generate(todo, params)  # warm: every image encoded once
    wall = cpu = float("inf")
    for _ in range(runs):
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        engine.generate(todo, params)
        wall = min(wall, time.perf_counter() - wall_start)
        cpu = min(cpu, time.process_time() - cpu_start)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    warn_without_openblas()
    config = EngineConfig(num_blocks=1024, block_size=16, enable_prefix_caching=False)
    engine = Engine.load(args.model, config)
    todo = prompts(args.prompts)
    on = best_prefill(engine, todo, args.runs)
    real = adapter.attend_blocks
    adapter.attend_blocks = lambda out, *rest: out  # type: ignore[assignment]
    try:
        off = best_prefill(engine, todo, args.runs)
    finally:
        adapter.attend_blocks = real  # type: ignore[assignment]
    print(f"{args.prompts} image prompts, one step, best of {args.runs}:")
    print(f"  with the image-block fix-up  {on[0] * 1e3:7.1f} ms wall {on[1] * 1e3:7.1f} ms CPU")
    print(f"  kernel rows only             {off[0] * 1e3:7.1f} ms wall {off[1] * 1e3:7.1f} ms CPU")
    print(f"  fix-up / kernel only: wall x{on[0] / off[0]:.2f}, CPU x{on[1] / off[1]:.2f}")


if __name__ == "__main__":
    main()
