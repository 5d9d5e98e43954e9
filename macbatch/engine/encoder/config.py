"""An encoder checkpoint's architecture, read once from its config.json (Hugging Face's field
names, and the names each family's published checkpoints use: DistilBERT's ``dim``, Nomic's
GPT-2-style ``n_embd``, ModernBERT's ``norm_eps``), with the facts each family decides
differently: where positions start, rotary frequencies, local attention, which head scores a
pair."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from macbatch.engine.model.families import ClassifierHead, EncoderLayout, EncoderNaming, family


@dataclass(frozen=True)
class Disentangled:
    """DeBERTa-v2's relative attention (``deberta.py``)."""

    span: int  # the relative embeddings hold 2 * span rows
    buckets: int  # log buckets of the relative positions (0: none, clipped to the span)
    max_relative: int
    c2p: bool  # content-to-position term
    p2c: bool  # position-to-content term
    share_keys: bool  # the layer's own query / key project the relative embeddings
    norm: bool  # a LayerNorm over the relative embeddings
    position_biased_input: bool  # absolute position embeddings added to the tokens too


@dataclass(frozen=True)
class EncoderConfig:
    model_type: str
    layout: EncoderLayout
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int
    # ``*ForSequenceClassification``: the checkpoint scores a (query, document) pair with
    # ``head`` (None: it embeds)
    head: ClassifierHead | None
    num_labels: int
    # rotary families (``rotary.py``; None: learned absolute positions, BERT's)
    rope_theta: float | None = None
    rope_ntk_factor: float = 1.0  # gte's fixed NTK scaling (``rope_scaling`` type ntk)
    # ModernBERT's local layers: their rotary base and how far each row sees (None: global)
    local_rope_theta: float | None = None
    windows: tuple[int | None, ...] = ()
    attention_bias: bool = True
    mlp_in_bias: bool = True  # the gated MLP's up / gate projections
    mlp_out_bias: bool = True
    norm_bias: bool = True
    embedding_size: int | None = None  # ELECTRA's, below the hidden size (None: the same)
    relative_buckets: int = 0  # MPNet's relative-position buckets (0: none)
    disentangled: Disentangled | None = None  # DeBERTa-v2's

    @property
    def classifier(self) -> bool:
        return self.head is not None

    @property
    def position_offset(self) -> int:
        """The position id of a sequence's first token."""
        return self.pad_token_id + 1 if self.layout.offset_positions else 0

    @property
    def max_tokens(self) -> int:
        """The longest sequence its position table holds."""
        return self.max_positions - self.position_offset

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> EncoderConfig:
        model_type = str(config["model_type"])
        layout = family(model_type).encoder
        if layout is None:
            raise ValueError(f"model type '{model_type}' is not an encoder macbatch runs")
        architectures = config.get("architectures") or []
        classifier = any(str(a).endswith("ForSequenceClassification") for a in architectures)
        labels = config.get("id2label")

        def field(*names: str, default: Any = None) -> Any:
            """The first of ``names`` the config has (BERT's name first, then the families')."""
            return next((config[n] for n in names if config.get(n) is not None), default)

        num_layers = int(field("num_hidden_layers", "n_layers", "n_layer"))
        return cls(
            model_type=model_type,
            layout=layout,
            vocab_size=int(config["vocab_size"]),
            hidden_size=int(field("hidden_size", "dim", "n_embd")),
            num_layers=num_layers,
            num_heads=int(field("num_attention_heads", "n_heads", "n_head")),
            intermediate_size=int(field("intermediate_size", "hidden_dim", "n_inner")),
            hidden_act=str(field(*_ACTIVATION_FIELDS, default="gelu")),
            max_positions=int(field("max_position_embeddings", "n_positions", default=512)),
            # DistilBERT and ModernBERT have no token types
            type_vocab_size=int(
                config.get("type_vocab_size", 2 if layout.naming is EncoderNaming.BERT else 0)
            ),
            layer_norm_eps=float(
                field("layer_norm_eps", "norm_eps", "layer_norm_epsilon", default=1e-12)
            ),
            pad_token_id=int(config.get("pad_token_id") or 0),
            head=_head(layout.head, config) if classifier else None,
            num_labels=int(config.get("num_labels") or (len(labels) if labels else 1)),
            **_family_fields(layout.naming, config, num_layers),
        )


# BERT's, DistilBERT's, ModernBERT's and Nomic's names for the hidden activation
_ACTIVATION_FIELDS = ("hidden_act", "activation", "hidden_activation", "activation_function")


def _head(head: ClassifierHead, config: Mapping[str, Any]) -> ClassifierHead:
    """The family's head with what its config says of it: DeBERTa's ``pooler_hidden_act``,
    ModernBERT's ``classifier_activation``, ``classifier_bias`` and ``classifier_pooling``."""
    pooling = str(config.get("classifier_pooling") or head.pooling)
    if pooling not in ("cls", "mean"):
        raise ValueError(f"a classifier_pooling of {pooling!r} is not built (cls, mean)")
    activation = config.get("pooler_hidden_act") or config.get("classifier_activation")
    return replace(
        head,
        activation=str(activation or head.activation),
        dense_bias=bool(config.get("classifier_bias", head.dense_bias)),
        pooling=pooling,
    )


def _family_fields(naming: EncoderNaming, config: Mapping[str, Any], layers: int) -> dict:
    """The rotary, local-attention and bias fields of the families that have them, each read
    under its published checkpoints' names; a variant the encoder does not run is refused."""
    if naming is EncoderNaming.GTE:
        _refuse_variants(config, _GTE_BUILT)
        return {"rope_theta": float(config.get("rope_theta") or 10000.0),
                "rope_ntk_factor": _gte_ntk_factor(config), "mlp_in_bias": False,
                "attention_bias": True, "mlp_out_bias": True}  # fmt: skip
    if naming is EncoderNaming.NOMIC:
        _refuse_variants(config, _NOMIC_BUILT)
        return {
            "rope_theta": float(config.get("rotary_emb_base") or 10000.0),
            "attention_bias": bool(config.get("qkv_proj_bias", False)),
            "mlp_in_bias": bool(config.get("mlp_fc1_bias", False)),
            "mlp_out_bias": bool(config.get("mlp_fc2_bias", False)),
        }
    if naming is EncoderNaming.MPNET:
        _refuse_variants(config, _MPNET_BUILT)
        return {"relative_buckets": 32}
    if naming is EncoderNaming.DEBERTA:
        return _deberta_fields(config)
    if naming is EncoderNaming.ELECTRA:
        return {"embedding_size": int(config.get("embedding_size") or config["hidden_size"])}
    if naming is EncoderNaming.MODERNBERT:
        return _modernbert_fields(config, layers)
    return {}


def _modernbert_fields(config: Mapping[str, Any], layers: int) -> dict:
    """Its layer kinds and rotary bases as the published configs give them
    (``global_attn_every_n_layers``, ``global_rope_theta``, ``local_rope_theta``, transformers'
    defaults 3, 160,000, 10,000; a null local base is the global one, as ModernBERT's own code
    reads it) or as transformers 5 writes them (``layer_types``, ``rope_parameters``)."""
    every = int(config.get("global_attn_every_n_layers") or 3)
    kinds = config.get("layer_types") or [
        "full_attention" if n % every == 0 else "sliding_attention" for n in range(layers)
    ]
    if len(kinds) != layers:
        raise ValueError(f"layer_types names {len(kinds)} layers of {layers}")
    rope = config.get("rope_parameters") or {}
    for kind, parameters in rope.items():
        if parameters.get("rope_type", "default") != "default":
            raise ValueError(f"a {kind} rope_type {parameters['rope_type']!r} is not built")
    global_theta = float(
        rope.get("full_attention", {}).get("rope_theta")
        or config.get("global_rope_theta")
        or 160000.0
    )
    local_theta = rope.get("sliding_attention", {}).get("rope_theta")
    local_theta = local_theta or config.get("local_rope_theta", 10000.0) or global_theta
    half = int(config.get("local_attention") or 128) // 2  # sees keys within half of it
    return {
        "rope_theta": global_theta,
        "local_rope_theta": float(local_theta),
        "windows": tuple(None if kind == "full_attention" else half for kind in kinds),
        "attention_bias": bool(config.get("attention_bias", False)),
        "mlp_in_bias": bool(config.get("mlp_bias", False)),
        "mlp_out_bias": bool(config.get("mlp_bias", False)),
        "norm_bias": bool(config.get("norm_bias", False)),
    }


def _deberta_fields(config: Mapping[str, Any]) -> dict:
    """DeBERTa-v2's switches under its config's names (``pos_att_type`` a list or a
    ``"p2c|c2p"`` string); its convolution layer (deberta-v2-xlarge's) is not built."""
    if not config.get("relative_attention", False):
        raise ValueError("a deberta-v2 checkpoint without relative_attention is not built")
    if int(config.get("conv_kernel_size") or 0) > 0:
        raise ValueError("a deberta-v2 checkpoint with conv_kernel_size > 0 is not built")
    terms = config.get("pos_att_type") or []
    terms = terms.lower().split("|") if isinstance(terms, str) else [str(t).lower() for t in terms]
    buckets = int(config.get("position_buckets") or -1)
    max_relative = int(config.get("max_relative_positions") or -1)
    if max_relative < 1:
        max_relative = int(config.get("max_position_embeddings", 512))
    norms = str(config.get("norm_rel_ebd") or "none").lower().split("|")
    disentangled = Disentangled(
        span=buckets if buckets > 0 else max_relative,
        buckets=max(buckets, 0),
        max_relative=max_relative,
        c2p="c2p" in [t.strip() for t in terms],
        p2c="p2c" in [t.strip() for t in terms],
        share_keys=bool(config.get("share_att_key", False)),
        norm="layer_norm" in [n.strip() for n in norms],
        position_biased_input=bool(config.get("position_biased_input", True)),
    )
    embedding = config.get("embedding_size")
    return {"disentangled": disentangled, "embedding_size": int(embedding) if embedding else None}


def _gte_ntk_factor(config: Mapping[str, Any]) -> float:
    scaling = config.get("rope_scaling")
    if not scaling:
        return 1.0
    kind = scaling.get("type") or scaling.get("rope_type")
    if kind != "ntk" or scaling.get("mixed_b") is not None:
        raise ValueError(f"gte rope_scaling {dict(scaling)} is not one macbatch runs (fixed ntk)")
    return float(scaling["factor"])


# the switches of gte's and Nomic BERT's configs, at the value their embedding checkpoints
# have: another value is a layout the encoder does not run
_GTE_BUILT = {"position_embedding_type": "rope", "layer_norm_type": "layer_norm",
              "logn_attention_scale": False, "pack_qkv": True}  # fmt: skip
# MPNet computes 32 buckets whatever its config says: a table of another size does not fit
_MPNET_BUILT = {"relative_attention_num_buckets": 32}
_NOMIC_BUILT = {"rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "prenorm": False,
                "rotary_scaling_factor": None, "use_rms_norm": False, "moe_every_n_layers": 0,
                "parallel_block": False, "causal": False}  # fmt: skip


def _refuse_variants(config: Mapping[str, Any], built: Mapping[str, Any]) -> None:
    for name, value in built.items():
        if config.get(name) not in (None, value):
            raise ValueError(
                f"a {config['model_type']} checkpoint with {name}={config[name]!r} is not built"
            )
