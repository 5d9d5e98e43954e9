"""The disk tier (issue 45), agent sessions taking turns: ``--sessions`` sessions of
``--session-tokens`` each answer one turn in order, then each sends its next turn (its prompt, its
reply and ``--turn-tokens`` new tokens), with a RAM pool that holds ``--ram-sessions`` of them.
RAM alone has lost a session's blocks by its next turn (the ones after it evicted them, least
recently used first), so it prefills its whole prompt again; the disk tier reads them back. The
median time to first token of the second turns, with the disk tier and without, in one process:
the two engines take the sessions' second turns in turn, so both see the same load.

Without the tier, the first round runs only its last ``--ram-sessions`` sessions: a pool that
holds that many holds exactly those at the end of a whole round, so the second round starts
from the same state, at a quarter of the cost. Random-weight model of a real shape (``--shape``,
``--layers`` fewer to fit a small machine), float32 on the CPU.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m benchmarks.disk_sessions [--sessions 16] [--session-tokens 8192] \\
            [--ram-sessions 4] [--shape qwen3] [--layers 28]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from benchmarks.common import SHAPES, shaped_model, warn_without_openblas
from macbatch.commands.workload import synthetic_prompts
from macbatch.engine import Engine, EngineConfig, SamplingParams

REPLY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
BLOCK = 16
TIER, RAM = "with the disk tier", "RAM alone"


def first_turns(engine: Engine, firsts: list[list[int]], start: int) -> list[list[int]]:
    """Sessions ``start`` on answer their first turn; their replies."""
    return [engine.generate([prompt], REPLY)[0].token_ids for prompt in firsts[start:]]


def second_turn(engine: Engine, prompt: list[int], reply: list[int], turn: list[int]) -> float:
    """A session sends its second turn; its time to first token."""
    out = engine.generate([prompt + reply + turn], REPLY)[0]
    return out.metrics.time_to_first_token_s or 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--session-tokens", type=int, default=8192)
    parser.add_argument("--turn-tokens", type=int, default=64)
    parser.add_argument("--ram-sessions", type=int, default=4)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3")
    parser.add_argument("--layers", type=int, default=None, help="default: the shape's own")
    args = parser.parse_args()
    warn_without_openblas()
    length = args.session_tokens + REPLY.max_tokens + args.turn_tokens
    model, tokenizer, vocab = shaped_model(args.shape, args.layers, length + BLOCK)
    firsts = synthetic_prompts(args.sessions, args.session_tokens, args.session_tokens, vocab)
    turns = synthetic_prompts(args.sessions, args.turn_tokens, args.turn_tokens, vocab, seed=1)
    num_blocks = args.ram_sessions * (-(-length // BLOCK) + 1)
    print(
        f"--shape {args.shape}, {len(model.layers)} layers, float32; {args.sessions} sessions of "
        f"{args.session_tokens:,} tokens, a pool of {num_blocks:,} blocks ({args.ram_sessions} "
        f"sessions)"
    )
    ttfts: dict[str, list[float]] = {TIER: [], RAM: []}
    with tempfile.TemporaryDirectory() as cache:
        engines = {
            name: Engine(
                model, tokenizer, EngineConfig(num_blocks=num_blocks, disk_cache_dir=directory)
            )
            for name, directory in ((TIER, cache), (RAM, None))
        }
        if engines[TIER].kv.disk is None:
            print(f"--shape {args.shape}: not supported yet (the disk tier keeps none of this "
                  "model's caches)")  # fmt: skip
            return
        replies = first_turns(engines[TIER], firsts, 0)
        start = args.sessions - args.ram_sessions  # greedy: the same replies
        assert first_turns(engines[RAM], firsts, start) == replies[start:]
        for session in zip(firsts, replies, turns, strict=True):  # in turn: the same load
            for name, engine in engines.items():
                ttfts[name].append(second_turn(engine, *session))
        results = {}
        for name, engine in engines.items():
            results[name] = statistics.median(ttfts[name])
            stats = engine.stats()
            read = (
                f", {stats.disk.bytes_read / 2**20:,.0f} MiB read from disk" if stats.disk else ""
            )
            print(
                f"{name}: second turns' median time to first token {results[name]:.2f} s "
                f"(min {min(ttfts[name]):.2f}, max {max(ttfts[name]):.2f}); prefix cache hit "
                f"rate {stats.prefix_cache_hit_rate:.0%}{read}"
            )
            engine.close()
    ratio = results[RAM] / results[TIER]
    print(f"the disk tier: {ratio:.1f}x lower median time to first token (target 5x)")


if __name__ == "__main__":
    main()
