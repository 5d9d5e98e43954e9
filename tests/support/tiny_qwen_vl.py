"""A tiny random-weight M-RoPE VLM: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (with DeepStack features),
Qwen3.5 (a hybrid: Gated DeltaNet and attention layers), their MoE checkpoints (Qwen3-VL MoE,
Qwen3.5 MoE: the same towers, routed experts in the text model), Qwen3-Omni (its thinker:
DeepStack, a MoE text model of mlx-vlm's), GLM-4V, GLM-4V MoE or GLM-OCR (mlx-vlm's own text
models, rotating by the position ids they are handed), built from mlx-vlm's own classes and saved
in the Hugging Face layout with its image processor config, so mlx-vlm's loader and processor and
the engine's loader all read it offline. Its tokenizer is the vendored real Qwen3 one (it has Qwen
VL's ``<|vision_start|>`` / ``<|image_pad|>`` / ``<|vision_end|>`` tokens; GLM's image tokens are
added to it), its vocabulary cut to the tokenizer's size rounded up so the embedding stays
small."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from tests.support.real_tokenizers import TOKENIZERS

VOCAB_SIZE = 151680  # the tokenizer's 151669 tokens, rounded up
PATCH = 14
MERGE = 2
WEIGHT_SCALE = 4.0
# GLM-4V's families: its image span, its image tokens, mlx-vlm's text model
GLM = ("glm4v", "glm4v_moe", "glm_ocr")
_GLM_PROCESSORS = {
    "glm4v": "Glm46VProcessor",
    "glm4v_moe": "Glm46VMoEProcessor",
    "glm_ocr": "GlmOcrProcessor",
}
# each family's image span: the text an image part renders as (its processor expands the pad)
IMAGE_SPANS = {
    **dict.fromkeys(
        (
            *("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"),
            *("qwen3_vl_moe", "qwen3_5_moe", "qwen3_omni_moe"),
        ),
        "<|vision_start|><|image_pad|><|vision_end|>",
    ),
    **dict.fromkeys(GLM, "<|begin_of_image|><|image|><|end_of_image|>"),
}
# the tokens added to the Qwen3 tokenizer (GLM-4V's; Qwen3-Omni's audio ones; within VOCAB_SIZE)
_ADDED = {
    **dict.fromkeys(GLM, ["<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|video|>"]),
    "qwen3_omni_moe": ["<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"],
}
# Qwen3-Omni's processor reads its modalities' tokens as the tokenizer's named special tokens
_OMNI_NAMED = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
# GLM-4V MoE's text model: a dense first layer, then four experts (two a token) and a shared one
_GLM_MOE = dict(
    moe_intermediate_size=32,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    norm_topk_prob=True,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.0,
    use_qk_norm=False,
)
# Qwen3-VL MoE's and Qwen3.5 MoE's text models: four experts, two a token (Qwen3.5 MoE adds a
# gated shared expert; Qwen3-VL MoE's first layer stays dense)
_QWEN_MOE = dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True
)
_QWEN3_VL_MOE = dict(_QWEN_MOE, decoder_sparse_step=1, mlp_only_layers=[0])
_QWEN3_5_MOE = dict(_QWEN_MOE, shared_expert_intermediate_size=32)
# Qwen VL's own template shape: an image part renders as the family's span
_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "SPAN{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def rendered(family: str, question: str, images: int) -> str:
    """What the tiny model's template renders for one user message of ``images`` images, then
    ``question`` (mlx-vlm is given the same text)."""
    body = IMAGE_SPANS[family] * images + question
    return f"<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"


def config(tokens: dict[str, int], family: str = "qwen2_5_vl") -> dict[str, Any]:
    if family in GLM:
        return _glm4v_config(tokens, family)
    if family in ("qwen3_5", "qwen3_5_moe"):
        return _qwen3_5_config(tokens, family)
    if family in ("qwen3_vl", "qwen3_vl_moe"):
        return _qwen3_vl_config(tokens, family)
    if family == "qwen3_omni_moe":
        return _qwen3_omni_config(tokens)
    text = dict(
        model_type=family,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        # head_dim 16: 8 frequencies, 2 temporal, 3 height, 3 width
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        tie_word_embeddings=True,
    )
    if family == "qwen2_vl":  # its tower: full attention, embed_dim wide, mlp_ratio
        vision = dict(
            model_type=family,
            depth=2,
            embed_dim=32,
            hidden_size=32,
            num_heads=2,
            mlp_ratio=2,
            patch_size=PATCH,
            spatial_patch_size=PATCH,
            spatial_merge_size=MERGE,
            temporal_patch_size=2,
            in_channels=3,
        )
        return _with_tokens(family, text, vision, tokens)
    vision = dict(
        model_type="qwen2_5_vl",
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=32,
        num_heads=2,
        patch_size=PATCH,
        spatial_patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=2,
        window_size=56,
        fullatt_block_indexes=[1],
        in_channels=3,
    )
    return _with_tokens("qwen2_5_vl", text, vision, tokens)


def _glm4v_config(tokens: dict[str, int], family: str) -> dict[str, Any]:
    # heads of 32, rotary dims 16 (partial): 8 frequencies, 2 temporal, 3 height, 3 width
    rope = {"rope_type": "default", "mrope_section": [2, 3, 3]}
    text: dict[str, Any] = dict(
        model_type=f"{family}_text",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        attention_bias=True,
        eos_token_id=[151645],
        pad_token_id=0,
    )
    if family == "glm_ocr":  # its RoPE settings under rope_parameters
        text["rope_parameters"] = dict(rope, partial_rotary_factor=0.5, rope_theta=10000.0)
    else:
        text.update(rope_theta=10000.0, partial_rotary_factor=0.5, rope_scaling=rope)
    if family == "glm4v_moe":
        text.update(_GLM_MOE)
    vision = dict(
        model_type=f"{family}_vision" if family == "glm_ocr" else family,
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=64,
        num_heads=2,
        patch_size=PATCH,
        image_size=56,  # a 4 x 4 table of position embeddings, interpolated to each grid
        spatial_merge_size=MERGE,
        temporal_patch_size=2,
        in_channels=3,
    )
    begin, end = tokens["<|begin_of_image|>"], tokens["<|end_of_image|>"]
    return dict(
        model_type=family,
        text_config=text,
        vision_config=vision,
        image_token_id=tokens["<|image|>"],
        image_token_index=tokens["<|image|>"],
        video_token_id=tokens["<|video|>"],
        video_token_index=tokens["<|video|>"],
        # GLM-OCR's names for the image span's tokens, GLM-4V's
        image_start_token_id=begin,
        image_end_token_id=end,
        vision_start_token_id=begin,
        vision_end_token_id=end,
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def _qwen3_5_config(tokens: dict[str, int], family: str) -> dict[str, Any]:
    text: dict[str, Any] = dict(
        model_type=family,
        hidden_size=32,
        num_hidden_layers=4,  # Gated DeltaNet, attention, Gated DeltaNet, attention
        full_attention_interval=2,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        # rotary dims 8 of 16 (partial): 4 frequencies, interleaved T H W T
        rope_parameters={
            "type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 1, 1],
        },
    )
    if family == "qwen3_5_moe":
        text.update(_QWEN3_5_MOE)
    return _with_tokens(family, text, _qwen3_vision(family, []), tokens)


def _qwen3_vl_config(tokens: dict[str, int], family: str) -> dict[str, Any]:
    text: dict[str, Any] = dict(
        model_type=family,
        hidden_size=32,
        num_hidden_layers=3,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        # head_dim 16: 8 frequencies, interleaved T H W T H W T T (width's third past the end)
        rope_scaling={
            "rope_type": "default",
            "mrope_section": [3, 2, 3],
            "mrope_interleaved": True,
        },
        tie_word_embeddings=True,
    )
    if family == "qwen3_vl_moe":  # untied: mlx-lm's Qwen3-VL MoE reads its lm_head
        text.update(_QWEN3_VL_MOE, tie_word_embeddings=False)
    # DeepStack: the tower's layers 0 and 1 feed the first two text layers
    return _with_tokens(family, text, _qwen3_vision(family, [0, 1]), tokens)


def _qwen3_omni_config(tokens: dict[str, int]) -> dict[str, Any]:
    """Qwen3-Omni's thinker (a dense first text layer, then four experts, two a token; DeepStack
    from the tower's layer 0) and a one-layer audio tower; no talker (``enable_audio_output``
    off), though its config is parsed."""
    text = dict(
        model_type="qwen3_omni_moe_text",
        hidden_size=32,
        num_hidden_layers=3,
        intermediate_size=64,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        # head_dim 16: 8 frequencies, interleaved T H W T H W T T
        rope_scaling={"type": "default", "mrope_section": [3, 3, 2], "interleaved": True},
        tie_word_embeddings=False,
    )
    vision = dict(_qwen3_vision("qwen3_omni_moe_vision_encoder", [0]), image_size=56)
    audio = dict(
        d_model=32,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        num_hidden_layers=1,
        output_dim=32,
        downsample_hidden_size=16,
    )
    thinker = dict(
        model_type="qwen3_omni_moe_thinker",
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        audio_token_id=tokens["<|audio_pad|>"],
        audio_start_token_id=tokens["<|audio_start|>"],
        audio_end_token_id=tokens["<|audio_end|>"],
        **_image_token_ids(tokens),
    )
    return dict(
        model_type="qwen3_omni_moe",
        thinker_config=thinker,
        talker_config={"text_config": text},
        enable_audio_output=False,
        eos_token_id=151645,
    )


def _qwen3_vision(family: str, deepstack: list[int]) -> dict[str, Any]:
    """Qwen3.5's and Qwen3-VL's vision tower (one more layer than the DeepStack taps)."""
    return dict(
        model_type=family,
        depth=max(2, len(deepstack) + 1),
        hidden_size=32,
        intermediate_size=64,
        out_hidden_size=32,
        num_heads=2,
        patch_size=PATCH,
        spatial_patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=2,
        num_position_embeddings=16,
        in_channels=3,
        deepstack_visual_indexes=deepstack,
    )


def _image_token_ids(tokens: dict[str, int]) -> dict[str, int]:
    """The image and video token ids every Qwen VL config names."""
    return dict(
        image_token_id=tokens["<|image_pad|>"],
        video_token_id=tokens["<|video_pad|>"],
        vision_start_token_id=tokens["<|vision_start|>"],
        vision_end_token_id=tokens["<|vision_end|>"],
    )


def _with_tokens(
    family: str, text: dict[str, Any], vision: dict[str, Any], tokens: dict[str, int]
) -> dict[str, Any]:
    return dict(
        model_type=family,
        text_config=text,
        vision_config=vision,
        **_image_token_ids(tokens),
        vision_token_id=tokens["<|vision_pad|>"],
        vocab_size=VOCAB_SIZE,
        **{k: v for k, v in text.items() if k not in ("model_type", "vocab_size")},
    )


def save_tiny_qwen_vl(path: Path, seed: int = 0, family: str = "qwen2_5_vl") -> Path:
    """The model directory (float32 weights as mlx-vlm saves them)."""
    import importlib

    from mlx_vlm.utils import update_module_configs

    module = importlib.import_module(f"mlx_vlm.models.{family}")
    from transformers import AutoTokenizer

    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZERS / "qwen3" / name, path / name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if family in _ADDED:
        tokenizer.add_special_tokens({"additional_special_tokens": _ADDED[family]})
    tokenizer.chat_template = _TEMPLATE.replace("SPAN", IMAGE_SPANS[family])
    tokenizer.save_pretrained(path)
    if family == "qwen3_omni_moe":
        _name_special_tokens(path / "tokenizer_config.json", _OMNI_NAMED)
    names = ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    names += ["<|vision_pad|>", *_ADDED.get(family, [])]
    tokens = {n: tokenizer.convert_tokens_to_ids(n) for n in names}
    cfg = config(tokens, family)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 151645}))
    (path / "preprocessor_config.json").write_text(json.dumps(_image_processor(family)))
    mx.random.seed(seed)
    model_config = update_module_configs(
        module.ModelConfig.from_dict(cfg), module, cfg, ["text", "vision"]
    )
    model = module.Model(model_config)
    model.set_dtype(mx.float32)
    # random weights at their default scale collapse to one repeated token; larger ones make
    # greedy ids depend on every position (a wrong M-RoPE position changes them)
    model.update(tree_map(lambda w: w * WEIGHT_SCALE if w.ndim == 2 else w, model.parameters()))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


def _name_special_tokens(config_file: Path, named: dict[str, str]) -> None:
    """Give the saved tokenizer named special tokens (``tokenizer.image_token`` ...), as Qwen3-
    Omni's real tokenizer config does under ``extra_special_tokens``."""
    config = json.loads(config_file.read_text())
    config["extra_special_tokens"] = named
    config_file.write_text(json.dumps(config))


def _image_processor(family: str) -> dict[str, Any]:
    if family == "qwen3_omni_moe":  # its audio's Whisper features beside the image processor's
        return {
            **_image_processor("qwen3_vl"),
            "processor_class": "Qwen3OmniMoeProcessor",
            "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": 128,
            "sampling_rate": 16000,
            "hop_length": 160,
            "chunk_length": 30,
            "n_fft": 400,
        }
    if family in GLM:  # its own processor class and resize bounds
        return {
            **_image_processor("qwen2_vl"),
            "image_processor_type": "Glm4vImageProcessor",
            "processor_class": _GLM_PROCESSORS[family],
            "size": {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 16},
        }
    processor = {
        "qwen2_vl": "Qwen2VLProcessor",
        "qwen2_5_vl": "Qwen2_5_VLProcessor",
        **dict.fromkeys(("qwen3_vl", "qwen3_5", "qwen3_vl_moe", "qwen3_5_moe"), "Qwen3VLProcessor"),
    }[family]
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor,
        "patch_size": PATCH,
        "merge_size": MERGE,
        "temporal_patch_size": 2,
        "min_pixels": 28 * 28,
        "max_pixels": 28 * 28 * 16,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
    }
