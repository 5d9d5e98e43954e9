"""The families whose text model only mlx-vlm has, served as text models through the same packed
paged step: greedy tokens (and their log-probabilities) equal mlx-vlm's own generation on its own
language model and cache, with requests joining a running batch, chunked prefill, preemption
and a second pass through the prefix cache; every mlx-vlm model type mlx-lm cannot load is in
the families table, served or refused at load with its reason (docs/models.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.kv.latent import LatentGroup
from macbatch.engine.kv.window import SlidingWindowGroup
from macbatch.engine.model.adapter import UnsupportedModelError
from macbatch.engine.model.families import FAMILIES, Library, family
from tests.support.oracle import assert_pool_idle
from tests.support.staggered import STAGGERED, random_prompts
from tests.support.tiny_vlm_text import CONFIGS, save_vlm_text_model
from tests.support.vlm_architectures import BUILT_IN_MEMORY, OVERRIDES
from tests.support.vlm_oracle import (
    assert_matches_mlx_vlm_text,
    assert_staggered_matches_mlx_vlm,
)

pytest.importorskip("mlx_vlm")

# a pool whose eighth (the recurrent state checkpoints' share) keeps a hybrid's checkpoints of
# the two longest prompts past the nine requests (96 blocks keep 8, which they evict)
STAGGERED_WITH_CHECKPOINTS = dict(STAGGERED, num_blocks=400)
# families whose layers another family here runs through the workloads: loaded (and self-checked
# against mlx-vlm's own forward: a prompt, decode steps, log-probabilities) by the cheap test
SAME_CODE = {
    "decider2": "its language model is qwen3_5_text's (its Model subclasses it)",
    "qwen3_5_text": "its Gated DeltaNet and attention layers are qwen3_5_moe_text's (their MLPs "
    "differ)",
}
# served mlx-vlm families checked against mlx-vlm's own generation by a test module of their own
# (their tiny checkpoints need weights or layouts of their own) -> that module
OWN_TESTS = {
    "deepseek_v4": "tests/engine/model/test_deepseek_v4.py",
    "glm5_next": "tests/engine/model/test_glm5_next.py",
    "hy_v4": "tests/engine/model/test_hy_v4.py",
    "qwen4_exp": "tests/engine/model/test_qwen4_exp.py",
}
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=0)


@pytest.fixture(scope="module", params=list(CONFIGS))
def saved(request, tmp_path_factory) -> tuple[str, Path, object]:
    """(family, its tiny checkpoint, mlx-vlm's own model of it)."""
    from mlx_vlm.utils import load_model

    path = save_vlm_text_model(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, path, load_model(path)


def test_staggered_batch_with_chunked_prefill_and_prefix_hits(saved) -> None:
    """Nine requests join at different steps; a 24-token budget chunks the longer prompts; the
    two longest asked again read their prefixes from the prefix cache, and every token and its
    log-probability is mlx-vlm's."""
    name, path, oracle = saved
    if name in SAME_CODE:
        pytest.skip(SAME_CODE[name])
    engine = Engine.load(str(path), EngineConfig(**STAGGERED_WITH_CHECKPOINTS))
    assert_staggered_matches_mlx_vlm(engine, oracle, GREEDY, name)
    assert_pool_idle(engine)


def test_preemption_recomputes_identically(saved) -> None:
    """A pool too small for five requests preempts and recomputes; every token and its
    log-probability is still mlx-vlm's."""
    name, path, oracle = saved
    if name in SAME_CODE:
        pytest.skip(SAME_CODE[name])
    config = EngineConfig(num_blocks=12, block_size=8, max_num_batched_tokens=64)
    engine = Engine.load(str(path), config)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=0)
    prompts = random_prompts([20, 18, 22, 15, 19], seed=3)
    outs = engine.generate(prompts, params)
    assert engine.stats().preemptions > 0
    for prompt, out in zip(prompts, outs):
        assert_matches_mlx_vlm_text(oracle, prompt, out)
    assert_pool_idle(engine)


def test_each_family_pages_its_own_attention_kind(saved) -> None:
    """The table says mlx-vlm's code; MLA layers (Mistral Large 3's) are in latent pages,
    sliding-window layers in a window group; a VLM's images are refused with the table's
    reason (one whose images are served: unless its processor reads this checkpoint)."""
    name, path, _ = saved
    assert family(name).library is Library.MLX_VLM
    text = CONFIGS[name].get("text_config", CONFIGS[name])
    engine = Engine.load(str(path), EngineConfig(num_blocks=32))
    assert isinstance(engine.kv.full, LatentGroup) == ("kv_lora_rank" in text)
    assert (engine.kv.group(SlidingWindowGroup) is not None) == ("sliding_window" in text)
    vision = engine.runner.vision
    if family(name).vision is not None and vision.encoder is not None:
        return  # its images are served, and its processor needs no files this checkpoint lacks
    assert vision.encoder is None
    assert vision.refusal is not None
    if "vision_config" in CONFIGS[name]:  # a VLM served as text: images refused with the reason
        # (the table's, or for a family whose images are served: its processor files missing)
        assert (family(name).vision_refusal or "cannot be read") in vision.refusal


def test_sparse_minimax_layers_are_refused_at_load(tmp_path) -> None:
    """A MiniMax M3 checkpoint with sparse (indexed) layers, as its real ones have, is refused
    at load naming the cache kind, not served densely (its top-k selection is the sparse
    attention issue's)."""
    sparse = {"use_sparse_attention": True, "sparse_attention_freq": [0, 0, 1]}
    path = save_vlm_text_model(tmp_path, "minimax_m3", sparse_attention_config=sparse)
    with pytest.raises(UnsupportedModelError, match="MiniMaxM3KVCache"):
        Engine.load(str(path), EngineConfig(num_blocks=32))


def _vlm_only_model_types() -> set[str]:
    """mlx-vlm's model packages that no model type mlx-lm loads reaches (mlx-vlm's name, or one
    it remaps to it, e.g. ``nemotron-nas``, resolved through mlx-lm's own remapping)."""
    import mlx_vlm.models
    from mlx_lm.utils import MODEL_REMAPPING as LM_REMAPPING
    from mlx_vlm.utils import MODEL_REMAPPING as VLM_REMAPPING

    root = Path(mlx_vlm.models.__file__).parent
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}

    def in_mlx_lm(model_type: str) -> bool:
        name = LM_REMAPPING.get(model_type, model_type)
        return "." not in name and importlib.util.find_spec(f"mlx_lm.models.{name}") is not None

    def names(package: str) -> set[str]:
        return {package} | {alias for alias, to in VLM_REMAPPING.items() if to == package}

    return {p for p in packages if not any(in_mlx_lm(name) for name in names(p))}


def test_every_model_type_only_mlx_vlm_has_is_in_the_table() -> None:
    """An upgrade of mlx-vlm that brings a model package mlx-lm cannot load fails here until
    the table serves or refuses it; the table names no mlx-vlm family that is gone."""
    only = _vlm_only_model_types()
    assert only, "mlx-vlm has no model type mlx-lm lacks: the comparison is broken"
    missing = sorted(only - set(FAMILIES))
    assert not missing, f"mlx-vlm model types in no families entry: {missing}"
    for name in only:  # an encoder (BERT) runs macbatch's own code (engine/encoder/)
        if FAMILIES[name].encoder is None:
            assert FAMILIES[name].library is Library.MLX_VLM, name
    vlm_families = {n for n, f in FAMILIES.items() if f.library is Library.MLX_VLM}
    assert vlm_families <= only, f"not in mlx-vlm alone: {sorted(vlm_families - only)}"


def test_every_served_mlx_vlm_family_is_checked_here() -> None:
    """A family whose text model is mlx-vlm's and that the table serves (no refusal) has a tiny
    model in the parity tests: this module's ``CONFIGS``, test_vlm_language_models.py's derived
    ``OVERRIDES`` (saved, or ``BUILT_IN_MEMORY``), or a test module of its own that names it;
    serving a family unchecked, or dropping its tiny model, fails here."""
    served = {n for n, f in FAMILIES.items() if f.library is Library.MLX_VLM and f.refusal is None}
    derived = {n for n in OVERRIDES if FAMILIES[n].refusal is None} | set(BUILT_IN_MEMORY)
    unchecked = sorted(served - set(CONFIGS) - derived - set(OWN_TESTS))
    assert not unchecked, f"served mlx-vlm families no parity test runs: {unchecked}"
    root = Path(__file__).parents[3]
    for name, module in OWN_TESTS.items():
        assert name in served, f"{name} is not a served mlx-vlm family"
        assert f'"{name}"' in (root / module).read_text(), f"{module} does not build {name}"


@pytest.mark.parametrize("model_type", ["flux2", "longcat_flash_sparse", "limite", "z1t"])
def test_refused_families_are_refused_before_loading(tmp_path, model_type) -> None:
    """A refused mlx-vlm family (an image generator, a sparse-attention model, a VLM whose
    attention builds its window mask from its cache's offset as one number) fails at load with
    its reason, weights unread."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    reason = FAMILIES[model_type].refusal
    assert reason
    with pytest.raises(UnsupportedModelError, match="is not supported") as caught:
        Engine.load(str(tmp_path), EngineConfig(num_blocks=32))
    assert reason in str(caught.value)
