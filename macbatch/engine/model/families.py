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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

# what a user of a family refused below can do meanwhile
_MEANWHILE = "Until it is served here, mlx-lm's own generation (mlx_lm.generate) runs it"
_MEANWHILE_VLM = "Until it is served here, mlx-vlm's own generation (mlx_vlm.generate) runs it"


def _v41_mixed_ratios(args: Any) -> str | None:
    """A DeepSeek V4.1 layer that selects among one compression ratio's rows (its indexer's keys,
    or the top-k of the index layer it reuses) but reads another ratio's compressed rows: mlx-lm
    gathers past its rows there (NaN at random, docs/engine.md, "DeepSeek V4")."""
    from mlx_lm.models.deepseek_v41 import _shared_reads

    ratios = args.compress_ratios
    for layer in range(args.num_hidden_layers):
        reads = _shared_reads(args, layer)
        rows, keys = reads.get("compress_kv"), reads.get("index_k")
        if "topk_idx" in reads:
            keys = _shared_reads(args, reads["topk_idx"]).get("index_k")
        if rows is not None and keys is not None and ratios[rows] != ratios[keys]:
            return (
                f"layer {layer} selects among the ratio-{ratios[keys]} rows of layer {keys} but "
                f"reads the ratio-{ratios[rows]} rows of layer {rows}, where mlx-lm itself "
                "gathers past its rows (NaN at random): there is no output to match"
            )
    return None


def _reference_caches(language_model: Any) -> list[Any]:
    """DeepSeek V4's held caches as its reference keeps them (model/overlap_pooling.py)."""
    from macbatch.engine.model.overlap_pooling import reference_caches

    return reference_caches(language_model)


# Encoder-only embedding models attend both ways; the engine's paged attention is causal.
# BERT, RoBERTa, XLM-RoBERTa, DistilBERT, MPNet, ELECTRA, DeBERTa-v2, gte (``new``), Nomic BERT
# and ModernBERT run in macbatch's own encoder (engine/encoder/: packed varlen bidirectional
# passes, no KV, in an engine of their own). mlx-embeddings is GPL-3.0: not a dependency
# (docs/embeddings.md, "Encoder models").
# why an encoder the encoder engine serves does not load as a generation model
ENCODER_DOES_NOT_GENERATE = (
    "an encoder model: it embeds and scores (serve's /v1/embeddings, /v1/rerank, /v1/score; "
    "run's embed and rerank jobs; docs/embeddings.md) and does not generate"
)


class Library(Enum):
    """Whose code a family's text model is: mlx-lm's ``models/<type>.py``, or the language model
    of mlx-vlm's ``models/<type>/`` where mlx-lm has none (the loader reads it from here)."""

    MLX_LM = "mlx-lm"
    MLX_VLM = "mlx-vlm"


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
    # DeepSeek V3 / V3.2, GLM-4.5 / 5: decoder layer ``num_hidden_layers`` of the checkpoint
    # (``eh_proj``, ``enorm``, ``hnorm``, ``shared_head.norm``, and the layer's own weights)
    NEXTN = "nextn"
    # Nemotron-H: one MTP module of several blocks under ``mtp.layers.N.`` (the config's
    # ``mtp_hybrid_override_pattern``: attention and MoE blocks), ``enorm``, ``hnorm`` and
    # ``eh_proj`` on its first block, ``final_layernorm`` on its last
    NEMOTRON = "nemotron"
    # Hunyuan V4: under ``model.mtp_layers.N.`` (``eh_proj``, ``enorm``, ``hnorm``,
    # ``final_layernorm``, and the layer's own weights), a layer without hyper-connections
    HY_V4 = "hy_v4"
    # Qwen4-exp: under ``mtp.`` as Qwen3.5's, its parts ``fc_embedding``, ``fc_hidden``,
    # ``pre_fc_norm_*`` and ``hyper_connection_mixer``: it reads the target's hyper-connection
    # streams before their final mixer
    QWEN4 = "qwen4"
    # GLM5-next: DeepSeek's parts on decoder layer ``num_hidden_layers`` under the text model's
    # prefix (``model.language_model.`` in Hugging Face's layout, ``language_model.model.`` as
    # mlx-vlm saves it); the layer mlx-vlm's ``glm5_next_mtp`` drafter builds: one stream where
    # the target's layers keep four, its own pooling indexer, a MoE MLP
    GLM5_NEXT = "glm5_next"
    # DeepSeek V4 (mlx-vlm): its release's names under ``mtp.N.`` (``e_proj``, ``h_proj``,
    # ``enorm``, ``hnorm``, ``attn.*``, ``ffn.*``, ``hc_attn_*``, ``hc_ffn_*``, ``hc_head_*``,
    # ``norm``): the block mlx-vlm's ``deepseek_v4_mtp`` drafter builds over the target's streams
    DEEPSEEK_V4 = "deepseek_v4"


@dataclass(frozen=True)
class MRoPELayout:
    """Three-part RoPE positions (multimodal/qwen_vl.py): how the text config gives them."""

    # the parts' frequencies interleaved (Qwen3-VL, Qwen3.5), or consecutive sections (Qwen2.5-VL);
    # unread where the text model rotates by the position ids it is handed (GLM-4V's
    # ``position_id_axes`` 3)
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
    # the text the processor expands into one image where it names no token for it (InternVL's
    # ``<image>``, which its processor replaces by the image's tiles' rows); None: the
    # processor's begin-of-image or image token
    placeholder: str | None = None
    # the attribute of mlx-vlm's model holding its vision tower, language model and their
    # config (Qwen3-Omni's ``thinker``, beside its talker); None: the model itself
    part: str | None = None


class EncoderNaming(Enum):
    """How an encoder checkpoint names its weights (encoder/weights.py maps each to ours)."""

    BERT = "bert"  # HF's BertModel: encoder.layer.N.attention.self.query ...
    DISTILBERT = "distilbert"  # transformer.layer.N.attention.q_lin, sa_layer_norm, ffn.lin1 ...
    # Alibaba's gte ``NewModel``: rotary, encoder.layer.N.attention.qkv_proj, mlp.up_gate_proj
    GTE = "gte"
    NOMIC = "nomic"  # Nomic BERT: rotary, encoder.layers.N.attn.Wqkv, mlp.fc11 / fc12, no biases
    # ModernBERT: pre-norm, layers.N.attn.Wqkv, mlp.Wi, local and global attention layers
    MODERNBERT = "modernbert"
    # MPNet: BERT's block as attention.attn.q / k / v / o, a relative-position bias, no types
    MPNET = "mpnet"
    ELECTRA = "electra"  # BERT's names, narrower embeddings and ``embeddings_project``
    # DeBERTa-v2 / v3: query_proj / key_proj / value_proj, rel_embeddings, disentangled attention
    DEBERTA = "deberta"


@dataclass(frozen=True)
class ClassifierHead:
    """A family's ``*ForSequenceClassification`` head as transformers defines it: ``out(norm(
    act(dense(pooled))))`` over each sequence's pooled row, the weights under these names (the
    base model's prefix stripped). ``activation``, ``dense_bias`` and ``pooling`` are the
    defaults a checkpoint's config may override (engine/encoder/config.py reads them)."""

    dense: str
    out: str
    activation: str = "tanh"
    norm: str | None = None  # ModernBERT's LayerNorm after the activation
    dense_bias: bool = True
    pooling: str = "cls"  # the row it reads: the first token's, or ModernBERT's "mean"


# BertForSequenceClassification: BertPooler's tanh(dense(CLS)), then ``classifier``
_BERT_HEAD = ClassifierHead("pooler.dense", "classifier")
# RobertaClassificationHead (MPNet's is the same): its own dense + tanh, then ``out_proj``
_ROBERTA_HEAD = ClassifierHead("classifier.dense", "classifier.out_proj")


@dataclass(frozen=True)
class EncoderLayout:
    """How an encoder family's checkpoint differs (engine/encoder/: HF's names and rules)."""

    prefix: str  # where a task checkpoint puts the base model's weights ("bert.", "roberta.")
    # position ids count from padding_idx + 1 (HF's RoBERTa create_position_ids_from_input_ids)
    offset_positions: bool = False
    head: ClassifierHead = _BERT_HEAD
    naming: EncoderNaming = EncoderNaming.BERT


_ROBERTA = EncoderLayout("roberta.", offset_positions=True, head=_ROBERTA_HEAD)


@dataclass(frozen=True)
class Family:
    """What the engine does differently for one ``model_type`` (the defaults: nothing)."""

    refusal: str | None = None  # why the paged engine refuses it, before loading it
    library: Library = Library.MLX_LM  # whose code its text model is
    # the attribute of each decoder layer holding its recurrent mixer, beside the layer's
    # attention (Falcon-H1: one mlx-lm ``CacheList`` per layer) or in its place (Kimi K3): the
    # mixer runs its sequences apart while the rest of the layer runs every row together
    side_by_side_mixer: str | None = None
    # the attribute of each decoder layer holding an attention module that multiplies queries
    # and keys itself and caps the scores inline (Gemma 2), which hooks/softcap_attention.py
    # routes to the kernel's softcap
    inline_softcap_attention: str | None = None
    # the attribute of each decoder layer holding an attention module that reads its cache's
    # offset as a number, in an inner transformer that builds its masks from it too (Llama 4's
    # query temperature and chunk masks): hooks/scalar_offsets.py swaps both classes
    scalar_offset_attention: str | None = None
    # the attribute of each decoder layer holding an attention module that rotates by a RoPE table
    # cut at its cache's offset as one number (HunYuan VL's): hooks/offset_rope.py swaps its
    # class to rotate each row at its own position
    offset_rope_attention: str | None = None
    # the attribute of each decoder layer holding its attention, where some of them are handed
    # another layer's K/V as arrays, not a cache (AFM 7's KV-reuse layers, over the last cached
    # layer's): hooks/reused_kv.py swaps those to rotate each row at its own position and attend
    # over that layer's pages
    reused_kv_attention: str | None = None
    vision: Vision | None = None  # how its images run (None: requests with images are refused)
    vision_refusal: str | None = None  # why a checkpoint with a vision tower takes no images
    # multi-token prediction: how the checkpoint names the MTP layer speculative/mtp_model.py
    # builds (None: the family has none it builds)
    mtp: MtpNaming | None = None
    # why a family whose checkpoints may keep an MTP layer drafts without it (None: ``mtp``
    # says how it is read, or the family has none)
    mtp_refusal: str | None = None
    encoder: EncoderLayout | None = None  # an encoder engine/encoder/ runs (None: not one)
    # the attribute of each decoder layer holding an attention module whose cache is the
    # library's own kind, neither pages nor a fixed-size state (DeepSeek V4's LayerCache): its
    # caches are held per request slot and it runs the step's sequences apart
    # (model/held_attention.py)
    held_cache_attention: str | None = None
    # a new request's held caches, made from the text model (None: its own ``make_cache``)
    held_caches: Callable[[Any], list[Any]] | None = None
    # the axes of the ``position_ids`` its inner transformer takes where without them it reads
    # its first cache's offset as one number (GLM-4V's ``mx.arange(cache[0].offset, ...)``) or
    # counts from 0 (Command A Vision's): 1 (``[B, L]``) or 3 (M-RoPE's ``[3, B, L]``); the
    # adapter hands it each row's position (None: it takes none)
    position_id_axes: int | None = None
    # its inner transformer evaluates its hidden states between layers (mlx-vlm's Qwen3-Omni:
    # ``mx.eval(h)`` after every fourth), which ``mx.compile`` cannot trace: its decode steps
    # run uncompiled (worker/compiled_step.py)
    evaluates_between_layers: bool = False
    # why a loaded model of the family is refused for its config (its ``args``), or None: what
    # the family's library itself computes wrongly has no output to match
    config_refusal: Callable[[Any], str | None] | None = None


# What mlx-vlm alone has (docs/models.md, "Families only mlx-vlm has"), refused by what each is;
# each one served has a tiny model in a parity test
# (test_vlm_only_text.py's test_every_served_mlx_vlm_family_is_checked_here)
_SPARSE = (
    "sparse attention (an indexer picks each query's top-k key blocks), which the paged step "
    "does not select yet (the sparse attention issue)"
)
_VLM_SPARSE = ("longcat_flash_sparse",)
_NOT_TEXT = "not a text generator"
_VLM_NOT_TEXT = {
    f"{_NOT_TEXT}: it makes images or video": (
        "bonsai", "ernie_image", "flux2", "flux3", "ideogram4", "llada_image", "mage_flow",
        "ming_image", "minimax_h3", "moss_image", "qwen_image", "z_image",
    ),
    f"{_NOT_TEXT}: it detects, segments, or estimates depth, pose or shape": (
        "rfdetr", "rt_detr_v2", "sam3", "sam3_1", "sam3d_body", "sam3d_objects", "sapiens2",
        "video_depth_anything", "yolo11", "moge3", "pp_doclayout_v3", "falcon_perception",
    ),
    f"{_NOT_TEXT}: an encoder, embedding, retrieval or classification model (macbatch embeds "
    "with decoder models, docs/embeddings.md)": (
        "clef", "siglip", "dinov2", "laya", "gliner2_5", "xlm_roberta", "colidefics3", "colqwen2_5",
        "embedding_gemma2", "gemma3_embedding", "lfm2_colbert", "lfm2_embedding",
        "lfm2_encoder", "llama_bidirec", "llama_nemotron_vl_embedding", "ministral3_embedding",
        "qwen3_embedding", "qwen3_vl_embedding", "openai_privacy_filter",
    ),
    "a diffusion language model (it denoises a block of tokens at once), not autoregressive "
    "decoding": ("diffusion_gemma", "llada2_moe", "nemotron_labs_diffusion", "d1", "d1_omni"),
    "an encoder-decoder or cross-attention model (its decoder attends to an encoder's states, "
    "which the paged step does not keep)": ("florence2", "nemotron_parse", "mllama"),
    "a speech (duplex voice) model": ("nemotron_voicechat",),
    "on a tiny model its greedy tokens equal mlx-vlm's but their log-probabilities differ by up "
    "to 7e-3 (1e-4 for every served family): not served until that is explained. "
    f"{_MEANWHILE_VLM}": ("paligemma",),
    "attention-free (AFT) layers that keep a cache kind of their own (Z1TCache), which the "
    f"engine does not page. {_MEANWHILE_VLM}": ("z1t",),
}  # fmt: skip
# text models checked against mlx-vlm's own generation (tests/engine/model/test_vlm_only_text.py)
_VLM_SERVED = ("minimax_m3", "k2_horizon", "cohere2_moe", "klear", "kolibri1", "flint", "xing4_0",
               "hrm_text",
               # Gated DeltaNet layers: their state in mlx-vlm's own ArraysCache (its calls)
               "qwen3_5_text", "qwen3_5_moe_text", "decider2")  # fmt: skip
# VLMs whose text is served (checked the same way) and whose images are not checked yet; Step 3.7
# and Mistral Large 3, whose images cannot enter the packed step yet, have entries of their own
_VLM_TEXT_SERVED = ("llmjpvl",)
_IMAGES_UNCHECKED = "not checked against mlx-vlm's image generation here yet (text is served)"
_PHI4_SIGLIP_IMAGES = (
    "its processor writes one id per image that mlx-vlm's model replaces by all the image's "
    "rows, which the engine does not expand yet, and mlx-vlm's processor for it needs PyTorch "
    "(transformers' Siglip2ImageProcessor) to read an image (text is served)"
)
# VLMs whose language model is mlx-vlm's own code, checked as text on tiny models of derived
# configs (tests/engine/model/test_vlm_language_models.py; DeepSeek-OCR 2's built in memory, its
# code sizing its towers itself); their images are not checked yet
_VLM_TEXT_CHECKED = (
    "deepseek_vl_v2", "deepseekocr", "deepseekocr_2", "dots_ocr", "falcon_ocr",
    "fastvlm", "got", "granite4_vision", "indic_ocr",
    "jina_vlm", "locateanything", "mage_vl", "mimo_v2", "minicpmv4_6",
    "minicpmv4_7", "molmo2", "moondream2", "moondream3", "multi_modality", "nemotron_h_nano_omni",
    "phi3_v", "phi4mm", "plamo2vl", "youtu_vl",
)  # fmt: skip
# those of them whose inner transformer takes each row's position ids (``[B, L]``): without them
# Command A Vision's counts its positions from 0, ERNIE 4.5 VL's 3-D RoPE (its text rows' three
# parts one position) takes mx.arange from its cache's offset, an array on the paged cache
_VLM_POSITION_TEXT = ("cohere_compass", "ernie4_5_moe_vl")
# those of them whose inner transformer takes M-RoPE position ids (``position_id_axes``; Qwen3-Omni:
# its thinker's)


# VLMs whose language model is mlx-vlm's own code, tried on tiny models of derived configs
# (tests/support/vlm_architectures.py) and refused for what their layers do
_VLM_REFUSED_LAYERS = {
    "its text model (mlx-vlm's Qwen3-VL one) computes its M-RoPE positions in its __call__ from "
    "a vision field (spatial_merge_size) its vision config lacks, unless the top model set them "
    "first as mlx-vlm's generation does: the packed step's LM head, run through that __call__, "
    f"raises there. {_MEANWHILE_VLM}": ("minicpmo",),
    "its inner transformer applies the LM head itself and returns every row's logits, where the "
    f"packed step takes its normed hidden states. {_MEANWHILE_VLM}": ("molmo",),
    "its text generation runs through the whole model (its language_model is the model itself: "
    "point prediction over image patches, a logit processor that keeps the generated ids), not "
    f"a text model the packed step can run. {_MEANWHILE_VLM}": ("molmo_point",),
    "its attention builds its sliding-window mask from its cache's offset as one number, and its "
    "inner transformer its positions likewise, where each row of the packed step has a position "
    f"of its own. {_MEANWHILE_VLM}": ("limite",),
    "its layers keep a RingSlidingKVCache (the whole prompt's K/V, then a ring of the last "
    "window of generated tokens'), a cache kind the engine does not page. "
    f"{_MEANWHILE_VLM}": ("unlimited_ocr",),
    "its attention convolves its keys and values (and each layer its attention and MLP outputs) "
    "over the previous tokens' (short convolutions whose last inputs it keeps in an ArraysCache "
    "beside the K/V, one CacheList per layer, and reads inside the attention), a state the "
    f"packed step's rows do not carry. {_MEANWHILE_VLM}": ("inkling",),
    "its attention (CCA) convolves each token's queries and keys over the previous two tokens' "
    "and projects half its values from the previous token's hidden state, keeping both in an "
    "ArraysCache beside the K/V (one CacheList per layer) read inside the attention, a state "
    "the packed step's rows do not carry (on a tiny model the adapter's probe refuses it so: "
    f"no mixer it runs apart). {_MEANWHILE_VLM}": ("zaya1_vl",),
}


def _mlx_vlm_refused() -> dict[str, Family]:
    """The refused families only mlx-vlm has, by model type (each with its reason)."""
    groups = {
        _SPARSE: _VLM_SPARSE,
        **_VLM_REFUSED_LAYERS,
        **_VLM_NOT_TEXT,
    }
    return {
        name: Family(refusal=reason, library=Library.MLX_VLM)
        for reason, names in groups.items()
        for name in names
    }


FAMILIES: dict[str, Family] = {
    # Architectures known not to route attention through mlx-lm's scaled_dot_product_attention
    # (the name the attention hook replaces), or to keep a cache or recurrent state the engine
    # does not page. MLA models (deepseek_v2/v3, glm4_moe_lite, minicpm3, mistral4, youtu_llm,
    # kimi_k25, kimi_vl, kimi_linear, bailing_moe_v3) need no entry: their attention modules are
    # found by shape (hooks/latent_attention.py) and cached in latent pages (kv/latent.py).
    # DeepSeek Sparse Attention (deepseek_v32, glm_moe_dsa) needs none either: its lightning
    # indexer is found on the MLA module, its keys kept beside the latent pages
    # (kv/indexer_keys.py) and each row's top-k positions selected in the step
    # (model/sparse_indexer.py).
    # Kimi K3's decoder layers mix each token's attention-residual blocks (a tuple beside the
    # hidden states, rebuilt by every forward: no state across steps); only its Kimi Delta
    # Attention mixers run the step's sequences apart
    # LongCat Flash's two MLA attentions per layer need none: each part of its CacheList is a
    # store layer of its own (``ModelAdapter._attentions_in``)
    "longcat_flash_ngram": Family(
        refusal="its n-gram embedding keeps each request's last tokens as state (an ArraysCache "
        "before the layers' caches) read outside any layer, which the packed step's rows do not "
        "carry; longcat_flash, its layers without the n-gram embedding, is served. "
        f"{_MEANWHILE}"
    ),
    "kimi_k3": Family(side_by_side_mixer="self_attn"),
    # its KV-reuse layers attend over the last cached layer's K/V: hooks/reused_kv.py
    "afm7": Family(reused_kv_attention="self_attn"),
    # chunked layers (a ChunkedKVCache each) attend within their chunk: model/attention_chunks.py
    "llama4": Family(scalar_offset_attention="self_attn"),
    "baichuan_m1": Family(
        refusal="its attention convolves each key and value with the previous token's raw "
        "key and value (conv_window 2; that token's kept in an ArraysCache beside the KVCache in "
        "one CacheList): the packed step would have to carry each request's last raw K/V per "
        f"layer beside its pages, which it does not yet. {_MEANWHILE}"
    ),
    # DeepSeek V4's attention keeps mlx-lm's own LayerCache per layer (a window, compressed rows
    # and their indexer keys, the open group's projections), held per request slot and run per
    # sequence (model/held_attention.py); its hyper-connections and MoE run every row together
    "deepseek_v41": Family(
        held_cache_attention="self_attn",
        config_refusal=_v41_mixed_ratios,
        mtp_refusal="its checkpoints' MTP layer ('mtp.*', which mlx-lm's sanitize drops) would be "
        "a V4.1 block, which no library builds as a drafter to check ours against: not read yet",
    ),
    # DeepSeek V4 as released (mlx-vlm's deepseek_v4: overlapping ratio-4 compression, an indexer
    # with a compressor of its own, hash-routed first layers, a hyper-connection head), held the
    # same way; its overlapping compressors' pooling caches keep the previous group as DeepSeek's
    # reference does, where mlx-vlm's own zero it at every call (model/overlap_pooling.py)
    "deepseek_v4": Family(
        library=Library.MLX_VLM,
        held_cache_attention="attn",
        held_caches=_reference_caches,
        mtp=MtpNaming.DEEPSEEK_V4,
    ),
    "muse_spark": Family(
        refusal="its text model sits two levels down (model.model.language_model, in a container "
        "with no forward of its own), where the adapter finds the transformer it packs one level "
        "down; its layers (attention through scaled_dot_product_attention, experts) are not what "
        f"stops it. {_MEANWHILE}"
    ),
    # PLaMo 2 needs none: its attention layers' own mx.fast calls reach the pages through
    # hooks/direct_attention.py, its Mamba layers' state the recurrent-state group
    # attention computed inline with a logit softcap: hooks/softcap_attention.py
    "gemma2": Family(inline_softcap_attention="self_attn"),
    "phi3small": Family(
        refusal="its block-sparse attention layers (local blocks and vertical strides) compute "
        "attention inline over a mask of their own, which the paged step does not select. "
        f"{_MEANWHILE}"
    ),
    "plamo3": Family(
        refusal="mlx-lm's plamo3 disagrees with itself past its sliding window: a forward over a "
        "whole prompt attends to window + 1 keys, its RotatingKVCache keeps window keys in "
        "decoding, so there is no one window the paged step could reproduce (prompts and "
        f"replies within the window agree). {_MEANWHILE}, with that disagreement"
    ),
    "bert": Family(encoder=EncoderLayout("bert.")),
    "roberta": Family(encoder=_ROBERTA),
    "xlm-roberta": Family(encoder=_ROBERTA),
    # DistilBertForSequenceClassification: ReLU between ``pre_classifier`` and ``classifier``
    "distilbert": Family(
        encoder=EncoderLayout(
            "distilbert.",
            head=ClassifierHead("pre_classifier", "classifier", "relu"),
            naming=EncoderNaming.DISTILBERT,
        )
    ),
    # the prefixes: NewForMaskedLM's ``new.``, NomicBertForPreTraining's ``bert.``,
    # ModernBertForMaskedLM's ``model.`` (their base models save none); MPNet counts positions
    # as RoBERTa does and names its head as RoBERTa's; gte's and Nomic's heads are BERT's
    "new": Family(encoder=EncoderLayout("new.", naming=EncoderNaming.GTE)),
    "nomic_bert": Family(encoder=EncoderLayout("bert.", naming=EncoderNaming.NOMIC)),
    # ModernBertPredictionHead (dense without bias, GELU, LayerNorm) then ``classifier``, over
    # the row its config's ``classifier_pooling`` says
    "modernbert": Family(
        encoder=EncoderLayout(
            "model.",
            head=ClassifierHead("head.dense", "classifier", "gelu", "head.norm", False),
            naming=EncoderNaming.MODERNBERT,
        )
    ),
    "mpnet": Family(
        encoder=EncoderLayout(
            "mpnet.", offset_positions=True, head=_ROBERTA_HEAD, naming=EncoderNaming.MPNET
        )
    ),
    # ElectraClassificationHead: RoBERTa's names with GELU in place of tanh
    "electra": Family(
        encoder=EncoderLayout(
            "electra.",
            head=ClassifierHead("classifier.dense", "classifier.out_proj", "gelu"),
            naming=EncoderNaming.ELECTRA,
        )
    ),
    # DebertaV2ForSequenceClassification: ContextPooler's ``pooler_hidden_act``(dense(CLS))
    "deberta-v2": Family(
        encoder=EncoderLayout(
            "deberta.",
            head=ClassifierHead("pooler.dense", "classifier", "gelu"),
            naming=EncoderNaming.DEBERTA,
        )
    ),
    "falcon_h1": Family(side_by_side_mixer="mamba"),
    # text models only mlx-vlm has (docs/models.md, "Families only mlx-vlm has")
    **dict.fromkeys(_VLM_SERVED, Family(library=Library.MLX_VLM)),
    **dict.fromkeys(
        _VLM_TEXT_SERVED + _VLM_TEXT_CHECKED,
        Family(library=Library.MLX_VLM, vision_refusal=_IMAGES_UNCHECKED),
    ),
    # its text checked as ``_VLM_TEXT_CHECKED``'s; its processor writes one id (-200) per image,
    # which its model replaces by the image's real patches, and mlx-vlm's processor for it needs
    # PyTorch (tests/vision/test_phi4_siglip_images.py)
    "phi4_siglip": Family(library=Library.MLX_VLM, vision_refusal=_PHI4_SIGLIP_IMAGES),
    # its attention rotates by a table cut at its cache's offset as one number
    "hunyuan_vl": Family(
        library=Library.MLX_VLM, vision_refusal=_IMAGES_UNCHECKED, offset_rope_attention="self_attn"
    ),
    **dict.fromkeys(
        _VLM_POSITION_TEXT,
        Family(library=Library.MLX_VLM, vision_refusal=_IMAGES_UNCHECKED, position_id_axes=1),
    ),
    # its thinker is Qwen3-VL's image path (interleaved M-RoPE, DeepStack) on mlx-vlm's own MoE
    # text model, which rotates by the position ids it is handed
    "qwen3_omni_moe": Family(
        library=Library.MLX_VLM,
        vision=Vision(
            ImageFeatures.TOWER,
            mrope=MRoPELayout(interleaved=True),
            deepstack=True,
            part="thinker",
        ),
        position_id_axes=3,
        evaluates_between_layers=True,
    ),
    # its rope index is Qwen VL's, but its tower is mlx-vlm's ``visual`` (a SigLIP patch
    # embedding and a projector sized 1024 in its code), which the tower call does not read
    "paddleocr_vl": Family(
        library=Library.MLX_VLM,
        vision_refusal="its vision tower (mlx-vlm's 'visual', not a Qwen VL 'vision_tower') "
        "is not called by the engine's image path yet, and its images are not checked against "
        "mlx-vlm's image generation here (text is served)",
        position_id_axes=3,
    ),
    # their text model takes the M-RoPE position ids (Qwen VL's rule) and rotates by them itself
    **dict.fromkeys(
        ("glm4v", "glm4v_moe", "glm_ocr"),
        Family(
            library=Library.MLX_VLM,
            vision=Vision(ImageFeatures.TOWER, mrope=MRoPELayout(interleaved=False)),
            position_id_axes=3,
        ),
    ),
    # its MTP layer (mlx-vlm's own class: one stream, no hyper-connections) pages its latent rows
    # and its indexer's keys, as DeepSeek V3.2's does
    "hy_v4": Family(library=Library.MLX_VLM, mtp=MtpNaming.HY_V4),
    "step3p7": Family(
        library=Library.MLX_VLM,
        vision_refusal=_IMAGES_UNCHECKED,
    ),
    # Qwen Sparse Attention's block indexer: hooks/block_sparse_attention.py, model/qsa_indexer.py
    # its MTP layer (mlx-vlm's classes) reads the target's last layer's streams (layer_taps.py)
    "qwen4_exp": Family(
        library=Library.MLX_VLM,
        mtp=MtpNaming.QWEN4,
        vision_refusal="its images are not checked against mlx-vlm's image generation here yet "
        "(text is served)",
    ),
    # GLM5-next's pooling indexer (shared by the layers after it): hooks/pooled_sparse_attention.py,
    # model/pool_indexer.py; its MTP layer (mlx-vlm's drafter's block: one stream, its own
    # pooling indexer) pages its latent rows and its indexer's keys and gates as the target's do
    "glm5_next": Family(
        library=Library.MLX_VLM,
        mtp=MtpNaming.GLM5_NEXT,
        vision_refusal="its images are not checked against mlx-vlm's image generation here yet "
        "(text is served)",
    ),
    "mistral_large3": Family(
        library=Library.MLX_VLM,
        vision_refusal="its text model (mlx-vlm's DeepSeek V3) takes no input embeddings, so "
        "image rows cannot enter the packed step yet (text is served)",
    ),
    **_mlx_vlm_refused(),
    # Image rows at 1-D RoPE positions, causal. Gemma 3: HF's attends both ways within an image
    # span, but mlx-vlm's (the oracle here) runs its language model with the causal and
    # sliding-window masks (its ``attention_mask_4d`` never reaches the attention), so its image
    # rows are causal rows too (docs/vision.md).
    "mistral3": Family(vision=Vision()),
    # mlx-vlm's language model; an image is its tiles' rows and its whole image's, as the
    # processor expands it (docs/vision.md)
    **dict.fromkeys(("idefics3", "smolvlm"), Family(library=Library.MLX_VLM, vision=Vision())),
    "idefics2": Family(
        library=Library.MLX_VLM,
        vision_refusal="mlx-vlm's Idefics 2 tower attends over the padding its processor adds to "
        "a prompt's smaller images, so an image's rows depend on the other images beside it "
        "(tests/vision/test_idefics2_images.py), where the engine encodes each image alone; "
        "text is served",
    ),
    # AnyRes tiles unpadded to the image's aspect, a learned newline row after each row of them
    "llava_onevision": Family(library=Library.MLX_VLM, vision=Vision()),
    "llava_bunny": Family(
        library=Library.MLX_VLM,
        vision_refusal="mlx-vlm's Bunny puts its 729 image rows in place of one image id the "
        "processor never expands, its rows outnumbering the prompt's ids, and reads only a "
        "prompt's first image (tests/vision/test_llava_bunny_images.py), where the engine gives "
        "each image token one row; text is served",
    ),
    # mlx-vlm's Granite Vision merges its image rows as its LLaVA-NeXT does
    **dict.fromkeys(
        ("llava_next", "granite_vision"),
        Family(
            library=Library.MLX_VLM,
            vision_refusal="mlx-vlm's LLaVA-NeXT puts a whole crop's rows (or a block of newline "
            "rows) in place of each image token the processor expands, its rows outnumbering the "
            "prompt's ids, and reads only a prompt's first image "
            "(tests/vision/test_llava_next_images.py), where the engine gives each image token "
            "one row; text is served",
        ),
    ),
    # InternVL 2.5 and 3: dynamic tiles and a thumbnail, pixel-shuffled; their processor
    # expands ``<image>``
    **dict.fromkeys(
        ("internvl_chat", "internvl"),
        Family(library=Library.MLX_VLM, vision=Vision(placeholder="<image>")),
    ),
    # GOT-OCR 2 tiles and a global one, pixel-shuffled; Cohere 2's sliding-window layers
    "aya_vision": Family(library=Library.MLX_VLM, vision=Vision()),
    "gemma3": Family(vision=Vision()),
    "gemma4": Family(
        vision=Vision(
            features=ImageFeatures.ENCODE_IMAGE,
            boi_placeholder=False,
            bidirectional_blocks=True,
            scaled_rows=True,
        )
    ),
    **dict.fromkeys(
        ("qwen2_vl", "qwen2_5_vl"),
        Family(vision=Vision(ImageFeatures.TOWER, mrope=MRoPELayout(interleaved=False))),
    ),
    # a MoE checkpoint's images are its dense one's: the same tower, experts in the text model
    **dict.fromkeys(
        ("qwen3_vl", "qwen3_vl_moe"),
        Family(
            vision=Vision(ImageFeatures.TOWER, mrope=MRoPELayout(interleaved=True), deepstack=True)
        ),
    ),
    **dict.fromkeys(
        ("qwen3_5", "qwen3_5_moe"),
        Family(
            vision=Vision(
                ImageFeatures.TOWER, mrope=MRoPELayout(interleaved=True, rope_parameters=True)
            ),
            mtp=MtpNaming.QWEN,
        ),
    ),
    "qwen3_next": Family(mtp=MtpNaming.QWEN),
    # the MTP layer of an MLA family (deepseek_v3, glm4_moe_lite) pages its latent rows; a sparse
    # one's (deepseek_v32, glm_moe_dsa) its indexer's keys beside them (speculative/mtp_runner.py)
    "deepseek_v3": Family(mtp=MtpNaming.NEXTN),
    "deepseek_v32": Family(mtp=MtpNaming.NEXTN),
    "glm_moe_dsa": Family(mtp=MtpNaming.NEXTN),
    "glm4_moe": Family(mtp=MtpNaming.NEXTN),
    "glm4_moe_lite": Family(mtp=MtpNaming.NEXTN),
    # its MTP blocks' attention pages in the request's blocks, its MoE blocks keep nothing
    "nemotron_h": Family(mtp=MtpNaming.NEMOTRON),
}
_PLAIN = Family()


def family(model_type: str) -> Family:
    """The family record of ``model_type`` (one without an entry: served as mlx-lm runs it)."""
    return FAMILIES.get(model_type, _PLAIN)


def library_type(model_type: str) -> str:
    """The table's key for a checkpoint's ``model_type``: itself, or the mlx-vlm family it is
    another name of (mlx-vlm's ``MODEL_REMAPPING``, for the names the table does not hold:
    real checkpoints say ``phi4-siglip``, ``cohere2_vision`` (Command A Vision, run by Aya
    Vision's code), ``lfm2-vl``, ``llava-qwen2``, which mlx-vlm loads under its module's name
    and the table would otherwise take for mlx-lm's). Called where a checkpoint is loaded; it
    imports mlx-vlm, so ``family`` itself does not."""
    if model_type in FAMILIES:
        return model_type
    try:
        from mlx_vlm.utils import MODEL_REMAPPING
    except ImportError:
        return model_type
    alias = str(MODEL_REMAPPING.get(model_type, ""))
    return alias if family(alias).library is Library.MLX_VLM else model_type


def checkpoint_type(model_type: str, architectures: Sequence[str] | str | None = None) -> str:
    """The table's key for a checkpoint's config: its ``model_type``, or the mlx-lm module its
    architecture selects where mlx-lm decides on both (``MODEL_ARCHITECTURE_REMAPPING``: Ling
    2.5's checkpoints say ``bailing_hybrid`` with ``BailingMoeV3ForCausalLM``, which mlx-lm runs
    as ``bailing_moe_v3``)."""
    from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING

    names = (architectures,) if isinstance(architectures, str) else architectures or ()
    for name in names:
        remapped = MODEL_ARCHITECTURE_REMAPPING.get((model_type, name))
        if remapped is not None:
            return str(remapped)
    return library_type(model_type)


def remapped_types(model_type: str) -> set[str]:
    """The mlx-lm modules some architecture of ``model_type`` is run by instead of its own."""
    from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING

    return {str(m) for (t, _), m in MODEL_ARCHITECTURE_REMAPPING.items() if t == model_type}


def unsupported_reason(
    model_type: str, architectures: Sequence[str] | str | None = None
) -> str | None:
    """Why an architecture is refused before even loading it, or None if it may be served
    (``architectures``: the config's, for ``checkpoint_type``)."""
    return family(checkpoint_type(model_type, architectures)).refusal


def vision_families() -> tuple[str, ...]:
    """The model types whose images the engine runs, in the table's order."""
    return tuple(name for name, f in FAMILIES.items() if f.vision is not None)
