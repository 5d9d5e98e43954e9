"""`demo-vision`: a tiny random-weight Mistral 3 (Pixtral) vision-language model, built on this
machine from mlx-vlm's own classes the first time it is asked for, so an image job runs offline
on a fresh install (``jobs/images.yaml``).

Its weights are random: its captions are noise. It shows the pipeline (images read, encoded by a
vision tower, their rows in the packed step, resumable output, JSON replies under a schema), not
a model's skill. Nothing is shipped but this code: the tokenizer is the demo model's with
Mistral 3's three image tokens added, and the weights (about 10 MB) are drawn from a fixed seed
into ``demo-vision/`` in the data directory. It needs the vision extra (mlx-vlm, Pillow).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from macbatch import VISION_EXTRA
from macbatch.arithmetic import ceil_div
from macbatch.demo import MODEL_DIR

NAME = "demo-vision"
PATCH = 8
IMAGE_TOKENS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# The demo's ChatML template, with an image part rendered as Mistral 3's placeholder.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}[IMG]"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def demo_vision_dir() -> Path:
    """The demo VLM's directory, built first if it is not there yet."""
    from macbatch.config import data_dir

    path = data_dir() / NAME
    if not (path / "model.safetensors").exists():
        build(path)
    return path


def build(path: Path) -> Path:
    """Write the demo VLM to ``path`` (built in a sibling folder and renamed, so a run killed
    halfway leaves no half-written model behind)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise ValueError(f"the '{NAME}' model needs the vision extra: {VISION_EXTRA}") from error
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=path.parent))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODEL_DIR / name, work / name)
    tokenizer = AutoTokenizer.from_pretrained(work)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(work)
    vocab = ceil_div(len(tokenizer), 64) * 64
    image_token = tokenizer.get_vocab()["[IMG]"]
    save_random_vlm(work, image_token, vocab, eos_token_id=2)
    shutil.rmtree(path, ignore_errors=True)
    work.rename(path)
    return path


def save_random_vlm(
    path: Path, image_token: int, vocab_size: int, eos_token_id: int, seed: int = 0
) -> None:
    """A tiny random Mistral 3 into ``path`` (which holds its tokenizer already): config,
    processor configs and float32 weights as mlx-vlm saves them."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models import mistral3

    cfg = vlm_config(image_token, vocab_size)
    processor = {"processor_class": "PixtralProcessor", "patch_size": PATCH}
    write_configs(path, cfg, image_processor_config(), processor, eos_token_id)
    model = random_vlm(mistral3, cfg, seed)
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))


def write_configs(
    path: Path,
    cfg: dict[str, Any],
    image_processor: dict[str, Any],
    processor: dict[str, Any],
    eos_token_id: int = 2,
) -> None:
    """The model's, generation, image processor and processor configs, as HF checkpoints have."""
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_token_id}))
    (path / "preprocessor_config.json").write_text(json.dumps(image_processor))
    (path / "processor_config.json").write_text(json.dumps(processor))


def random_vlm(
    family: Any, cfg: dict[str, Any], seed: int, parts: tuple[str, ...] = ("text", "vision")
) -> Any:
    """mlx-vlm's ``family.Model`` (a model module) for ``cfg``, random float32 weights from
    ``seed``; ``parts``: the sub-configs given their own classes (Idefics 2's ``perceiver`` too)."""
    import mlx.core as mx
    from mlx_vlm.utils import update_module_configs

    mx.random.seed(seed)
    model_config = update_module_configs(
        family.ModelConfig.from_dict(cfg), family, cfg, list(parts)
    )
    model = family.Model(model_config)
    model.set_dtype(mx.float32)
    return model


def vlm_config(image_token: int, vocab_size: int) -> dict[str, Any]:
    text = dict(
        model_type="mistral",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
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
        vocab_size=vocab_size,
    )


def image_processor_config() -> dict[str, Any]:
    """Pixtral's image processor with images scaled to at most 64 pixels a side."""
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
