"""DFlash drafting: a block-diffusion drafter proposes a block per request in one packed forward
from the target's layer features, its context K/V in the request's blocks (DFlash2 checkpoints
too: convolutions along the block, a candidate selector; and DSpark's: a Markov head, the known
token's row drafting). Oracles: mlx-lm's greedy generation of the target (the output never
changes), and mlx-vlm's own DFlash / DFlash2 / DSpark drafter loaded from the same Hugging Face
checkpoint (the drafts themselves)."""

from __future__ import annotations

import json

import pytest

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.speculative.dflash_model import DFlashModel
from macbatch.engine.speculative.drafters import load_draft_model
from macbatch.engine.speculative.policy import SpeculationPolicy
from macbatch.models.check import check_model
from tests.support.dflash import (
    agreeing_dflash,
    mlx_vlm_drafts,
    random_dflash,
    save_dflash_checkpoint,
)
from tests.support.mtp import PROMPTS, mtp_target, recorded_proposals
from tests.support.oracle import assert_mixed_batch_exact, assert_pool_idle, mlx_lm_greedy
from tests.support.sampling_oracle import assert_sampled_after_a_draft_follow
from tests.support.tiny import build_model, save_model

MAX_TOKENS = 16
# a dense target, a hybrid (Gated DeltaNet) one and an MLA one
ARCHS = ["qwen3", "qwen3_5", "deepseek_v3"]


def _target(arch: str):
    return build_model(arch) if arch == "qwen3" else mtp_target(arch)


def _engine(model, tokenizer, drafter, **config) -> Engine:
    settings = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16)
    settings.update(config)
    return Engine(
        model, tokenizer, EngineConfig(speculative="dflash", **settings), draft_model=drafter
    )


def _greedy(engine: Engine, prompts=PROMPTS, params=None) -> list[list[int]]:
    params = params or SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    return [o.token_ids for o in engine.generate(prompts, params)]


@pytest.mark.parametrize("arch", ARCHS)
def test_agreeing_drafter_is_accepted_and_exact(arch, tiny_tokenizer):
    """Five requests in flight, prompts chunked by a 16-token budget: the drafter built to agree
    with the target has a draft of most blocks accepted (all of them where the tied target
    repeats its token; the first where an untied one does not), and the replies are mlx-lm's."""
    model = _target(arch)
    engine = _engine(model, tiny_tokenizer, agreeing_dflash(model))
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert_pool_idle(engine)
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted >= spec.verifications / 2
    assert spec.drafted > spec.verifications  # blocks, not single drafts


@pytest.mark.parametrize(
    "arch, variant",
    [(a, "dflash") for a in ARCHS] + [("qwen3_5", "dflash2"), ("deepseek_v3", "dspark")],
)
def test_rejected_blocks_leave_outputs_unchanged(arch, variant, tiny_tokenizer, eager_speculation):
    model = _target(arch)
    engine = _engine(model, tiny_tokenizer, random_dflash(model, variant=variant))
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    spec = engine.stats().speculation
    assert spec.verifications > 0 and spec.accepted < spec.drafted / 2


def test_no_context_pass_for_a_request_not_expected_to_draft_soon(
    tiny_tokenizer, eager_speculation, monkeypatch
):
    """A policy that never expects a request to draft soon (its drafts fail, or the batch is
    too large to speculate): none of its rows, prompt or decode, runs the drafter's context
    pass; requests that draft anyway (every step they may) still reply as mlx-lm does."""
    monkeypatch.setattr(SpeculationPolicy, "drafts_soon", lambda self, request, batch: False)
    model = build_model("qwen3")
    engine = _engine(model, tiny_tokenizer, random_dflash(model))
    runner = engine.runner.draft
    write = runner.write_context
    written: list[int] = []

    def recording(batch, features):
        written.append(batch.num_tokens)
        return write(batch, features)

    runner.write_context = recording
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert engine.stats().speculation.verifications > 0 and written == []


# causal blocks and sliding-window layers (windows shorter than the prompts and the block of 8:
# the context cut, and with causal blocks the block's first rows out of its last rows' window)
SLIDING = ["sliding_attention", "full_attention"]
ATTENTION = {
    "causal": dict(causal=True),
    "sliding": dict(layer_types=SLIDING, sliding_window=5),
    "causal-sliding": dict(causal=True, layer_types=SLIDING[::-1], sliding_window=5),
}
DRAFTS = [(v, "both ways", {}) for v in ("dflash", "dflash2", "dspark")] + [
    ("dflash", name, fields) for name, fields in ATTENTION.items()
]
DRAFTS += [
    ("dflash2", "sliding", dict(layer_types=["sliding_attention"] * 2, sliding_window=6)),
    # mlx-vlm's windowed context cache, over every layer: on a whole context it cuts nothing,
    # and a sliding layer still cuts its own window
    ("dflash", "sliding-draft-window", dict(ATTENTION["sliding"], draft_window_size=3)),
    ("dspark", "causal-sliding", dict(causal=True, layer_types=SLIDING, sliding_window=4)),
    ("dspark", "sliding", dict(layer_types=SLIDING, sliding_window=4)),
]


@pytest.mark.parametrize("variant, name, attention", DRAFTS)
def test_drafts_are_mlx_vlms(
    variant, name, attention, tmp_path, tiny_tokenizer, eager_speculation, monkeypatch
):
    """A random drafter saved in z-lab's checkpoint layout (DFlash's, DFlash2's, DSpark's) and
    loaded by
    the engine's draft loader proposes, at every proposal, exactly what mlx-vlm's drafter of
    that kind loaded from the same files proposes over mlx-lm's layer outputs: the paged
    context, positions, the block's two-way attention and the packing are the drafter's, and
    DFlash2's convolutions along each block, its scales and its candidate chain, and DSpark's
    block one mask shorter and its Markov chain too; causal blocks and sliding-window layers
    (each sliding layer's window of the context, and of the block where blocks are causal).
    Five requests drafted in one packed forward, their replies mlx-lm's. (Every
    request is expected to draft soon, so no prompt pass is skipped; its layers are loud enough
    that the drafts depend on the context and the block, not only the mask token.)"""
    monkeypatch.setattr(
        SpeculationPolicy,
        "drafting_soon",
        lambda self, requests, batch: {r.request_id for r in requests},
    )
    model = build_model("qwen3")
    attention = dict(attention)
    draft_window = attention.pop("draft_window_size", None)
    drafter = random_dflash(model, gain=5.0, variant=variant, **attention)
    path = save_dflash_checkpoint(tmp_path / "dflash", drafter, model, draft_window)
    drafter = load_draft_model(str(path))
    assert isinstance(drafter, DFlashModel) and drafter.config.variant == variant
    assert drafter.config.causal == ("causal" in name)
    engine = _engine(model, tiny_tokenizer, drafter)
    proposals = recorded_proposals(engine)
    assert _greedy(engine) == [mlx_lm_greedy(model, p, MAX_TOKENS) for p in PROMPTS]
    assert len(proposals) >= len(PROMPTS)
    assert len({d for _, drafts in proposals for d in drafts}) > 3  # not all the mask token
    for tokens, drafts in proposals:
        assert drafts == mlx_vlm_drafts(path, model, tokens, len(drafts))


@pytest.mark.parametrize(
    "arch, variant, attention",
    [
        ("qwen3", "dflash", "both ways"),
        ("qwen3_5", "dflash", "both ways"),
        ("qwen3", "dflash2", "both ways"),
        ("qwen3_5", "dspark", "both ways"),
        ("qwen3_5", "dflash", "causal"),
        ("qwen3", "dflash", "sliding"),
        ("deepseek_v3", "dspark", "causal-sliding"),
    ],
)
def test_mixed_batch_preemption_and_prefix_hits(
    arch, variant, attention, tiny_tokenizer, eager_speculation
):
    """Requests that opt out beside ones that speculate, a pool small enough to preempt, and
    prompts that repeat (prefix-cache hits, their blocks' context K/V written by another
    request): every reply is mlx-lm's (DFlash2's and DSpark's drafts held as DFlash's are: the
    convolutions pass each row through, the selector and the Markov head add no score; causal
    blocks' and a sliding layer's rows see the known token, as long as it is in their
    window)."""
    model = _target(arch)
    prompts = PROMPTS + PROMPTS[:3]
    drafter = agreeing_dflash(model, variant=variant, **ATTENTION.get(attention, {}))
    engine = _engine(model, tiny_tokenizer, drafter, num_blocks=14)
    assert_mixed_batch_exact(engine, model, prompts, 24)


def test_sampled_tokens_after_a_verified_block_follow_the_target(tiny_tokenizer, eager_speculation):
    """400 seeded requests at temperature 1 whose second token is verified against a DFlash
    block: given the first token, the second follows the target's distribution."""
    model = build_model("qwen3")
    drafter = agreeing_dflash(model, scale=0.3)  # a spread-out target, drafts often held
    prompt = [40, 41, 42, 43, 44]
    engine = _engine(model, tiny_tokenizer, drafter, num_blocks=256, max_num_seqs=8)
    assert_sampled_after_a_draft_follow(engine, model, prompt)


def test_seeded_samples_are_the_same_with_and_without_dflash(tiny_tokenizer):
    """Row j of a verification samples with the key of the reply's token j: a seeded request's
    tokens are the ones it gets without speculation."""
    model = build_model("qwen3")
    drafter = agreeing_dflash(model, scale=0.3)
    prompt = [90 + (i % 5) for i in range(17)]
    params = [
        SamplingParams(max_tokens=24, ignore_eos=True, temperature=t, seed=s)
        for s, t in [(1, 0.9), (2, 0.7), (3, 1.2), (4, 0.0)]
    ]
    off = Engine(model, tiny_tokenizer, EngineConfig(num_blocks=64, block_size=8))
    expected = [o.token_ids for o in off.generate([prompt] * len(params), params)]
    engine = _engine(model, tiny_tokenizer, drafter)
    assert [o.token_ids for o in engine.generate([prompt] * len(params), params)] == expected
    assert engine.stats().speculation.accepted > 0


# each kind's name in doctor's report, and its most drafts: DFlash's block of 8 less one,
# DFlash2's mlx-vlm default width of 5 less one, DSpark's block of 7 drafts
KINDS = {"dflash": ("DFlash (", 7), "dflash2": ("DFlash2 (", 4), "dspark": ("DSpark (", 7)}


@pytest.mark.parametrize("variant", KINDS)
def test_draft_model_option_detects_dflash(variant, tmp_path):
    """``--draft-model`` naming a DFlash, DFlash2 or DSpark checkpoint (``--speculative auto``
    with it means ``draft``) drafts with DFlash: the loader reads its config."""
    model = build_model("qwen3")
    target = save_model(tmp_path / "target", "qwen3")
    drafter = random_dflash(model, variant=variant)
    path = save_dflash_checkpoint(tmp_path / "dflash", drafter, model)
    config = EngineConfig(speculative="draft", draft_model=str(path))
    engine = Engine.load(str(target), config)
    name, most = KINDS[variant]
    assert engine.config.speculative == "dflash"
    assert engine.config.draft_length == 15
    assert engine.runner.draft.max_drafts == most
    report = check_model(str(path))  # macbatch doctor: what it is and what drafts with it
    assert report.problem is None
    row = dict(report.rows)["drafter"]
    assert row.startswith(name) and f"up to {most} drafts" in row and "--draft-model" in row


@pytest.mark.parametrize(
    "variant, change, reason",
    [
        ("dflash2", {"causal": True}, "DFlash2 drafter with causal blocks"),
        ("dflash", {"layer_types": ["sliding_attention"] * 2}, "needs a sliding_window"),
        ("dflash", {"layer_types": ["chunked_attention"] * 2}, "layer type"),
        ("dflash", {"layer_types": ["full_attention"]}, "must name its 2 layers"),
        ("dspark", {"markov_head_type": "lowrank"}, "Markov head"),
        ("dspark", {"architectures": ["Gemma4DSparkModel"]}, "Gemma 4 DSpark"),
    ],
)
def test_checkpoints_it_cannot_draft_with_are_refused(variant, change, reason, tmp_path):
    """A checkpoint whose drafter differs from what is built here is refused when loaded,
    saying what: DFlash2's causal blocks (mlx-vlm refuses them too), sliding layers without a
    window, another layer type or count, another Markov head, Gemma 4's layers."""
    model = build_model("qwen3")
    path = save_dflash_checkpoint(tmp_path / "d", random_dflash(model, variant=variant), model)
    raw = json.loads((path / "config.json").read_text())
    top = {k: v for k, v in change.items() if k in ("architectures", "layer_types")}
    raw.update(top)
    raw["dflash_config"].update({k: v for k, v in change.items() if k not in top})
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=reason):
        load_draft_model(str(path))
