"""Every model family the engine treats differently, in one table keyed by ``model_type`` (the
checkpoint's config.json field, as mlx-lm's ``models/<type>.py`` and vLLM's model registry key
them).

A family with no entry is served as mlx-lm runs it: the adapter finds its attention layers and
their caches by probing the graph, so only what a probe cannot see is written here. Each fact is
a capability (a side-by-side mixer, M-RoPE, image blocks that attend both ways ...) and the code
branches on the capability, never on the name: no other module of the engine names a family
(``tests/engine/model/test_families.py`` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# MLA families the latent pages serve that mlx-lm also has in a form the engine does not run
_SPARSE_MLA = (
    "DeepSeek sparse attention: a lightning indexer keeps keys of its own and picks each "
    "query's top-k latent rows, which the paged step does not (yet) page or select; "
    "DeepSeek V3 and V3.1 checkpoints (deepseek_v3) are served"
)
_TWO_MLA = (
    "two MLA attentions per decoder layer (one mlx-lm CacheList of two caches), which the "
    "adapter does not pair with two latent pages yet"
)
_FAST_ATTENTION = "calls mx.fast attention directly"
# Encoder-only embedding models attend both ways; the engine's paged attention is causal.
# BERT, RoBERTa and XLM-RoBERTa run in macbatch's own encoder (engine/encoder/: packed varlen
# bidirectional passes, no KV), not yet in the paged engine's step or serve; the rest are not
# built. mlx-embeddings is GPL-3.0: not a dependency (docs/embeddings.md, "Encoder models").
_DECODERS_EMBED = (
    "macbatch embeds with decoder models (Qwen3-Embedding, gte-Qwen2, or any generation model)"
)
_ENCODER_REASON = (
    f"an encoder-only (bidirectional) embedding model the engine has no code for; "
    f"{_DECODERS_EMBED}, see docs/embeddings.md"
)
_ENCODER_API = (
    "an encoder-only (bidirectional) model: the paged engine and serve do not run it yet; "
    f"macbatch.engine.encoder.model.EncoderModel embeds and scores with it, and {_DECODERS_EMBED}, "
    "see docs/embeddings.md"
)
_ENCODER_ONLY = ("modernbert", "nomic_bert", "electra", "mpnet", "deberta-v2", "new")


class ImageFeatures(Enum):
    """Which of mlx-vlm's calls encodes one image into its rows (``VisionEncoder``)."""

    # ``get_input_embeddings`` on a one-image prompt, its image rows (Pixtral, Gemma 3)
    EMBEDDINGS = "embeddings"
    # ``encode_image``: the rows as they enter the text model, after its input scaling (Gemma 4)
    ENCODE_IMAGE = "encode_image"
    # ``vision_tower`` on the pixels and patch grid: merged rows, DeepStack features beside them
    # when it returns some (Qwen VL, multimodal/qwen_vl.py)
    TOWER = "tower"


class MtpNaming(Enum):
    """How a checkpoint names its multi-token-prediction (MTP) layer's weights
    (speculative/mtp_weights.py holds each scheme's table)."""

    # Qwen3.5, Qwen3-Next: under ``mtp.`` (``fc``, ``pre_fc_norm_embedding``,
    # ``pre_fc_norm_hidden``, ``layers.N.*``, ``norm``)
    QWEN = "qwen"
    # DeepSeek V3, GLM-4.5: decoder layer ``num_hidden_layers`` of the checkpoint (``eh_proj``,
    # ``enorm``, ``hnorm``, ``shared_head.norm``, and the layer's own weights)
    NEXTN = "nextn"


@dataclass(frozen=True)
class MRoPELayout:
    """Three-part RoPE positions (multimodal/qwen_vl.py): how the text config gives them."""

    # the parts' frequencies interleaved (Qwen3-VL, Qwen3.5), or consecutive sections (Qwen2.5-VL)
    interleaved: bool
    # settings under ``rope_parameters`` with a partial rotary factor (Qwen3.5), not under
    # ``rope_scaling`` and ``rope_theta`` rotating the whole head
    rope_parameters: bool = False


@dataclass(frozen=True)
class Vision:
    """How a family's image rows run in the paged step (docs/vision.md)."""

    features: ImageFeatures = ImageFeatures.EMBEDDINGS
    # the text of one image is the processor's begin-of-image token when it has one (Gemma 3's
    # ``<start_of_image>`` expands into the image's rows), else its image token (Pixtral's
    # ``[IMG]``; Gemma 4's ``<|image|>``, whose processor does not expand its begin token)
    boi_placeholder: bool = True
    mrope: MRoPELayout | None = None  # None: image rows sit at 1-D positions
    # features from the tower's intermediate layers added to the image rows after the first text
    # layers (Qwen3-VL, multimodal/deepstack.py)
    deepstack: bool = False
    # an image's rows attend to each other both ways when the text config says
    # ``use_bidirectional_attention: "vision"`` (mlx-vlm's gemma4, model/image_blocks.py)
    bidirectional_blocks: bool = False
    # the image embeddings enter after the text model's input scaling (Gemma 4's sqrt(hidden):
    # mlx-vlm scales the token rows, then scatters the image features in as they come), where
    # mlx-lm's text model scales every row it is given (``ModelAdapter``)
    scaled_rows: bool = False


class EncoderNaming(Enum):
    """How an encoder checkpoint names its weights (encoder/weights.py maps each to ours)."""

    BERT = "bert"  # HF's BertModel: encoder.layer.N.attention.self.query ...
    DISTILBERT = "distilbert"  # transformer.layer.N.attention.q_lin, sa_layer_norm, ffn.lin1 ...


@dataclass(frozen=True)
class EncoderLayout:
    """How an encoder family's checkpoint differs (engine/encoder/: HF's names and rules)."""

    prefix: str  # where a task checkpoint puts the base model's weights ("bert.", "roberta.")
    # position ids count from padding_idx + 1 (HF's RoBERTa create_position_ids_from_input_ids)
    offset_positions: bool = False
    # the classification head has its own dense + tanh before ``out_proj`` (RoBERTa's), where
    # BERT's reads its pooler's tanh(dense(CLS)) into ``classifier``
    dense_head: bool = False
    naming: EncoderNaming = EncoderNaming.BERT


_ROBERTA = EncoderLayout("roberta.", offset_positions=True, dense_head=True)


@dataclass(frozen=True)
class Family:
    """What the engine does differently for one ``model_type`` (the defaults: nothing)."""

    refusal: str | None = None  # why the paged engine refuses it, before loading it
    # the attribute of each decoder layer holding a recurrent mixer that runs beside the layer's
    # attention (one mlx-lm ``CacheList`` per layer): the mixer runs its sequences apart while
    # the attention reads its pages with every row together
    side_by_side_mixer: str | None = None
    vision: Vision | None = None  # how its images run (None: requests with images are refused)
    vision_refusal: str | None = None  # why a checkpoint with a vision tower takes no images
    # multi-token prediction: how the checkpoint names the MTP layer speculative/mtp_model.py
    # builds (None: the family has none it builds)
    mtp: MtpNaming | None = None
    encoder: EncoderLayout | None = None  # an encoder engine/encoder/ runs (None: not one)


FAMILIES: dict[str, Family] = {
    # Architectures known not to route attention through mlx-lm's scaled_dot_product_attention
    # (the name the attention hook replaces), or to keep a cache or recurrent state the engine
    # does not page. MLA models (deepseek_v2/v3, glm4_moe_lite, minicpm3, mistral4, youtu_llm,
    # kimi_k25, kimi_vl, kimi_linear, bailing_moe_v3) need no entry: their attention modules are
    # found by shape (hooks/latent_attention.py) and cached in latent pages (kv/latent.py).
    "deepseek_v32": Family(refusal=_SPARSE_MLA),
    "glm_moe_dsa": Family(refusal=_SPARSE_MLA),
    "longcat_flash": Family(refusal=_TWO_MLA),
    "longcat_flash_ngram": Family(refusal=_TWO_MLA),
    "bailing_hybrid": Family(
        refusal="its linear-attention (GLA) layers read their state as cache[0], which the "
        "engine's paged recurrent state does not offer yet"
    ),
    "kimi_k3": Family(
        refusal="its decoder layers pass attention-residual blocks from layer to layer (a "
        "tuple beside the hidden states), which the engine's recurrent step does not carry"
    ),
    "deepseek_v41": Family(refusal=_FAST_ATTENTION),
    "muse_spark": Family(refusal=_FAST_ATTENTION),
    "plamo2": Family(refusal=f"{_FAST_ATTENTION} and keeps SSM state"),
    "gemma2": Family(
        refusal="computes attention inline (logit softcap) instead of through mlx-lm's SDPA"
    ),
    "bert": Family(refusal=_ENCODER_API, encoder=EncoderLayout("bert.")),
    "roberta": Family(refusal=_ENCODER_API, encoder=_ROBERTA),
    "xlm-roberta": Family(refusal=_ENCODER_API, encoder=_ROBERTA),
    "distilbert": Family(
        refusal=_ENCODER_API, encoder=EncoderLayout("distilbert.", naming=EncoderNaming.DISTILBERT)
    ),
    **dict.fromkeys(_ENCODER_ONLY, Family(refusal=_ENCODER_REASON)),
    "falcon_h1": Family(side_by_side_mixer="mamba"),
    # Image rows at 1-D RoPE positions, causal. Gemma 3: HF's attends both ways within an image
    # span, but mlx-vlm's (the oracle here) runs its language model with the causal and
    # sliding-window masks (its ``attention_mask_4d`` never reaches the attention), so its image
    # rows are causal rows too (docs/vision.md).
    "mistral3": Family(vision=Vision()),
    "gemma3": Family(vision=Vision()),
    "gemma4": Family(
        vision=Vision(
            features=ImageFeatures.ENCODE_IMAGE,
            boi_placeholder=False,
            bidirectional_blocks=True,
            scaled_rows=True,
        )
    ),
    "qwen2_vl": Family(
        vision_refusal="Qwen2-VL's M-RoPE path is Qwen2.5-VL's but untested here; not enabled"
    ),
    "qwen2_5_vl": Family(vision=Vision(ImageFeatures.TOWER, mrope=MRoPELayout(interleaved=False))),
    "qwen3_vl": Family(
        vision=Vision(ImageFeatures.TOWER, mrope=MRoPELayout(interleaved=True), deepstack=True)
    ),
    "qwen3_5": Family(
        vision=Vision(
            ImageFeatures.TOWER, mrope=MRoPELayout(interleaved=True, rope_parameters=True)
        ),
        mtp=MtpNaming.QWEN,
    ),
    "qwen3_5_moe": Family(mtp=MtpNaming.QWEN),
    "qwen3_next": Family(mtp=MtpNaming.QWEN),
    # the MTP layer of an MLA family (deepseek_v3, glm4_moe_lite) pages its latent rows
    "deepseek_v3": Family(mtp=MtpNaming.NEXTN),
    "glm4_moe": Family(mtp=MtpNaming.NEXTN),
    "glm4_moe_lite": Family(mtp=MtpNaming.NEXTN),
}
_PLAIN = Family()


def family(model_type: str) -> Family:
    """The family record of ``model_type`` (one without an entry: served as mlx-lm runs it)."""
    return FAMILIES.get(model_type, _PLAIN)


def unsupported_reason(model_type: str) -> str | None:
    """Why an architecture is refused before even loading it, or None if it may be served."""
    return family(model_type).refusal


def vision_families() -> tuple[str, ...]:
    """The model types whose images the engine runs, in the table's order."""
    return tuple(name for name, f in FAMILIES.items() if f.vision is not None)
