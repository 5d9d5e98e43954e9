"""The multi-token-prediction (MTP) layer Qwen3.5, Qwen3-Next, DeepSeek V3, GLM-4.5 and Nemotron-H
checkpoints ship, as a module of our own (mlx-lm has none: its ``sanitize`` drops the weights).

It predicts the token after next from the target's last hidden state: the embedding of the next
token and that hidden state, each RMS-normed, are concatenated (embedding first) and projected
back to the hidden size (Qwen's ``fc``, DeepSeek's ``eh_proj`` over ``enorm`` and ``hnorm``),
run through one decoder layer of the target's own class (full attention: GQA, or MLA in
DeepSeek V3 and GLM-4.7-Flash; a sparse-MoE layer in the MoE variants; Nemotron-H's blocks of
the target's class, an attention block then a MoE block, each with its residual; Hunyuan V4's
the layer mlx-vlm's drafter builds, without the target's hyper-connections), and normed
(DeepSeek's ``shared_head.norm``, Nemotron-H's ``final_layernorm``); the target's LM head (and
its embedding) are shared unless a Qwen checkpoint has its own (DeepSeek's and GLM's copies are
the target's: mtp_weights.py). The hidden state it reads is the target's output, after the
target's final norm, as vLLM's ``qwen3_next_mtp`` and ``deepseek_mtp`` feed it (vLLM's DeepSeek
layer also zeroes the embedding at position 0; this one does not, which changes a draft, never
an output), and mlx-vlm's ``nemotron_h_mtp`` too; Qwen4-exp's (``StreamsMtpHead``) and DeepSeek
V4's (``DeepseekV4MtpHead``) read the target's hyper-connection streams instead. The MTP
layer's own output is what its next draft reads (docs/speculative.md, "MTP").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.model.families import MtpNaming
from macbatch.engine.speculative.mtp_fp8 import mtp_quantization
from macbatch.engine.speculative.mtp_weights import (
    MtpNames,
    mtp_names,
    mtp_refusal,
    read_config,
    read_mtp_weights,
)

log = logging.getLogger(__name__)


class MtpHead(nn.Module):
    """The MTP layer: ``fc`` over [norm(embedding), norm(hidden)], the decoder layer (Nemotron-H:
    its blocks, in order), the norm. ``embed_tokens`` / ``lm_head``: the checkpoint's own, when
    it has them (else the target's). ``paged``: which layers attend over pages (Nemotron-H's MoE
    blocks keep none)."""

    def __init__(
        self,
        layers: list[nn.Module],
        hidden_size: int,
        eps: float,
        paged: Sequence[bool] | None = None,
    ) -> None:
        super().__init__()
        self.pre_fc_norm_embedding: nn.Module = nn.RMSNorm(hidden_size, eps=eps)
        self.pre_fc_norm_hidden: nn.Module = nn.RMSNorm(hidden_size, eps=eps)
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.layers = layers
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self._paged = tuple(paged) if paged is not None else (True,) * len(layers)

    # whether it reads the target's last layer's output (hyper-connection streams) rather than
    # the target's normed output
    reads_streams = False
    # whether its first position's embedding is zero (mlx-vlm's GLM5-next drafter's, as vLLM's
    # DeepSeek layer): that position has no token before it
    zeroes_first_embedding = False

    @property
    def paged(self) -> tuple[bool, ...]:
        return self._paged

    def __call__(
        self,
        embeddings: mx.array,
        hidden: mx.array,
        caches: Sequence[Any],
        tokens: mx.array | None = None,
    ) -> mx.array:
        """The layer's normed output ``[N, 1, H]`` for rows ``[N, 1, H]`` of next-token embeddings
        and the hidden states before them; ``caches``: each layer's (paged) attention cache (None
        for a layer that keeps none); ``tokens``: the next tokens (read by Qwen4-exp's)."""
        both = [self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden)]
        x = self.fc(mx.concatenate(both, axis=-1))
        for layer, cache in zip(self.layers, caches, strict=True):
            x = self.run_layer(layer, x, cache)
        return self.norm(x)

    def run_layer(self, layer: nn.Module, x: mx.array, cache: Any) -> mx.array:
        """One decoder layer over ``x`` (its attention masks itself in the step)."""
        out: mx.array = layer(x, mask=None, cache=cache)
        return out

    def readout(self, out: mx.array) -> mx.array:
        """What the LM head reads of the layer's output ``out`` (the output itself)."""
        return out


class StreamsMtpHead(MtpHead):
    """Qwen4-exp's MTP layer (mlx-vlm's ``qwen4_exp_mtp`` modules, built from the target's config):
    it reads the target's hyper-connection streams before their final mixer (``[N, 1, hc*H]``,
    its last decoder layer's output), normed across all streams; the next token's normed
    embedding (``fc_embedding``) is added to each stream's own projection (``fc_hidden``); one
    Qwen Sparse Attention decoder layer of the target's class runs over the streams, and its own
    mixer (``hyper_connection_mixer``) gives what the LM head reads, while its next draft reads
    the unmixed streams."""

    reads_streams = True

    def __init__(self, args: Any) -> None:
        from mlx_vlm.speculative.drafters.qwen4_exp_mtp import ModelConfig, Qwen4ExpMTPDraftModel

        nn.Module.__init__(self)
        built = Qwen4ExpMTPDraftModel(ModelConfig(text_config=args))
        self.streams, self.width = int(args.hc_count), int(args.hidden_size)
        self.pre_fc_norm_embedding = built.pre_fc_norm_embedding
        self.pre_fc_norm_hidden = built.pre_fc_norm_hidden
        self.fc_embedding = built.fc_embedding
        self.fc_hidden = built.fc_hidden
        layers: list[nn.Module] = [*built.layers]
        self.layers = layers
        self.hyper_connection_mixer = built.hyper_connection_mixer
        self._paged = (True,)

    def __call__(
        self,
        embeddings: mx.array,
        hidden: mx.array,
        caches: Sequence[Any],
        tokens: mx.array | None = None,
    ) -> mx.array:
        """The layer's streams ``[N, 1, hc*H]`` for next-token embeddings ``[N, 1, H]`` and the
        streams before them."""
        split = self.pre_fc_norm_hidden(hidden).reshape(*hidden.shape[:-1], self.streams, -1)
        embedded = self.fc_embedding(self.pre_fc_norm_embedding(embeddings))
        x = (embedded[..., None, :] + self.fc_hidden(split)).reshape(hidden.shape)
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, tokens, mask=None, cache=cache, position_ids=None)
        return x

    def readout(self, out: mx.array) -> mx.array:
        """The streams mixed into one row ``[N, 1, H]``, as the LM head reads them."""
        mixed: mx.array = self.hyper_connection_mixer(out)
        return mixed


class Glm5NextMtpHead(MtpHead):
    """GLM5-next's MTP layer: DeepSeek's ``eh_proj`` over ``enorm`` and ``hnorm`` and its
    ``shared_head.norm`` around the block mlx-vlm's ``glm5_next_mtp`` drafter builds at index
    ``num_hidden_layers`` (sparse NoPE MLA with its own pooling indexer, a MoE MLP, one residual
    stream where the target's layers keep four). Its first position's embedding is zero, as the
    drafter's is."""

    zeroes_first_embedding = True

    def __init__(self, args: Any) -> None:
        from mlx_vlm.speculative.drafters.glm5_next_mtp import Glm5NextMTPDraftModel, ModelConfig

        block = Glm5NextMTPDraftModel(ModelConfig(text_config=args)).mtp_block
        super().__init__([block], int(args.hidden_size), float(args.rms_norm_eps))

    def run_layer(self, layer: nn.Module, x: mx.array, cache: Any) -> mx.array:
        """The block, which takes no mask (its attention's selection masks each row)."""
        out: mx.array = layer(x, cache=cache)
        return out


class DeepseekV4MtpHead(MtpHead):
    """DeepSeek V4's MTP layer (mlx-vlm's ``deepseek_v4_mtp`` modules, built from the target's
    config): it reads the target's last decoder layer's output, its ``hc_mult`` residual streams
    before the hyper-connection head; each stream's normed projection (``h_proj`` over
    ``hnorm``) gets the next token's (``e_proj`` over ``enorm``) added; one block of the target's
    class runs over the streams (an uncompressed window attention with sinks, its own
    hyper-connections, a MoE routed by score); its own ``hc_head`` and ``norm`` give what the LM
    head reads, while its next draft reads the unmixed streams."""

    reads_streams = True

    def __init__(self, args: Any) -> None:
        from mlx_vlm.speculative.drafters.deepseek_v4_mtp import (
            DeepseekV4MTPDraftModel,
            ModelConfig,
        )

        nn.Module.__init__(self)
        built = DeepseekV4MTPDraftModel(ModelConfig(text_config=args))
        self.streams, self.width = int(args.hc_mult), int(args.hidden_size)
        self.enorm, self.hnorm = built.enorm, built.hnorm
        self.e_proj, self.h_proj = built.e_proj, built.h_proj
        layers: list[nn.Module] = [built.decoder]
        self.layers = layers
        self.hc_head, self.norm = built.hc_head, built.norm
        self._paged = (True,)

    def __call__(
        self,
        embeddings: mx.array,
        hidden: mx.array,
        caches: Sequence[Any],
        tokens: mx.array | None = None,
    ) -> mx.array:
        """The block's streams ``[N, 1, hc, H]`` for next-token embeddings ``[N, 1, H]`` and the
        streams before them (``[N, 1, hc, H]``)."""
        streams = hidden.reshape(*hidden.shape[:2], self.streams, self.width)
        x = self.h_proj(self.hnorm(streams)) + self.e_proj(self.enorm(embeddings))[:, :, None]
        block = self.layers[0]
        out: mx.array = block(x, None, caches[0], tokens)
        return out

    def readout(self, out: mx.array) -> mx.array:
        """The streams collapsed by the layer's head and normed, as the LM head reads them."""
        read: mx.array = self.norm(self.hc_head(out))
        return read


# the block types a Nemotron-H MTP module may have: attention (paged), MoE and MLP (no cache)
_NEMOTRON_BLOCKS = {"*": True, "E": False, "-": False}


def new_mtp_head(
    text: nn.Module, naming: MtpNaming = MtpNaming.QWEN, pattern: Sequence[str] = ()
) -> MtpHead:
    """An MTP layer of the text model ``text`` with freshly initialised weights: one decoder
    layer of its class, built at the index ``naming``'s checkpoints store it at (Qwen: a
    full-attention one); Nemotron-H's blocks of the ``pattern`` its config gives."""
    args = text.args
    names = MtpNames(naming, int(args.num_hidden_layers), tuple(pattern))
    eps = float(getattr(args, "rms_norm_eps", None) or args.layer_norm_epsilon)
    if names.naming is MtpNaming.NEMOTRON:
        refused = sorted(set(names.pattern) - set(_NEMOTRON_BLOCKS))
        if not names.pattern or refused:
            raise ValueError(
                f"speculative 'mtp': the config's MTP block pattern {''.join(names.pattern)!r} "
                "is not one of attention ('*'), MoE ('E') and MLP ('-') blocks"
            )
        block = type(text.layers[0])
        layers = [block(args, kind) for kind in names.pattern]
        return MtpHead(layers, args.hidden_size, eps, [_NEMOTRON_BLOCKS[k] for k in names.pattern])
    if names.naming is MtpNaming.HY_V4:
        return MtpHead([_hy_v4_layer(args)], args.hidden_size, eps)
    if names.naming is MtpNaming.QWEN4:
        return StreamsMtpHead(args)
    if names.naming is MtpNaming.GLM5_NEXT:
        return Glm5NextMtpHead(args)
    if names.naming is MtpNaming.DEEPSEEK_V4:
        return DeepseekV4MtpHead(args)
    attention = next(layer for layer in text.layers if not getattr(layer, "is_linear", False))
    index = names.layer_index(args)
    return MtpHead([type(attention)(args, index)], args.hidden_size, eps)


def _hy_v4_layer(args: Any) -> nn.Module:
    """Hunyuan V4's MTP decoder layer as mlx-vlm's own drafter builds it from the target's config
    (its ``hy_v4_mtp``: one residual stream where the target's layers keep four, an indexer of
    its own, a MoE MLP)."""
    from mlx_vlm.speculative.drafters.hy_v4_mtp import HyV4MTPDraftModel, ModelConfig

    layer: nn.Module = HyV4MTPDraftModel(ModelConfig(text_config=args)).decoder
    return layer


def build_mtp_head(
    text: nn.Module,
    weights: dict[str, mx.array],
    quantization: dict[str, Any] | None,
    names: MtpNames,
) -> MtpHead:
    """The MTP layer of the text model ``text`` (mlx-lm's, its ``args`` the text config) with
    ``weights`` (``read_mtp_weights``'s names, the checkpoint's ``names``) and the checkpoint's
    ``quantization`` (its config's; None: float). Only the first MTP layer is kept (the
    families here ship one; Nemotron-H's blocks are all of it)."""
    from mlx_lm.utils import infer_quant_config

    args = text.args
    head = new_mtp_head(text, names.naming, names.pattern)
    own = tuple(f"layers.{i}." for i in range(len(head.layers)))  # a later MTP layer's: dropped
    weights = {k: v for k, v in weights.items() if not k.startswith("layers.") or k.startswith(own)}
    if "embed_tokens.weight" in weights:
        head.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
    if "lm_head.weight" in weights:
        head.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
    if quantization is not None:
        overrides = {
            name.removesuffix(".weight"): v
            for k, v in quantization.items()
            if isinstance(v, dict) and (name := names.name(k + ".weight")) is not None
        }

        def quantized(path: str, module: nn.Module) -> bool | dict[str, Any]:
            if path in overrides:
                return dict(overrides[path])
            if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
                return False
            return dict(infer_quant_config(path, module, weights))

        nn.quantize(
            head,
            group_size=quantization["group_size"],
            bits=quantization["bits"],
            mode=quantization.get("mode", "affine"),
            class_predicate=quantized,
        )
    try:
        head.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ValueError(f"the checkpoint's MTP weights do not fit its MTP layer: {exc}") from exc
    mx.eval(head.parameters())
    return head


def mtp_head_for(
    name: str, model: nn.Module, required: bool, distributed: bool = False
) -> MtpHead | None:
    """The MTP layer of the checkpoint ``name`` (as the loader resolves it) beside its loaded
    ``model``; when it has none, ``ValueError`` saying why if ``required`` (``--speculative
    mtp``), else None (``auto``: no speculation), with why logged. ``distributed``: ``model`` is
    rank 0's of a launched group, not split yet (docs/speculative.md, "Under mlx.launch")."""
    from mlx_lm.utils import hf_repo_to_path

    from macbatch.engine.loader import resolve_model_path
    from macbatch.engine.model.adapter import model_type_of

    where = resolve_model_path(name)
    try:
        path = hf_repo_to_path(where) if isinstance(where, str) else where
        head = load_mtp_head(path, model, model_type_of(model))
        if distributed:
            keep_whole_lm_head(head, model)
        return head
    except Exception as exc:  # unreadable files come in many types; "auto" loads without heads
        if required:
            if isinstance(exc, ValueError):
                raise
            raise ValueError(f"speculative 'mtp': cannot read the MTP weights: {exc}") from exc
        log.log(logging.INFO if isinstance(exc, ValueError) else logging.WARNING, "no MTP: %s", exc)
        return None


def load_mtp_head(path: Path, model: nn.Module, model_type: str) -> MtpHead:
    """The MTP layer of the checkpoint at ``path`` (a local directory) beside its loaded
    ``model``; ``ValueError`` saying why there is none."""
    from macbatch.engine.model.adapter import text_model

    reason = mtp_refusal(model_type)
    if reason:
        raise ValueError(f"speculative 'mtp': {reason}")
    text = text_model(model)
    weights = read_mtp_weights(path, text)
    if not any(k.startswith("layers.") for k in weights):
        raise ValueError(
            f"speculative 'mtp': the checkpoint at {path} has no MTP weights ('mtp.*', or "
            "DeepSeek/GLM's layer num_hidden_layers); it was converted without them (mlx-lm's "
            "convert drops them): use a checkpoint that keeps them, or --speculative ngram"
        )
    config = read_config(path)
    return build_mtp_head(text, weights, mtp_quantization(config), mtp_names(config))


def keep_whole_lm_head(head: MtpHead, model: nn.Module) -> None:
    """Give ``head`` the target's LM head as it is before ``model`` (rank 0's) is split: mlx-lm's
    ``shard`` splits an untied head by vocabulary and gathers its logits (a collective), which
    rank 0's MTP drafts, run on rank 0 alone, must not make. A tied head (the embedding, never
    split) or the checkpoint's own MTP head needs nothing."""
    from macbatch.engine.model.adapter import text_model

    whole = getattr(text_model(model), "lm_head", None)
    if whole is not None and getattr(head, "lm_head", None) is None:
        head.lm_head = whole  # the old module: ``shard`` puts a split copy in the model's place
        mx.eval(whole.parameters())
