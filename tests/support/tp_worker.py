"""One rank of a tensor-parallel engine run, started by ``mlx.launch`` (or with MLX_RANK and
MLX_HOSTFILE set by a test). Rank 0 runs a staggered greedy workload that chunks prompts, preempts
and reuses cached prefixes, and writes what it generated; the other ranks follow it.

    python -m tests.support.tp_worker MODEL_DIR OUT.json [SPECULATIVE [DRAFT_MODEL_DIR]]

SPECULATIVE is ``auto`` unless given, as in the front ends: rank 0 drafts with the
checkpoint's MTP heads where it has them, else by prompt lookup; ``off`` does not speculate.
With ``ngram``, ``draft``, ``mtp`` or ``auto`` it speculates (docs/speculative.md): the
verification chunks travel in the broadcast step like any other chunk. Drafting with an MTP
layer, it also writes the target's hidden states that layer was handed (``hidden``: per
request, position -> row), so a test can hold them against the whole model's.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import mlx.core as mx

from macbatch.commands.launch import follower_exit_status
from macbatch.engine import Engine, EngineConfig, RequestOutput, SamplingParams

# A pool of 14 blocks of 8 tokens cannot hold these requests together (preemption); a 24-token
# budget splits the longer prompts across steps; prompts 1, 3 and 5 share a 24-token prefix.
CONFIG = EngineConfig(num_blocks=14, block_size=8, max_num_batched_tokens=24, max_num_seqs=8)
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
# A checkpoint with MTP heads drafts with them (``auto``), and most of the tests' MTP drafts
# hold, so the requests leave sooner: a smaller pool still preempts.
MTP_NUM_BLOCKS = 10


def workload_prompts() -> list[list[int]]:
    shared = [(7 * i + 3) % 300 + 5 for i in range(24)]
    tails = [
        [11, 12, 13, 14, 15, 16],
        [40 + i for i in range(9)],
        [200, 201],
        [90 + i for i in range(12)],
    ]
    return [
        [(13 * i + 1) % 300 + 5 for i in range(30)],
        shared + tails[0],
        [(5 * i + 2) % 300 + 5 for i in range(11)],
        shared + tails[1],
        [(3 * i + 9) % 300 + 5 for i in range(37)],
        shared + tails[2],
    ]


def run_rank_zero(model_dir: str, out: Path, speculative: str = "auto", draft: str = "") -> None:
    declared = json.loads((Path(model_dir) / "config.json").read_text())
    config = dataclasses.replace(
        CONFIG,
        speculative=speculative,
        draft_model=draft or None,
        num_blocks=MTP_NUM_BLOCKS if declared.get("mtp_num_hidden_layers") else CONFIG.num_blocks,
    )
    engine = Engine.load(model_dir, config)
    prompts = workload_prompts()
    results: dict[int, RequestOutput] = {}
    ids: dict[str, int] = {}
    kept = record_hidden(engine, ids) if engine.config.speculative == "mtp" else []
    step = 0
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        while pending and step >= pending[0][0] * 3:
            i, prompt = pending.pop(0)
            ids[engine.add_request(prompt, GREEDY)] = i
        for output in engine.step():
            if output.finished:
                results[ids[output.request_id]] = output
        step += 1
    stats = engine.stats()
    hidden: dict[int, dict[int, list[float]]] = {i: {} for i in range(len(prompts))}
    for request_id, start, rows in kept:
        for offset, values in enumerate(rows.tolist()):
            hidden[ids[request_id]][start + offset] = values
    report = {
        "tokens": [results[i].token_ids for i in range(len(prompts))],
        "logprobs": [results[i].logprobs for i in range(len(prompts))],
        "preemptions": stats.preemptions,
        "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
        "kv_heads_per_rank": [s.num_kv_heads for s in engine.runner.store.shapes],
        "speculative": engine.config.speculative,
        "drafted": stats.speculation.drafted,
        "accepted": stats.speculation.accepted,
        "hidden": hidden,
    }
    out.write_text(json.dumps(report))


def record_hidden(engine: Engine, ids: dict[str, int]) -> list[tuple[str, int, mx.array]]:
    """Have the MTP drafter's ``observe`` also keep the rows of the hidden states it is handed,
    for every chunk without drafts (a verification's rows hold drafts that may be rejected):
    ``(request id, first position, rows)``, read once the run is over (rank 0 evaluated them
    with their step)."""
    assert engine.speculator is not None
    drafter = engine.speculator.drafter
    observe = drafter.observe
    kept: list[tuple[str, int, mx.array]] = []

    def recording(chunks, states, drafting):
        row = 0
        for chunk in chunks:
            if not chunk.num_drafts:
                rows = states[row : row + chunk.num_tokens, 0]
                kept.append((chunk.request.request_id, chunk.start, rows))
            row += chunk.num_tokens
        return observe(chunks, states, drafting)

    drafter.observe = recording
    return kept


def main() -> int:
    status = follower_exit_status()
    if status is not None:
        return status
    run_rank_zero(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:5])
    return 0


if __name__ == "__main__":
    sys.exit(main())
