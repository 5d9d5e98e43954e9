"""Run by a Python that has torch and transformers (``test_long_rope.py`` starts it; the test
environment has neither): transformers' own ``AutoModelForCausalLM`` on a saved checkpoint,
float32, greedy ``generate`` of each prompt alone (its cache, its dynamic RoPE update), each
token with its log-probability: the reference a model's rotation is held to. Imports nothing of
macbatch or the tests.

    python transformers_greedy.py CHECKPOINT JOB.json OUT.json

JOB.json: ``{"prompts": [[ids...], ...], "max_tokens": N, "rope_by_length": false}``;
OUT.json: one ``[tokens, logprobs]`` per prompt. ``rope_by_length``: hand PhiMoE's rotary
initializer the sequence's length (``rope_by_length`` below).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def greedy(model: torch.nn.Module, prompt: list[int], max_tokens: int) -> list[list]:
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [
        float(torch.log_softmax(step[0].double(), -1)[token])
        for step, token in zip(out.logits, tokens)
    ]
    return [tokens, logprobs]


def rope_by_length(model: torch.nn.Module) -> None:
    """transformers 5.24's ``PhimoeRotaryEmbedding.forward`` calls its ``rope_init_fn`` with no
    sequence length, so it rotates by the short factors past the original positions too (only
    its mscale switches); its earlier releases handed it ``max(position_ids) + 1``, which picks
    the long factors there, as Phi-3 does. This hands it that length again."""
    rotary = model.model.rotary_emb
    init, forward = rotary.rope_init_fn, rotary.forward
    length = [0]

    def forward_by_length(x: torch.Tensor, position_ids: torch.Tensor) -> tuple:
        length[0] = int(position_ids.max()) + 1
        return forward(x, position_ids)

    rotary.rope_init_fn = lambda config, *_: init(config, None, length[0])
    rotary.forward = forward_by_length


def main() -> None:
    checkpoint, job_path, out_path = sys.argv[1:4]
    job = json.loads(Path(job_path).read_text())
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    if job.get("rope_by_length"):
        rope_by_length(model)
    with torch.no_grad():
        results = [greedy(model, prompt, job["max_tokens"]) for prompt in job["prompts"]]
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
