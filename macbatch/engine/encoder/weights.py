"""Hugging Face encoder weights (``BertModel`` / ``XLMRobertaModel`` names, with or without the
``bert.`` / ``roberta.`` prefix a task checkpoint puts them under) -> ``bert.Encoder``'s, and
the renaming by table the other families' modules map theirs with."""

from __future__ import annotations

import re
from pathlib import Path

import mlx.core as mx

from macbatch.engine.encoder.config import EncoderConfig
from macbatch.engine.model.families import EncoderNaming

# HF name (prefix stripped) -> ours; the first pattern that matches wins
_BERT = (
    (r"^embeddings\.word_embeddings\.", "embeddings.word."),
    (r"^embeddings\.position_embeddings\.", "embeddings.position."),
    (r"^embeddings\.token_type_embeddings\.", "embeddings.token_type."),
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", r"layers.\1.\2."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attn_out."),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attn_norm."),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.up."),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.down."),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.out_norm."),
    (r"^embeddings_project\.", "embeddings.project."),  # ELECTRA's
    (r"^encoder\.relative_attention_bias\.", "relative_bias."),  # MPNet's
)
# DistilBERT's names -> BERT's (it is BERT's block without token types), then BERT's table
_DISTILBERT_AS_BERT = {
    "transformer.layer.": "encoder.layer.",
    ".attention.q_lin.": ".attention.self.query.",
    ".attention.k_lin.": ".attention.self.key.",
    ".attention.v_lin.": ".attention.self.value.",
    ".attention.out_lin.": ".attention.output.dense.",
    ".sa_layer_norm.": ".attention.output.LayerNorm.",
    ".ffn.lin1.": ".intermediate.dense.",
    ".ffn.lin2.": ".output.dense.",
    ".output_layer_norm.": ".output.LayerNorm.",
}
# MPNet's names -> BERT's (BERT's block with relative-position biases, no token types)
_MPNET_AS_BERT = {
    ".attention.attn.q.": ".attention.self.query.",
    ".attention.attn.k.": ".attention.self.key.",
    ".attention.attn.v.": ".attention.self.value.",
    ".attention.attn.o.": ".attention.output.dense.",
    ".attention.LayerNorm.": ".attention.output.LayerNorm.",
}
_AS_BERT = {EncoderNaming.DISTILBERT: _DISTILBERT_AS_BERT, EncoderNaming.MPNET: _MPNET_AS_BERT}
# old TensorFlow-converted checkpoints name LayerNorm's parameters gamma and beta
_NORM_PARAMS = {"gamma": "weight", "beta": "bias"}


def read_weights(directory: Path) -> dict[str, mx.array]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory} has no .safetensors weights (PyTorch .bin is not read)")
    weights: dict[str, mx.array] = {}
    for file in files:
        weights.update(mx.load(str(file)))  # type: ignore[arg-type]
    return weights


def encoder_weights(weights: dict[str, mx.array], config: EncoderConfig) -> dict[str, mx.array]:
    """Our names for the weights the encoder holds; the rest (``position_ids``, a masked-LM
    head, a pooler, a classification head: ``classifier.py``'s) are dropped."""
    bert_named = {}
    for name, value in weights.items():
        for theirs, bert in _AS_BERT.get(config.layout.naming, {}).items():
            name = name.replace(theirs, bert)
        head, _, param = name.rpartition(".")
        bert_named[f"{head}.{_NORM_PARAMS.get(param, param)}"] = value
    return renamed(bert_named, config.layout.prefix, _BERT)


def renamed(
    weights: dict[str, mx.array], prefix: str, table: tuple[tuple[str, str], ...]
) -> dict[str, mx.array]:
    """Each weight under the first of ``table``'s (pattern, target) its name (``prefix``
    stripped) matches; a weight no pattern matches (an MLM head, a buffer) is dropped."""
    out = {}
    for name, value in weights.items():
        name = name.removeprefix(prefix)
        for pattern, target in table:
            if re.match(pattern, name):
                out[re.sub(pattern, target, name)] = value
                break
    return out
