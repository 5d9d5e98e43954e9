"""LongRoPE chosen per request as transformers' Phi-3 chooses it (model/hooks/long_rope.py), on
Phi-3, PhiMoE and MiniCPM3 (mlx-lm's three ``SuScaledRoPE`` families).

The oracle is mlx-lm's own module of the family, one sequence at a time, its ropes' factors (and
PhiMoE's mscale) set by the reference's rule (transformers' dynamic ``longrope`` update): a
prompt longer than the original positions is rotated long throughout; a shorter one short while
its sequence is within them, and once it passes them the whole sequence is computed anew, long,
in a fresh cache (transformers' ``prepare_inputs_for_generation`` drops the cache there). A
second test holds the engine to transformers' own ``generate`` (Phi-3, PhiMoE) where torch is
installed.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from macbatch.engine import Engine, EngineConfig, SamplingParams
from tests.support.encoder_classifiers import torch_python
from tests.support.oracle import assert_pool_idle
from tests.support.staggered import random_prompts, run_staggered_outputs
from tests.support.tiny import (
    MLA_CONFIGS,
    SPECIAL_TOKENS,
    TINY_COMMON,
    model_of,
    save_model,
    save_tokenizer,
)

ORIGINAL = 32  # original positions: the prompts and decodes below cross it
# below, at and past the original positions; the shorter ones decode past them
LENGTHS = [20, 40, 32, 9, 31, 50]
GREEDY = SamplingParams(max_tokens=28, temperature=0, ignore_eos=True, logprobs=0)
_rng = random.Random(3)


def _factors(rotary: int) -> dict[str, list[float]]:
    """Random distinct short and long factors for ``rotary`` rotated dims."""
    short = [round(_rng.uniform(1.0, 3.0), 3) for _ in range(rotary // 2)]
    return {"short_factor": short, "long_factor": [round(_rng.uniform(3, 12), 3) for _ in short]}


_PHI = dict(
    TINY_COMMON,
    pad_token_id=0,  # transformers' Phi-3 default (32000) is past the tiny vocabulary
    max_position_embeddings=4 * ORIGINAL,
    original_max_position_embeddings=ORIGINAL,
)
PHI3 = dict(
    _PHI,
    model_type="phi3",
    partial_rotary_factor=0.75,  # 12 of each 16-wide head rotated
    rope_scaling={"type": "longrope", **_factors(12)},
)
# PhiMoE: its own mscale for each set (its real checkpoints' two are equal; these differ)
PHIMOE = dict(
    _PHI,
    model_type="phimoe",
    num_local_experts=4,
    num_experts_per_tok=2,  # transformers' sparsemixer takes two
    attention_bias=True,  # mlx-lm's PhiMoE has the biases always
    lm_head_bias=True,
    rope_scaling={
        "type": "longrope",
        **_factors(16),
        "short_mscale": 1.1,
        "long_mscale": 1.3,
        "original_max_position_embeddings": ORIGINAL,
    },
)
# MiniCPM3: an MLA model whose 32 RoPE dims of each head are rotated, its original positions in
# its rope_scaling
MINICPM3 = dict(
    MLA_CONFIGS["minicpm3"],
    max_position_embeddings=4 * ORIGINAL,
    rope_scaling={
        "type": "longrope",
        **_factors(32),
        "original_max_position_embeddings": ORIGINAL,
    },
)
FAMILIES = {"phi3": PHI3, "phimoe": PHIMOE, "minicpm3": MINICPM3}
_EXPERTS = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}  # PhiMoE's names in HF


def _save_phimoe(path: Path) -> Path:
    """The tiny PhiMoE in Hugging Face's layout (one ``experts.E.wN`` per expert, which
    transformers reads and mlx-lm's sanitize stacks)."""
    path.mkdir(parents=True)
    weights = {}
    for name, value in tree_flatten(model_of(PHIMOE).parameters()):
        layer, _, rest = name.partition(".switch_mlp.")
        if rest:
            proj = _EXPERTS[rest.split(".")[0]]
            weights.update(
                {f"{layer}.experts.{e}.{proj}.weight": value[e] for e in range(len(value))}
            )
        else:
            weights[name] = value
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    eos = SPECIAL_TOKENS.index("<|im_end|>")  # as save_model's
    (path / "config.json").write_text(json.dumps(dict(PHIMOE, eos_token_id=eos)))
    save_tokenizer(path)
    return path


def _save(family: str, tmp_path_factory) -> Path:
    """The tiny checkpoint of ``family``, in Hugging Face's layout."""
    root = tmp_path_factory.mktemp(family) / family
    if family == "phimoe":
        return _save_phimoe(root)
    arch = "minicpm3" if family == "minicpm3" else "llama"
    return save_model(root, arch=arch, **FAMILIES[family])


@pytest.fixture(scope="module")
def family_path(request, tmp_path_factory):
    """The family the test is parametrized by (indirectly) and its tiny checkpoint."""
    return request.param, _save(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def phi3_path(tmp_path_factory):
    return _save("phi3", tmp_path_factory)


def set_factors(config: dict, model, long: bool) -> None:
    """Every layer's rope rotated by the long or the short factors of ``config`` (mlx-lm keeps
    the long ones), scaled by that set's mscale where the config names one (PhiMoE's)."""
    scaling = config["rope_scaling"]
    factors = mx.array(scaling["long_factor" if long else "short_factor"], dtype=mx.float32)
    rotary = 2 * factors.size
    base = config["rope_theta"] ** (mx.arange(0, rotary, 2, dtype=mx.float32) / rotary)
    for layer in model.layers:
        layer.self_attn.rope._freqs = factors * base
        if "long_mscale" in scaling:
            layer.self_attn.rope._scale = scaling["long_mscale" if long else "short_mscale"]


set_phi3_factors = functools.partial(set_factors, PHI3)


def reference_greedy(
    model,
    prompt: list[int],
    max_tokens: int,
    set_long=set_phi3_factors,
    new_cache=make_prompt_cache,
) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probabilities of one sequence as transformers' Phi-3 makes
    them: short while the sequence is within the original positions (a longer prompt: long);
    once it passes them, the whole sequence computed anew in a fresh cache, long.
    ``set_long``: rotate ``model`` long or short (mlx-vlm's decides by itself: a no-op)."""
    sequence = list(prompt)
    long = len(prompt) > ORIGINAL
    set_long(model, long)
    cache = new_cache(model)
    fed = sequence
    tokens: list[int] = []
    logprobs: list[float] = []
    while True:
        out = model(mx.array([fed]), cache=cache)
        logits = getattr(out, "logits", out)[0, -1]
        scores = logits - mx.logsumexp(logits)
        tokens.append(int(mx.argmax(scores)))
        logprobs.append(float(scores[tokens[-1]]))
        sequence.append(tokens[-1])
        if len(tokens) == max_tokens:
            return tokens, logprobs
        fed = [tokens[-1]]
        if not long and len(sequence) > ORIGINAL:  # the next position passes them
            long = True
            set_long(model, True)
            cache, fed = new_cache(model), sequence


MODES = {
    "plain": {},
    "compiled": dict(compile_decode_after=1),
    "ngram": dict(speculative="ngram", num_speculative_tokens=3),  # drafts cross it too
}


@pytest.mark.parametrize("family_path", sorted(FAMILIES), indirect=True)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_requests_of_both_kinds_in_one_engine_match_the_reference(family_path, mode):
    """Staggered requests, the longer prompts prefilled in chunks, decoded uncompiled, compiled
    or verifying n-gram drafts: each one's tokens and log-probabilities are the reference's for
    it alone."""
    family, path = family_path
    prompts = random_prompts(LENGTHS, seed=2)
    config = dict(max_num_batched_tokens=24, **MODES[mode])
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, **config))  # type: ignore[arg-type]
    outs = run_staggered_outputs(engine, prompts, GREEDY)
    assert engine.runner.adapter.long_rope_after == ORIGINAL
    if mode == "compiled":
        assert engine.runner.compiled is not None and engine.runner.compiled.compiled_shapes
    model, _ = load(str(path))
    set_long = functools.partial(set_factors, FAMILIES[family])
    for index, prompt in enumerate(prompts):
        tokens, logprobs = reference_greedy(model, prompt, GREEDY.max_tokens or 0, set_long)
        assert outs[index].token_ids == tokens, f"prompt of {len(prompt)} tokens"
        assert outs[index].logprobs == pytest.approx(logprobs, abs=1e-4)
    assert_pool_idle(engine)


def test_a_long_prompt_reads_no_short_prompts_cached_blocks(phi3_path):
    """A short prompt's first block is rotated short, a long prompt's long: the long one
    computes its own, and a second long one reads it."""
    (shared,) = random_prompts([40], seed=11)
    short, long = shared[:24], shared  # the first block (16 tokens) is the same
    engine = Engine.load(str(phi3_path), EngineConfig(num_blocks=64))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    (first,) = engine.generate([short], params)
    (second,) = engine.generate([long], params)
    (again,) = engine.generate([long], params)  # a long prompt's blocks serve a long one
    model, _ = load(str(phi3_path))
    assert first.token_ids == reference_greedy(model, short, 6)[0]
    assert second.token_ids == reference_greedy(model, long, 6)[0]
    assert second.metrics.cached_tokens == 0
    assert again.token_ids == second.token_ids and again.metrics.cached_tokens == 32


def test_phi4mm_requests_of_both_kinds_match_the_reference(tmp_path):
    """Phi-4-multimodal (mlx-vlm's LongRoPE, which takes the furthest position of its call,
    the reference's rule for one call): mlx-vlm's own language model one sequence at a time,
    computed anew once it passes the original positions, as transformers' Phi-4-multimodal
    does; in one packed engine each request is rotated by its own."""
    pytest.importorskip("mlx_vlm")
    from mlx_vlm.models.cache import make_prompt_cache as vlm_cache
    from mlx_vlm.utils import load_model

    from tests.support.tiny_vlm_text import save_vlm_text_model

    path = save_vlm_text_model(
        tmp_path, "phi4mm", top={"original_max_position_embeddings": ORIGINAL}
    )
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, max_num_batched_tokens=24))
    prompts = random_prompts(LENGTHS, seed=4)
    outs = run_staggered_outputs(engine, prompts, GREEDY)
    assert engine.runner.adapter.long_rope_after == ORIGINAL
    text = load_model(path).language_model
    for index, prompt in enumerate(prompts):
        want = reference_greedy(text, prompt, GREEDY.max_tokens or 0, lambda *_: None, vlm_cache)
        assert outs[index].token_ids == want[0], f"prompt of {len(prompt)} tokens"
        assert outs[index].logprobs == pytest.approx(want[1], abs=1e-4)


# transformers' runs: a family, its prompts' lengths, the greedy decode, and whether PhiMoE's
# rotary is handed the sequence's length (transformers_greedy.py, ``rope_by_length``): as
# transformers 5.24 is, PhiMoE is checked only within the original positions
WITHIN = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0)
TRANSFORMERS_RUNS = [
    ("phi3", LENGTHS, GREEDY, False),
    ("phimoe", LENGTHS, GREEDY, True),
    ("phimoe", [9, 20, 16, 24], WITHIN, False),  # each sequence ends within the 32
]


@pytest.mark.skipif(torch_python() is None, reason="no Python with torch")
@pytest.mark.parametrize(
    "family_path, lengths, params, by_length",
    TRANSFORMERS_RUNS,
    indirect=["family_path"],
    ids=["phi3", "phimoe", "phimoe-within"],
)
def test_staggered_requests_match_transformers(family_path, lengths, params, by_length, tmp_path):
    """transformers' own model of the family (its dynamic ``longrope`` update and its cache
    computed anew at the crossing), each prompt generated alone on the same checkpoint: the
    engine's staggered batch gives its tokens and, to the two libraries' float32 sums, its
    log-probabilities."""
    _, path = family_path
    prompts = random_prompts(lengths, seed=5)
    engine = Engine.load(str(path), EngineConfig(num_blocks=64, max_num_batched_tokens=24))
    outs = run_staggered_outputs(engine, prompts, params)
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {"prompts": prompts, "max_tokens": params.max_tokens, "rope_by_length": by_length}
        )
    )
    script = Path(__file__).parents[2] / "support" / "transformers_greedy.py"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONPATH")}
    python = torch_python()
    assert python is not None
    command = [python, str(script), str(path), str(job), str(tmp_path / "out.json")]
    subprocess.run(command, check=True, env=env, timeout=600, capture_output=True)
    want = json.loads((tmp_path / "out.json").read_text())
    for index, (tokens, logprobs) in enumerate(want):
        assert outs[index].token_ids == tokens, f"prompt of {lengths[index]} tokens"
        assert outs[index].logprobs == pytest.approx(logprobs, abs=1e-3)


def test_a_long_prompt_reads_no_short_prompts_blocks_from_disk(phi3_path, tmp_path):
    """The disk tier looks a waiting request's blocks up when it is queued: a long prompt's
    chain is its long scope's by then, so a restarted engine reads none of a short prompt's
    blocks for it."""
    (shared,) = random_prompts([40], seed=11)
    config = EngineConfig(num_blocks=64, block_size=8, disk_cache_dir=str(tmp_path / "disk"))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    warm = Engine.load(str(phi3_path), config)
    warm.generate([shared[:24]], params)
    warm.close()
    engine = Engine.load(str(phi3_path), config)
    (out,) = engine.generate([shared], params)
    engine.close()
    model, _ = load(str(phi3_path))
    assert out.metrics.disk_cached_tokens == 0
    assert out.token_ids == reference_greedy(model, shared, 6)[0]
