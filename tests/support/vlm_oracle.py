"""mlx-vlm's own generation at temperature 0: the oracle the engine's image requests are compared
against (docs/vision.md)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any


@cache
def _mlx_vlm(path: str) -> tuple:
    from mlx_vlm import load

    return load(path)


def mlx_vlm_greedy(path: Path, text: str, images: list[Path], max_tokens: int) -> list[int]:
    """mlx-vlm's own ``generate`` at temperature 0: the ids it samples."""
    return list(_generate(path, text, images, max_tokens).token_ids)


def mlx_vlm_generate(path: Path, text: str, images: list[Path], max_tokens: int) -> str:
    """mlx-vlm's own ``generate`` at temperature 0: its text."""
    return str(_generate(path, text, images, max_tokens).text)


def _generate(path: Path, text: str, images: list[Path], max_tokens: int) -> Any:
    from mlx_vlm import generate

    model, processor = _mlx_vlm(str(path))
    return generate(
        model,
        processor,
        _one_bos(processor, text) if images else text,
        image=[str(p) for p in images] or None,
        max_tokens=max_tokens,
        temperature=0.0,
        verbose=False,
    )


def mlx_vlm_text_ids(path: Path, prompt: list[int], max_tokens: int) -> list[int]:
    """mlx-vlm's greedy ids for a text-only prompt of token ids, on the checkpoint at ``path``."""
    model, _ = _mlx_vlm(str(path))
    return [token for token, _ in mlx_vlm_text_greedy(model, prompt, max_tokens)]


def mlx_vlm_text_greedy(
    model: Any, prompt: list[int], max_tokens: int, indexer_keys: str | None = None
) -> list[tuple[int, float]]:
    """mlx-vlm's own ``generate_step`` (its language model, its own cache) at temperature 0 on
    token ids alone: each greedy token with its log-probability. ``indexer_keys`` "fp8": the
    cache's indexer keys rounded through the fp8 format first (``tests/support/fp8_numpy.py``),
    as the engine's fp8 key pages hold them."""
    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.models.cache import make_prompt_cache

    from tests.support.fp8_numpy import round_indexer_keys

    cache = make_prompt_cache(model.language_model)  # the one generate_step makes without it
    if indexer_keys == "fp8":
        round_indexer_keys(model.language_model.layers, cache)
    steps = []
    ids = mx.array([prompt])
    for token, logprobs in generate_step(
        ids, model, None, None, max_tokens=max_tokens, temperature=0.0, prompt_cache=cache
    ):
        steps.append((int(token), float(logprobs.reshape(-1)[int(token)])))
    return steps


def _one_bos(processor: Any, text: str) -> str:
    """``text`` without the BOS its template wrote. mlx-vlm deviates from the reference here:
    it has most processors tokenize the rendered template (which begins with BOS) with the
    tokenizer's special tokens again, two BOS tokens where transformers' processor
    (``apply_chat_template``, tests/vision/test_one_bos.py) and the text path have one. Given
    the text after it, the processor's own BOS is the one."""
    bos = getattr(processor.tokenizer, "bos_token", None)
    return text[len(bos) :] if bos and text.startswith(bos) else text


def assert_matches_mlx_vlm_text(model: Any, prompt: list[int], out: Any) -> None:
    """The engine's output ``out`` for ``prompt``: mlx-vlm's greedy tokens and their
    log-probabilities (``mlx_vlm_text_greedy``)."""
    import pytest

    want = mlx_vlm_text_greedy(model, prompt, len(out.token_ids))
    assert out.token_ids == [token for token, _ in want]
    assert out.logprobs == pytest.approx([lp for _, lp in want], abs=1e-4)


def assert_sparse_not_dense(
    engine: Any, model: Any, params: Any, dense_path: Path, past: int
) -> list[int]:
    """A long prompt (more than ``past`` tokens: its rows read a selection) and a short one
    through ``engine`` (``params``: greedy, with log-probabilities): mlx-vlm's tokens and
    log-probabilities, the long one's first far from
    those of the checkpoint at ``dense_path`` (the same weights attending to every position), so
    an attention that read every token fails, and one that read others than the selection's.
    Returns the long prompt."""
    from mlx_vlm.utils import load_model

    from tests.support.staggered import random_prompts

    long, short = random_prompts([40, 3], seed=4)
    assert len(long) > past
    outs = engine.generate([long, short], params)
    for prompt, out in zip([long, short], outs):
        assert_matches_mlx_vlm_text(model, prompt, out)
    [(_, dense_first)] = mlx_vlm_text_greedy(load_model(dense_path), long, 1)
    assert abs(dense_first - outs[0].logprobs[0]) > 1e-3
    return long


def assert_staggered_matches_mlx_vlm(engine: Any, model: Any, params: Any, label: str) -> None:
    """Nine requests joining ``engine``'s batch at different steps (its config chunks the longer
    prompts), then the two longest again from the prefix cache: every token is mlx-vlm's, and
    the second pass's log-probabilities too."""
    from tests.support.staggered import random_prompts, run_staggered

    prompts = random_prompts([1, 5, 37, 12, 3, 60, 8, 25, 2])
    results = run_staggered(engine, prompts, params)
    for i, prompt in enumerate(prompts):
        want = [token for token, _ in mlx_vlm_text_greedy(model, prompt, params.max_tokens)]
        assert results[i] == want, f"{label}: request {i}"
    again = engine.generate([prompts[2], prompts[5]], params)
    for prompt, out in zip([prompts[2], prompts[5]], again):
        assert out.metrics.cached_tokens > 0
        assert_matches_mlx_vlm_text(model, prompt, out)


def assert_fp8_staggered_matches_mlx_vlm(
    engine: Any, model: Any, params: Any, lengths: list[int], seed: int = 0
) -> None:
    """Random prompts of ``lengths`` (``seed``) joining ``engine``'s batch (fp8 indexer keys) at
    different steps: every token and log-probability is mlx-vlm's with its indexer-key caches
    rounded through the fp8 format (``tests/support/fp8_numpy.py``), and some request's are not
    those of its float keys, so an engine that kept the keys unrounded (or rounded them
    otherwise) fails; the pool ends idle."""
    import pytest

    from tests.support.oracle import assert_pool_idle
    from tests.support.staggered import random_prompts, run_staggered_outputs

    prompts = random_prompts(lengths, seed)
    outs = run_staggered_outputs(engine, prompts, params)
    changed = 0
    for i, prompt in enumerate(prompts):
        want = mlx_vlm_text_greedy(model, prompt, params.max_tokens, "fp8")
        assert outs[i].token_ids == [token for token, _ in want], f"request {i}"
        assert outs[i].logprobs == pytest.approx([lp for _, lp in want], abs=1e-4), f"request {i}"
        exact = mlx_vlm_text_greedy(model, prompt, params.max_tokens)
        changed += [token for token, _ in exact] != outs[i].token_ids or any(
            abs(a - lp) > 1e-3 for a, (_, lp) in zip(outs[i].logprobs, exact)
        )
    assert changed, "fp8 keys answer as float keys: nothing tested"
    assert_pool_idle(engine)


def assert_staggered_text_matches(engine: Any, model: Any, lengths: list[int], params: Any) -> None:
    """Random prompts of ``lengths`` joining ``engine``'s batch at different steps (its config
    chunks the longer ones): every greedy token is mlx-vlm's, and the pool ends idle."""
    from tests.support.oracle import assert_pool_idle
    from tests.support.staggered import random_prompts, run_staggered

    prompts = random_prompts(lengths)
    results = run_staggered(engine, prompts, params)
    for i, prompt in enumerate(prompts):
        want = [token for token, _ in mlx_vlm_text_greedy(model, prompt, params.max_tokens)]
        assert results[i] == want, f"request {i}"
    assert_pool_idle(engine)


def assert_preemption_then_disk_restart(path: Path, model: Any, params: Any, disk: Path) -> None:
    """A pool too small for three requests preempts one (it recomputes: the same tokens); a
    fresh engine over the same disk tier ``disk`` reads a prompt's blocks (K/V or latent, the
    indexer's pages, the recurrent state at their end) back for a longer prompt, and its tokens
    stay mlx-vlm's."""
    from macbatch.engine import Engine, EngineConfig
    from tests.support.staggered import random_prompts

    config: dict[str, Any] = dict(block_size=8, max_num_batched_tokens=64, disk_cache_dir=str(disk))
    engine = Engine.load(str(path), EngineConfig(num_blocks=8, **config))
    prompts = random_prompts([20, 18, 22], seed=3)
    outs = engine.generate(prompts, params)
    assert engine.stats().preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert_matches_mlx_vlm_text(model, prompt, out)
    engine.close()
    restarted = Engine.load(str(path), EngineConfig(num_blocks=32, **config))
    [out] = restarted.generate([prompts[2] + [5, 6, 7]], params)
    assert out.metrics.disk_cached_tokens == 16
    assert_matches_mlx_vlm_text(model, prompts[2] + [5, 6, 7], out)
    restarted.close()
