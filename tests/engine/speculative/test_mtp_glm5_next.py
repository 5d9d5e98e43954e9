"""MTP for GLM5-next (mlx-vlm's ``glm5_next``): its MTP layer is the checkpoint's decoder layer
``num_hidden_layers`` under DeepSeek's names (``eh_proj``, ``enorm``, ``hnorm``,
``shared_head.norm`` beside the layer's own weights), the block mlx-vlm's ``glm5_next_mtp``
drafter builds: NoPE sparse MLA with its own pooling indexer, a MoE MLP, one residual stream
where the target's layers keep four (hyper-connections). It reads the target's normed output;
its latent rows and its indexer's keys and gates are paged in the request's own blocks. The
target is a hybrid (a Gated DeltaNet layer). Oracles: mlx-vlm's own greedy generation of the
target (the output never changes), mlx-vlm's own ``Glm5NextMTPDraftModel`` with the same weights
(the drafts themselves), the target's own forward at temperature 1 (chi-square), and the weights
the test wrote (loading)."""

from __future__ import annotations

import pytest

from macbatch.engine import Engine, EngineConfig
from macbatch.engine.speculative.mtp_weights import mtp_refusal
from macbatch.engine.stores.pages import LayerShape
from tests.support.mtp import (
    MTP_SETTINGS,
    PROMPTS,
    assert_mtp_weights,
    greedy_ids,
    mixed_batch_outputs,
    mlx_vlm_greedy_ids,
    mtp_engine,
    predicting_mtp_head,
    recorded_proposals,
)
from tests.support.mtp_glm5_next import (
    mlx_vlm_glm5_drafts,
    random_glm5_head,
    save_glm5_next_checkpoint,
)
from tests.support.oracle import assert_pool_idle
from tests.support.sampling_oracle import assert_sampled_after_a_draft_follow
from tests.support.tiny_glm5_next import GLM5_NEXT, TEXT_CONFIG

pytest.importorskip("mlx_vlm")


def test_glm5_next_drafts_with_mtp() -> None:
    assert mtp_refusal("glm5_next") is None


def test_greedy_outputs_are_mlx_vlms_with_a_prefix_cache_hit(tiny_tokenizer):
    """Five requests of staggered lengths in flight (contexts past the selection's pools: the
    MTP layer reads selected positions), prompts chunked by a 16-token budget, drafts mostly
    accepted (a layer predicting the target's next token); then the same prompts again from
    the prefix cache. Its pages: a latent row, then the indexer's key and gate row."""
    model = GLM5_NEXT.model()
    head = predicting_mtp_head(model)
    expected = mlx_vlm_greedy_ids(model)
    engine = mtp_engine(model, tiny_tokenizer, head)
    rank = TEXT_CONFIG["kv_lora_rank"]
    assert engine.runner.draft.store.shapes == [
        LayerShape(1, rank, value_dim=rank),
        LayerShape(1, 2 * TEXT_CONFIG["index_head_dim"], value_dim=0),
    ]
    assert greedy_ids(engine) == expected
    spec = engine.stats().speculation
    assert spec.drafted > 0 and spec.accepted > spec.drafted / 2
    assert greedy_ids(engine) == expected
    assert engine.stats().prefix_cache_hit_rate > 0
    assert_pool_idle(engine)


def test_a_mixed_batch_preempted_still_replies_as_mlx_vlm(tiny_tokenizer):
    """Requests that opt out beside ones that speculate, in 12 blocks of 8: some are preempted
    and recomputed (their Gated DeltaNet states from the prompt, their MTP rows rewritten by
    the next catch-up)."""
    model = GLM5_NEXT.model()
    engine = mtp_engine(model, tiny_tokenizer, predicting_mtp_head(model), num_blocks=12)
    prompts, outputs = mixed_batch_outputs(engine)
    assert outputs == mlx_vlm_greedy_ids(model, prompts)
    stats = engine.stats()
    assert stats.speculation.accepted > 0 and stats.preemptions > 0
    assert_pool_idle(engine)


@pytest.mark.parametrize("predicting", [False, True])
def test_drafts_are_mlx_vlms_drafters(predicting, tiny_tokenizer, eager_speculation):
    """Every proposal equals what mlx-vlm's own drafter with the same weights drafts from
    mlx-vlm's hidden states of the request's tokens (its first position's embedding zeroed, as
    ours): a random layer (its indexer's gate and bias random too; drafts of one: they fail)
    and the predicting one (drafts of three, each fed the layer's own output). The replies
    stay mlx-vlm's."""
    model = GLM5_NEXT.model()
    head = predicting_mtp_head(model) if predicting else random_glm5_head(model)
    engine = mtp_engine(model, tiny_tokenizer, head, enable_prefix_caching=False)
    proposals = recorded_proposals(engine)
    assert greedy_ids(engine) == mlx_vlm_greedy_ids(model)
    assert len(proposals) > 10
    assert max(len(d) for _, d in proposals) == (3 if predicting else 1)
    for tokens, drafts in proposals:
        assert drafts == mlx_vlm_glm5_drafts(model, head, tokens, len(drafts))


@pytest.mark.parametrize("layout", ["hugging_face", "mlx"])
def test_a_checkpoint_with_its_mtp_layer_loads_and_drafts(layout, tmp_path):
    """A checkpoint with its MTP layer at decoder layer ``num_hidden_layers``, under Hugging
    Face's names (``model.language_model.``, DeepSeek's unfused projections, one per expert)
    or mlx-vlm's: ``auto`` drafts with it, with exactly the weights written, and the replies
    are mlx-vlm's of the same checkpoint (its ``sanitize`` drops that layer)."""
    from mlx_vlm.utils import load_model

    path = tmp_path / "glm5_next"
    expected = save_glm5_next_checkpoint(path, layout)
    engine = Engine.load(str(path), EngineConfig(speculative="auto", **MTP_SETTINGS))
    assert engine.config.speculative == "mtp"
    assert_mtp_weights(engine, expected)
    prompts = PROMPTS[:2]
    assert greedy_ids(engine, prompts, 12) == mlx_vlm_greedy_ids(load_model(path), prompts, 12)
    assert engine.stats().speculation.drafted > 0


def test_sampled_tokens_after_a_verified_draft_follow_the_target(tiny_tokenizer, eager_speculation):
    """400 seeded requests at temperature 1 whose second token is verified against an MTP
    draft: given the first token, the second follows the target's distribution (mlx-vlm's
    forward; chi-square at significance 0.001). The tiny target's LM head is scaled up 8x: its
    own is so flat that no next token is common enough to test."""
    model = GLM5_NEXT.model()
    lm_head = model.language_model.lm_head
    lm_head.weight = lm_head.weight * 8
    head = predicting_mtp_head(model)  # most drafts held
    engine = mtp_engine(model, tiny_tokenizer, head, num_blocks=256, max_num_seqs=8)
    assert_sampled_after_a_draft_follow(engine, model, [40, 41, 42, 43, 44])
