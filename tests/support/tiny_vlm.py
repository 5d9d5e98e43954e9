"""A tiny random-weight Mistral 3 (Pixtral vision) VLM built from mlx-vlm's own classes and saved
in the Hugging Face layout with its processor configs, so mlx-vlm's loader and image processor
and mlx-lm's loader all read it offline. Its tokenizer is the vendored real Mistral v0.3 one
with Mistral 3's [IMG_BREAK] / [IMG_END] tokens added ([IMG] it already has)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from tests.support.real_tokenizers import TOKENIZERS

VOCAB_SIZE = 32832  # the v0.3 vocabulary (32768) and the two added image tokens, rounded up
PATCH = 8
# A chat template in the shape of Mistral 3's own (an image part renders as [IMG]), written for
# the tiny model: the vendored v0.3 template has no image parts.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}[IMG]"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}[/INST]"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def rendered(question: str, images: int) -> str:
    """What CHAT_TEMPLATE renders for one user message of ``images`` images, then ``question``."""
    return "<s>[INST]" + "[IMG]" * images + question + "[/INST]"


def config(image_token: int) -> dict[str, Any]:
    text = dict(
        model_type="mistral",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    vision = dict(
        model_type="pixtral",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        head_dim=16,
        image_size=64,
        patch_size=PATCH,
        num_channels=3,
        rope_theta=10000.0,
    )
    return dict(
        model_type="mistral3",
        text_config=text,
        vision_config=vision,
        image_token_index=image_token,
        spatial_merge_size=2,
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        vocab_size=VOCAB_SIZE,
    )


def save_tiny_vlm(path: Path, seed: int = 0) -> Path:
    """The model directory (weights in float32, ``language_model.*`` / ``vision_tower.*`` /
    ``multi_modal_projector.*`` as mlx-vlm saves them)."""
    from mlx_vlm.models import mistral3

    tokenizer = saved_tokenizer(path, ["[IMG_BREAK]", "[IMG_END]"], CHAT_TEMPLATE)
    cfg = config(tokenizer.convert_tokens_to_ids("[IMG]"))
    processor = {"processor_class": "PixtralProcessor", "patch_size": PATCH}
    write_configs(path, cfg, _image_processor(), processor)
    model = built_model(mistral3, cfg, seed)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return path


def saved_tokenizer(path: Path, added: list[str], template: str) -> Any:
    """The vendored Mistral v0.3 tokenizer with ``added`` special tokens and ``template``, saved
    in ``path`` (made if missing)."""
    from transformers import AutoTokenizer

    path.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"):
        shutil.copy(TOKENIZERS / "mistral" / name, path / name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": added})
    tokenizer.chat_template = template
    tokenizer.save_pretrained(path)
    return tokenizer


def write_configs(
    path: Path, cfg: dict[str, Any], image_processor: dict[str, Any], processor: dict[str, Any]
) -> None:
    """The model's, generation, image processor and processor configs, as HF checkpoints have."""
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (path / "preprocessor_config.json").write_text(json.dumps(image_processor))
    (path / "processor_config.json").write_text(json.dumps(processor))


def built_model(family: Any, cfg: dict[str, Any], seed: int) -> Any:
    """mlx-vlm's ``family.Model`` for ``cfg``, random weights from ``seed``, in float32."""
    from mlx_vlm.utils import update_module_configs

    mx.random.seed(seed)
    model_config = update_module_configs(
        family.ModelConfig.from_dict(cfg), family, cfg, ["text", "vision"]
    )
    model = family.Model(model_config)
    model.set_dtype(mx.float32)
    return model


def _image_processor() -> dict[str, Any]:
    return {
        "image_processor_type": "PixtralImageProcessor",
        "processor_class": "PixtralProcessor",
        "patch_size": {"height": PATCH, "width": PATCH},
        "size": {"longest_edge": 64},
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True,
        "resample": 3,
    }


def png_bytes(width: int, height: int, seed: int) -> bytes:
    """A random-pixel PNG (each seed a different image)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()
