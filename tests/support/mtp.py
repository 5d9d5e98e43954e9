"""MTP layers for the tiny hybrid models: random ones, ones that predict the target's next token,
and checkpoints that keep them (Hugging Face layout, and mlx-community's converted and quantized
layout), written here by hand as the real ones store them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import quantize_model

from macbatch.engine import Engine, EngineConfig, SamplingParams
from macbatch.engine.model.adapter import model_type_of, text_model
from macbatch.engine.model.families import MtpNaming, family
from macbatch.engine.speculative.mtp_model import MtpHead, new_mtp_head
from tests.support.mtp_fp8 import Encoding, mark_e4m3
from tests.support.tiny import build_model, save_model

# the three families with MTP layers, as tiny configs (qwen3_5_moe: qwen3_5's with experts)
MTP_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_5": ("qwen3_5", {}),
    "qwen3_5_moe": (
        "qwen3_5",
        dict(
            model_type="qwen3_5_moe",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
        ),
    ),
    "qwen3_next": ("qwen3_next", {}),
}
_GLM4_MOE = dict(
    model_type="glm4_moe",
    num_hidden_layers=2,
    head_dim=16,
    moe_intermediate_size=32,
    norm_topk_prob=True,
    n_group=1,
    topk_group=1,
    n_shared_experts=1,
    n_routed_experts=4,
    routed_scaling_factor=1.5,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    use_qk_norm=True,
    tie_word_embeddings=False,
    attention_bias=True,
    partial_rotary_factor=0.5,
    rope_scaling=None,
)
# the families whose MTP layer is the checkpoint's decoder layer num_hidden_layers (DeepSeek's
# naming): two MLA families (tiny.py's configs) and GLM-4.5's GQA one (qwen3's sizes)
NEXTN_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "deepseek_v3": ("deepseek_v3", {}),
    "glm4_moe": ("qwen3", _GLM4_MOE),
    "glm4_moe_lite": ("glm4_moe_lite", {}),
    # DeepSeek Sparse Attention: the MTP layer's attention has a lightning indexer too
    "deepseek_v32": ("deepseek_v32", {}),
    "glm_moe_dsa": ("glm_moe_dsa", {}),
}
# Nemotron-H with MoE blocks (Nemotron 3's), its MTP module an attention then a MoE block
NEMOTRON_PATTERN = ("*", "E")
NEMOTRON_H = dict(
    hybrid_override_pattern=["M", "*", "E", "M", "-"],
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=64,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
)
OTHER_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {"nemotron_h": ("nemotron_h", NEMOTRON_H)}
# five prompts of the MTP tests: repeating ones (drafts hold), a random one, a long run
PROMPTS = [
    [40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 40, 41],
    [90 + (i % 3) for i in range(21)],
    [200, 17, 33, 250, 8, 300, 120, 64, 5],
    [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29],
    [300, 301, 5, 6, 300, 301],
]

MTP_TOKENS = 16
# the MTP tests' small pool and step budget: 16-token chunks, blocks of 8
MTP_SETTINGS: dict[str, Any] = dict(num_blocks=64, block_size=8, max_num_batched_tokens=16)


def mtp_engine(model: nn.Module, tokenizer: Any, head: MtpHead, **config: Any) -> Engine:
    """An engine drafting up to 3 tokens with ``head``, on ``MTP_SETTINGS`` (``config`` over
    them)."""
    settings = dict(MTP_SETTINGS, **config)
    engine_config = EngineConfig(speculative="mtp", num_speculative_tokens=3, **settings)
    return Engine(model, tokenizer, engine_config, draft_model=head)


def greedy_ids(
    engine: Engine, prompts: list[list[int]] = PROMPTS, max_tokens: int = MTP_TOKENS
) -> list[list[int]]:
    """The engine's greedy tokens for ``prompts``, all in flight at once, EOS ignored."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [o.token_ids for o in engine.generate(prompts, params)]


def mixed_batch_outputs(engine: Engine) -> tuple[list[str], list[list[int]]]:
    """The MTP family tests' mixed batch: ``PROMPTS`` and its first two again, every third
    request opting out of speculation, greedy; its prompts and each request's token ids."""
    prompts = PROMPTS + PROMPTS[:2]
    requests = [
        SamplingParams(
            max_tokens=MTP_TOKENS, temperature=0, ignore_eos=True, speculative=i % 3 != 1
        )
        for i in range(len(prompts))
    ]
    return prompts, [o.token_ids for o in engine.generate(prompts, requests)]


def mlx_vlm_greedy_ids(
    model: Any, prompts: list[list[int]] = PROMPTS, max_tokens: int = MTP_TOKENS
) -> list[list[int]]:
    """mlx-vlm's own greedy tokens for each of ``prompts``, one at a time (the oracle)."""
    from tests.support.vlm_oracle import mlx_vlm_text_greedy

    return [[t for t, _ in mlx_vlm_text_greedy(model, p, max_tokens)] for p in prompts]


_NORMS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "model.norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "mtp.norm.weight",
)
# the projections that write a layer's output into the residual stream (Nemotron-H's experts: fc2)
_OUTPUTS = ("o_proj.weight", "out_proj.weight", "down_proj.weight", "fc2.weight")


def mtp_target(arch: str, seed: int = 0) -> nn.Module:
    """The tiny model of one of ``MTP_ARCHS``."""
    base, overrides = {**MTP_ARCHS, **NEXTN_ARCHS, **OTHER_ARCHS}[arch]
    return build_model(base, seed, **overrides)


def random_mtp_head(model: nn.Module, seed: int = 1) -> MtpHead:
    """An MTP layer for ``model`` with random weights (its drafts are mostly rejected), built at
    the index its family's checkpoints store it at."""
    mx.random.seed(seed)
    naming = family(model_type_of(model)).mtp or MtpNaming.QWEN
    pattern = NEMOTRON_PATTERN if naming is MtpNaming.NEMOTRON else ()
    head = new_mtp_head(text_model(model), naming, pattern)
    head.set_dtype(mx.float32)
    mx.eval(head.parameters())
    return head


def scale_outputs(model: nn.Module, scale: float = 0.05) -> nn.Module:
    """Scales every layer's output projections of ``model`` by ``scale`` (in place): its next
    token is then nearly a function of the current token alone. Returns its text model."""
    text = text_model(model)
    scaled = [
        (k, v * scale)
        for k, v in tree_flatten(text.parameters())
        if k.startswith(("model.layers.", "backbone.layers.")) and k.endswith(_OUTPUTS)
    ]
    text.load_weights(scaled, strict=False)
    return text


def predicting_mtp_head(model: nn.Module, scale: float = 0.05) -> MtpHead:
    """Scales every layer's output projections of ``model`` by ``scale`` (in place), so that its
    next token is nearly a function of the current token alone (the residual stream is mostly
    that token's embedding), and returns an MTP layer computing that function of the token it is
    fed: fc passes the normed embedding and drops the hidden state, its decoder layers add
    nothing (all their projections zero), and its last norm is the target's final norm. Most of
    its drafts hold; some do not (the scaled layers still move the target's choice)."""
    text = scale_outputs(model, scale)
    head = random_mtp_head(model)
    hidden = text.args.hidden_size
    for layer in head.layers:
        zeros = [(k, mx.zeros_like(v)) for k, v in tree_flatten(layer.parameters())]
        layer.load_weights([(k, v) for k, v in zeros if "norm" not in k], strict=False)
    eye = mx.concatenate([mx.eye(hidden), mx.zeros((hidden, hidden))], axis=1)
    head.fc.weight = eye
    head.norm.weight = _final_norm(text).weight
    mx.eval(model.parameters(), head.parameters())
    return head


def _final_norm(text: nn.Module) -> nn.Module:
    """The text model's final norm (Nemotron-H's ``backbone.norm_f``)."""
    inner = getattr(text, "model", None) or text.backbone
    return getattr(inner, "norm", None) or inner.norm_f


def save_hf_checkpoint(path: Path, arch: str, head_seed: int | None = 1) -> dict[str, mx.array]:
    """A tiny checkpoint in Hugging Face's layout (names, zero-centred norms, convolution axes,
    unstacked experts) with the MTP layer at ``mtp.*`` (none when ``head_seed`` is None);
    returns the MTP layer's weights as MLX holds them (the loader's expected result)."""
    base, overrides = MTP_ARCHS[arch]
    save_model(path, base, **overrides)
    model = mtp_target(arch)
    weights = dict(tree_flatten(model.parameters()))
    expected: dict[str, mx.array] = {}
    if head_seed is not None:
        expected = dict(tree_flatten(random_mtp_head(model, head_seed).parameters()))
        weights.update({f"mtp.{k}": v for k, v in expected.items()})
        _declare_mtp(path)
    weights = _hf_experts(weights, fused=arch == "qwen3_5_moe")
    hf = {_hf_name(k): _hf_array(k, v) for k, v in weights.items()}
    mx.save_safetensors(str(path / "model.safetensors"), hf)
    return expected


def save_mlx_checkpoint(path: Path, arch: str, bits: int | None = 4) -> dict[str, mx.array]:
    """A tiny checkpoint as mlx-community's converted ones that keep the MTP layer: mlx-lm's
    names and layout (experts stacked), quantized to ``bits`` (group size 32; None: float) by
    mlx-lm's own quantizer, the MTP layer quantized the same and stored under
    ``language_model.mtp.`` (qwen3_5's wrapper) or ``mtp.``; returns the MTP layer's weights as
    stored."""
    base, overrides = MTP_ARCHS[arch]
    save_model(path, base, **overrides)
    model = mtp_target(arch)
    head = random_mtp_head(model)
    config = json.loads((path / "config.json").read_text())
    if bits is not None:
        model, config = quantize_model(model, config, 32, bits, quant_predicate=_predicate(model))
        nn.quantize(head, 32, bits)
    expected = dict(tree_flatten(head.parameters()))
    prefix = "language_model.mtp." if arch.startswith("qwen3_5") else "mtp."
    weights = dict(tree_flatten(model.parameters()))
    weights.update({prefix + k: v for k, v in expected.items()})
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    _declare_mtp(path)
    return expected


def save_predicting_checkpoint(path: Path, arch: str, **overrides: Any) -> Path:
    """A tiny float checkpoint (mlx-lm's names, ``overrides`` on the arch's config) whose MTP
    layer, stored as ``save_mlx_checkpoint`` stores it, predicts well: the target's weights as
    ``predicting_mtp_head`` scales them, and that layer."""
    base, arch_overrides = MTP_ARCHS[arch]
    save_model(path, base, **arch_overrides, **overrides)
    model = build_model(base, 0, **arch_overrides, **overrides)
    head = predicting_mtp_head(model)
    prefix = "language_model.mtp." if arch.startswith("qwen3_5") else "mtp."
    weights = dict(tree_flatten(model.parameters()))
    weights.update({prefix + k: v for k, v in tree_flatten(head.parameters())})
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    _declare_mtp(path)
    return path


def without_mtp(path: Path) -> Path:
    """A copy of the checkpoint at ``path`` (beside it) without its MTP weights, by mlx-lm's own
    rule (every name with ``mtp.`` in it): what mlx-lm's generation loads as the oracle."""
    copy = path.with_name(path.name + "-without-mtp")
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    for file in path.glob("*.safetensors"):
        weights = {k: v for k, v in mx.load(str(file)).items() if "mtp." not in k}
        mx.save_safetensors(str(copy / file.name), weights)
    return copy


def _predicate(model: nn.Module) -> Any:
    predicate = getattr(model, "quant_predicate", None)
    return predicate if callable(predicate) else None


def _declare_mtp(path: Path) -> None:
    config = json.loads((path / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(config, indent=2))


def _hf_name(key: str) -> str:
    if key.startswith("language_model.model."):
        return "model.language_model." + key.removeprefix("language_model.model.")
    return key.removeprefix("language_model.")  # qwen3_5's lm_head, or a top-level name


def _hf_array(key: str, value: mx.array) -> mx.array:
    if "conv1d.weight" in key:
        return value.swapaxes(1, 2)  # MLX's [C, K, 1] -> Hugging Face's [C, 1, K]
    if value.ndim == 1 and key.endswith(_NORMS):
        return value - 1.0  # Qwen3-Next's norms scale by (1 + weight)
    return value


def _hf_experts(weights: dict[str, mx.array], fused: bool) -> dict[str, mx.array]:
    """mlx-lm's stacked experts as Hugging Face stores them: Qwen3.5-MoE's gate and up fused
    (``experts.gate_up_proj``, ``experts.down_proj``), Qwen3-Next's one projection per expert."""
    out = {k: v for k, v in weights.items() if ".switch_mlp." not in k}
    for key, value in weights.items():
        if ".switch_mlp." not in key:
            continue
        mlp, rest = key.split(".switch_mlp.")
        proj = rest.split(".")[0]
        if not fused:  # each expert's own, its format's scales beside it
            out.update({f"{mlp}.experts.{e}.{rest}": value[e] for e in range(len(value))})
        elif proj == "down_proj":
            out[f"{mlp}.experts.down_proj"] = value
        elif proj == "gate_proj":
            up = weights[f"{mlp}.switch_mlp.up_proj.weight"]
            out[f"{mlp}.experts.gate_up_proj"] = mx.concatenate([value, up], axis=-2)
    return out


def _quantizable(_: str, module: nn.Module) -> bool:
    """Quantized in groups of 32: every projection whose input is (an MLA model's 16-wide
    per-head up-projections are not)."""
    return hasattr(module, "to_quantized") and module.weight.shape[-1] % 32 == 0


def quantize_for_mtp(model: nn.Module, head: MtpHead, bits: int) -> None:
    """``model`` and its MTP layer quantized to ``bits`` in groups of 32, in place."""
    nn.quantize(model, 32, bits, class_predicate=_quantizable)
    nn.quantize(head, 32, bits, class_predicate=_quantizable)


def recorded_proposals(engine: Any) -> list[tuple[list[int], list[int]]]:
    """A list that each of ``engine``'s MTP proposals is appended to from now on: the request's
    tokens when it was proposed, and its drafts."""
    assert engine.speculator is not None
    drafter = engine.speculator.drafter
    proposals: list[tuple[list[int], list[int]]] = []
    propose = drafter.propose

    def recording(requests: Any, ks: Any) -> list[list[int]]:
        out = propose(requests, ks)
        proposals.extend((list(r.all_token_ids), d) for r, d in zip(requests, out) if d)
        return out

    drafter.propose = recording
    return proposals


def compiled_counts(engine: Any) -> list[int]:
    """A one-item list holding how many of ``engine``'s steps ran compiled from now on (kept
    current): the compiled decode step's calls that returned outputs."""
    compiled = engine.runner.compiled
    assert compiled is not None  # built: a compilable target, compile_decode_after set
    count = [0]
    forward = compiled.forward

    def counting(batch: Any) -> Any:
        out = forward(batch)
        count[0] += out is not None
        return out

    compiled.forward = counting
    return count


def compiled_steps_at_proposals(engine: Any) -> tuple[list[int], list[int]]:
    """``compiled_counts(engine)``, and a list that gets, for each of the drafter's non-empty
    proposals from now on, how many steps had run compiled before it."""
    compiled = compiled_counts(engine)
    at_proposal: list[int] = []
    drafter = engine.speculator.drafter
    propose = drafter.propose

    def noting(requests: Any, ks: Any) -> list[list[int]]:
        out = propose(requests, ks)
        at_proposal.extend(compiled[0] for d in out if d)
        return out

    drafter.propose = noting
    return compiled, at_proposal


def assert_mtp_weights(engine: Any, expected: dict[str, mx.array]) -> None:
    """``engine`` drafts with an MTP layer holding exactly the weights ``expected``."""
    head = engine.runner.draft.head
    loaded = dict(tree_flatten(head.parameters()))
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        float_valued = mx.issubdtype(value.dtype, mx.floating)
        got, want = (loaded[name], value) if not float_valued else (
            loaded[name].astype(mx.float32), value.astype(mx.float32))  # fmt: skip
        assert got.dtype == want.dtype and mx.array_equal(got, want), name


def unpaged_drafts(model: nn.Module, head: MtpHead, tokens: list[int], k: int) -> list[int]:
    """The MTP layer's ``k`` greedy drafts after ``tokens``, run unpaged: mlx-lm's KV cache and
    its own attention path (an array causal mask, which MLA's score mask takes too) over
    mlx-lm's normed hidden states of ``tokens``, then its own outputs and drafts (each of its
    layers with pages here has a cache of its own, the rest none)."""
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.models.cache import CacheList, KVCache

    text = text_model(model)
    inner = getattr(text, "model", None) or text.backbone
    embed = getattr(inner, "embed_tokens", None) or inner.embeddings
    hidden = inner(mx.array([tokens]))  # the target's normed hidden states, mlx-lm's forward

    def logits(out: mx.array) -> mx.array:
        if getattr(text.args, "tie_word_embeddings", False):
            return embed.as_linear(out)
        return text.lm_head(out)

    def mtp(next_tokens: list[int], states: mx.array, caches: list[Any]) -> mx.array:
        embedded = head.pre_fc_norm_embedding(embed(mx.array([next_tokens])))
        x = head.fc(mx.concatenate([embedded, head.pre_fc_norm_hidden(states)], axis=-1))
        kv = next(c for c in caches if c is not None)
        kv = kv[0] if isinstance(kv, CacheList) else kv
        mask = create_attention_mask(x, kv, return_array=True) if x.shape[1] > 1 else None
        for layer, cache in zip(head.layers, caches):
            x = layer(x, mask=mask, cache=cache)
        return head.norm(x)

    # a sparse MLA layer (DeepSeek V3.2, GLM-5) keeps its indexer's keys in a second cache
    sparse = getattr(getattr(head.layers[0], "self_attn", None), "indexer", None) is not None
    caches = [
        (CacheList(KVCache(), KVCache()) if sparse else KVCache()) if pages else None
        for pages in head.paged
    ]
    out = mtp(tokens[1:], hidden[:, :-1], caches)[:, -1:]
    drafts = [int(mx.argmax(logits(out)[0, -1]))]
    while len(drafts) < k:
        out = mtp([drafts[-1]], out, caches)
        drafts.append(int(mx.argmax(logits(out)[0, -1])))
    return drafts


# MtpHead's parts by DeepSeek's checkpoint names (relative to the MTP layer), as written by hand
_NEXTN_PARTS = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
}


def save_nextn_checkpoint(path: Path, arch: str, bits: int | None) -> dict[str, mx.array]:
    """A tiny checkpoint of one of ``NEXTN_ARCHS`` with its MTP layer at
    ``model.layers.{num_hidden_layers}`` (and ``num_nextn_predict_layers: 1``): float, in
    Hugging Face's layout (unstacked experts, DeepSeek's ``kv_b_proj`` whole, ``embed_tokens``
    and ``shared_head.head`` copies of the target's); ``bits``: mlx-lm's own conversion of the
    target, the MTP layer quantized (groups of 32) in MLX's layout beside it. Returns the MTP
    layer's weights as MLX holds them (the loader's expected result)."""
    model = mtp_target(arch)
    head = _saved_target_and_head(path, NEXTN_ARCHS[arch], model, bits)
    expected = dict(tree_flatten(head.parameters()))
    config = json.loads((path / "config.json").read_text())
    layer = f"model.layers.{config['num_hidden_layers']}."
    written = {_nextn_name(k): v for k, v in expected.items()}
    if bits is None:
        written = _hf_layer(written, model.args)
        text = dict(tree_flatten(model.parameters()))
        written["embed_tokens.weight"] = text["model.embed_tokens.weight"]
        written["shared_head.head.weight"] = text["lm_head.weight"]
    _add_weights(path, {layer + k: v for k, v in written.items()})
    config["num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return expected


def _saved_target_and_head(
    path: Path, arch: tuple[str, dict[str, Any]], model: nn.Module, bits: int | None
) -> MtpHead:
    """Save ``model``'s checkpoint (``arch``: its base architecture and config overrides) in
    ``path``, float or as mlx-lm's own conversion to ``bits``; its random MTP head, quantized
    likewise (groups of 32)."""
    from mlx_lm import convert

    base, overrides = arch
    head = random_mtp_head(model)
    if bits is None:
        save_model(path, base, **overrides)
    else:
        float_path = save_model(path.with_name(path.name + "-float"), base, **overrides)
        convert(str(float_path), str(path), quantize=True, q_bits=bits, q_group_size=32)
        nn.quantize(head, 32, bits, class_predicate=_quantizable)
        mx.eval(head.parameters())
    return head


def _add_weights(path: Path, weights: dict[str, mx.array]) -> None:
    """``weights`` written into the checkpoint's one safetensors file beside its own."""
    file = path / "model.safetensors"
    mx.save_safetensors(str(file), {**dict(mx.load(str(file))), **weights})


def without_nextn_layer(path: Path) -> Path:
    """A copy of the checkpoint at ``path`` (beside it) without the weights of its layers from
    ``num_hidden_layers`` on: what mlx-lm's generation loads as the oracle (mlx-lm's deepseek_v3
    drops only DeepSeek V3's own layer 61)."""
    copy = path.with_name(path.name + "-without-mtp")
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    first = json.loads((path / "config.json").read_text())["num_hidden_layers"]
    for file in path.glob("*.safetensors"):
        weights = {
            k: v
            for k, v in mx.load(str(file)).items()
            if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= first)
        }
        mx.save_safetensors(str(copy / file.name), weights)
    return copy


def _nextn_name(name: str) -> str:
    if name.startswith("layers.0."):
        return name[len("layers.0.") :]
    part, _, rest = name.partition(".")
    return f"{_NEXTN_PARTS[part]}.{rest}"


def _hf_layer(weights: dict[str, mx.array], args: Any) -> dict[str, mx.array]:
    """A float MTP layer in Hugging Face's layout: experts one per projection, and an MLA
    layer's key and value up-projections (mlx-lm's ``embed_q`` ``[H, rank, nope]``,
    ``unembed_out`` ``[H, v, rank]``) back in one ``kv_b_proj`` ``[H * (nope + v), rank]``."""
    out = _hf_experts(weights, fused=False)
    key = out.pop("self_attn.embed_q.weight", None)
    if key is not None:
        value = out.pop("self_attn.unembed_out.weight")
        both = mx.concatenate([key.swapaxes(-1, -2), value], axis=1)
        out["self_attn.kv_b_proj.weight"] = both.reshape(-1, args.kv_lora_rank)
    return out


# MtpHead's parts by Nemotron-H's checkpoint names: on its first block, and (norm) its last
_NEMOTRON_FIRST = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm"}


def save_nemotron_checkpoint(path: Path, bits: int | None) -> dict[str, mx.array]:
    """A tiny Nemotron-H checkpoint with its MTP module under ``mtp.layers.N.`` (its blocks of
    ``NEMOTRON_PATTERN``, the config's ``mtp_hybrid_override_pattern``, and
    ``num_nextn_predict_layers: 1``): float, the module in Hugging Face's layout (experts one
    ``up_proj`` / ``down_proj`` each); ``bits``: mlx-lm's own conversion of the target, the module
    quantized (groups of 32) in MLX's layout beside it. Returns the MTP weights as MLX holds them
    (the loader's expected result)."""
    model = mtp_target("nemotron_h")
    head = _saved_target_and_head(path, OTHER_ARCHS["nemotron_h"], model, bits)
    expected = dict(tree_flatten(head.parameters()))
    written = nemotron_checkpoint_weights(head, hugging_face=bits is None)
    _add_weights(path, {f"mtp.{k}": v for k, v in written.items()})
    config = json.loads((path / "config.json").read_text())
    config["mtp_hybrid_override_pattern"] = "".join(NEMOTRON_PATTERN)
    config["num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return expected


def nemotron_checkpoint_weights(head: MtpHead, hugging_face: bool) -> dict[str, mx.array]:
    """The Nemotron-H MTP module ``head``'s weights by the checkpoint's names after ``mtp.``
    (``layers.0.eh_proj.weight`` ...), its experts unstacked where ``hugging_face``."""
    last = len(head.layers) - 1
    weights = {_nemotron_name(k, last): v for k, v in tree_flatten(head.parameters())}
    return _nemotron_experts(weights) if hugging_face else weights


def _nemotron_name(name: str, last: int) -> str:
    part, _, rest = name.partition(".")
    if part in _NEMOTRON_FIRST:
        return f"layers.0.{_NEMOTRON_FIRST[part]}.{rest}"
    if part == "norm":
        return f"layers.{last}.final_layernorm.{rest}"
    return name


def _nemotron_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Stacked experts (``switch_mlp.fc1`` / ``fc2``) as Hugging Face's Nemotron-H stores them:
    ``experts.E.up_proj`` / ``down_proj``."""
    out = {k: v for k, v in weights.items() if ".switch_mlp." not in k}
    projections = {"fc1": "up_proj", "fc2": "down_proj"}
    for key, value in weights.items():
        if ".switch_mlp." in key:
            mixer, rest = key.split(".switch_mlp.")
            proj = projections[rest.split(".")[0]]
            out.update({f"{mixer}.experts.{e}.{proj}.weight": value[e] for e in range(len(value))})
    return out


# MtpHead's parts by Hunyuan V4's checkpoint names (relative to ``model.mtp_layers.0.``)
_HY_V4_PARTS = {**_NEXTN_PARTS, "norm": "final_layernorm"}


def save_hy_v4_checkpoint(path: Path, encoding: Encoding | None = None) -> dict[str, mx.array]:
    """The tiny Hunyuan V4 (tests/support/tiny_hy_v4.py) under Hugging Face's names (``model.*``,
    ``lm_head``: mlx-vlm's ``sanitize`` of them drops ``model.mtp_layers``) with a random MTP
    layer at ``model.mtp_layers.0.`` (its own weights as mlx-vlm holds them: ``embed_q`` /
    ``unembed_out``, fused ``gate_up_proj`` experts) and ``num_nextn_predict_layers: 1``;
    ``encoding``: the layer stored in an 8-bit format (fused experts then under Hugging Face's
    ``experts.gate_up_proj`` / ``gate_up_proj_scale``). Returns the MTP layer's float weights."""
    from tests.support.tiny_hy_v4 import hy_v4_model, save_hy_v4

    save_hy_v4(path)
    saved = mx.load(str(path / "model.safetensors"))
    weights = {k.removeprefix("language_model."): v for k, v in saved.items()}
    params = dict(tree_flatten(random_mtp_head(hy_v4_model()).parameters()))
    layer: dict[str, mx.array] = {}
    for name, value in (encoding.layer(params).stored if encoding else params).items():
        part, _, rest = name.partition(".")
        layer[rest.removeprefix("0.") if part == "layers" else f"{_HY_V4_PARTS[part]}.{rest}"] = (
            value
        )
    weights.update({f"model.mtp_layers.0.{k}": v for k, v in _hy_v4_fused_experts(layer).items()})
    _save_encoded(path, weights, encoding)
    config = json.loads((path / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    _declare_encoding(path, config, encoding)
    return params


def _hy_v4_fused_experts(layer: dict[str, mx.array]) -> dict[str, mx.array]:
    """Hunyuan V4's encoded experts under Hugging Face's names (``mlp.experts.gate_up_proj``
    and ``gate_up_proj_scale``: the names mlx-vlm's ``sanitize`` packs)."""
    out = dict(layer)
    for key in [k for k in layer if ".switch_mlp." in k and k.endswith(".weight_scale")]:
        base = key.removesuffix(".weight_scale")
        fused = base.replace(".switch_mlp.", ".experts.")
        out[fused], out[fused + "_scale"] = out.pop(base + ".weight"), out.pop(key)
    return out


def _save_encoded(path: Path, weights: dict[str, mx.array], encoding: Encoding | None) -> None:
    """The checkpoint's one safetensors file (an encoding's codes typed F8_E4M3)."""
    file = path / "model.safetensors"
    mx.save_safetensors(str(file), weights)
    if encoding is not None:
        mark_e4m3(file)


def _declare_encoding(path: Path, config: dict[str, Any], encoding: Encoding | None) -> None:
    """``config`` as the checkpoint's config.json, with the encoding's ``quantization_config``."""
    if encoding is not None:
        config["quantization_config"] = encoding.quantization_config
    (path / "config.json").write_text(json.dumps(config, indent=2))


def predicting_streams_head(model: nn.Module) -> MtpHead:
    """Qwen4-exp's ``predicting_mtp_head``: the target's layer outputs scaled down (its streams
    stay near the tiled embedding, so its next token is nearly a function of the current one; a
    target without the n-gram embedding, which adds the tokens before), and an MTP layer
    computing that function: ``fc_embedding`` passes the normed embedding into every stream,
    ``fc_hidden`` and its decoder layer's projections are zero (the layer adds nothing), and its
    mixer is the target's final one."""
    text = scale_outputs(model)
    head = random_mtp_head(model)
    for layer in head.layers:
        zeros = [(k, mx.zeros_like(v)) for k, v in tree_flatten(layer.parameters())]
        layer.load_weights([(k, v) for k, v in zeros if "norm" not in k], strict=False)
    width = text.args.hidden_size
    head.fc_embedding.weight = mx.eye(width)
    head.fc_hidden.weight = mx.zeros((width, width))
    mixer = tree_flatten(text.model.hyper_connection_mixer.parameters())
    head.hyper_connection_mixer.load_weights(mixer, strict=True)
    mx.eval(model.parameters(), head.parameters())
    return head


def mlx_vlm_qwen4_drafts(model: nn.Module, head: MtpHead, tokens: list[int], k: int) -> list[int]:
    """The ``k`` greedy drafts after ``tokens`` of mlx-vlm's own ``Qwen4ExpMTPDraftModel`` with
    ``head``'s weights, bound to the Qwen4-exp ``model``: its prefill over mlx-vlm's pre-mixer
    streams of all but the last token (that one its bonus), then its draft block."""
    from mlx_vlm.speculative.drafters.qwen4_exp_mtp import ModelConfig, Qwen4ExpMTPDraftModel

    text = model.language_model
    drafter = Qwen4ExpMTPDraftModel(ModelConfig(text_config=text.args))
    drafter.load_weights(tree_flatten(head.parameters()), strict=True)
    drafter.reset(model)
    ids = mx.array([tokens[:-1]])
    streams = text(ids, return_hidden=True).hidden_states[0]
    drafter.prefill_from_target_hidden(ids, streams, tokens[-1], None, greedy=True)
    drafts = drafter.draft_block(tokens[-1], streams[:, -1:], None, k + 1, None, greedy=True)
    return [int(t) for t in drafts[0].tolist()]


def save_qwen4_checkpoint(path: Path, encoding: Encoding | None = None) -> dict[str, mx.array]:
    """The tiny Qwen4-exp (tests/support/tiny_qwen4_exp.py) with a random MTP layer under
    ``mtp.`` as Qwen's checkpoints keep it (its experts fused as ``gate_up_proj``; ``encoding``:
    the layer stored in an 8-bit format, its experts one per projection as Qwen's fp8
    checkpoints keep them) and ``mtp_num_hidden_layers: 1``; returns the MTP layer's float
    weights as mlx-vlm holds them (the loader's expected result when float)."""
    from tests.support.tiny_qwen4_exp import QWEN4_EXP

    model = QWEN4_EXP.model()
    QWEN4_EXP.save(path)
    params = dict(tree_flatten(random_mtp_head(model).parameters()))
    stored = encoding.layer(params).stored if encoding else params
    stored = _hf_experts(stored, fused=encoding is None)
    weights = dict(mx.load(str(path / "model.safetensors")))
    _save_encoded(path, {**weights, **{f"mtp.{k}": v for k, v in stored.items()}}, encoding)
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    _declare_encoding(path, config, encoding)
    return params
