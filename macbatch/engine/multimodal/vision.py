"""Vision through mlx-vlm: which checkpoints can take images, their prompt ids with each image's
placeholder rows expanded, and the image embeddings (the vision tower and projector), encoded
once per image content and kept in a byte-budgeted cache.

The text model stays mlx-lm's (the engine pages it); mlx-vlm's model keeps only its vision
tower and projector, and reads token embeddings from the engine's text model, so no weight is
held twice. mlx-vlm is an optional extra (``macbatch[vision]``); without it, or for a text-only
or not yet supported checkpoint, ``unavailable_reason`` says why and requests with images are
refused with it. What a family does differently (M-RoPE positions, DeepStack features, image
blocks that attend both ways, how its tower is called) is its ``Vision`` record in
model/families.py; this module branches on those capabilities.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from macbatch.engine.model.config_file import BadConfig, read_model_config
from macbatch.engine.model.families import ImageFeatures, family, library_type, vision_families
from macbatch.engine.model.image_blocks import runs, step_blocks
from macbatch.engine.multimodal.deepstack import install_deepstack
from macbatch.engine.multimodal.images import VISION_EXTRA, Image
from macbatch.engine.multimodal.prompt_images import PromptImages
from macbatch.engine.multimodal.qwen_vl import MRoPEPositions, step_rope, tower_features
from macbatch.engine.tokenizer import one_bos

if TYPE_CHECKING:
    from macbatch.engine.model.batch import PackedBatch

ENCODE_CACHE_BYTES = 256 * 2**20


def unavailable_reason(path: Path | str, model_name: str) -> str | None:
    """Why the checkpoint at ``path`` cannot take images here (None: it can)."""
    try:
        config = read_model_config(Path(path)) if (Path(path) / "config.json").is_file() else {}
    except BadConfig as error:
        return f"model '{model_name}' cannot be read: {error}"
    model_type = config.get("model_type", "?")
    if not _has_tower(config):
        return f"model '{model_name}' is a text-only model ({model_type}); it cannot read images"
    rules = family(library_type(model_type))
    if rules.vision_refusal is not None:
        return f"images for '{model_type}' models are not supported yet: {rules.vision_refusal}"
    if rules.vision is None:
        return (
            f"images for '{model_type}' models are not supported yet (supported: "
            f"{', '.join(vision_families())})"
        )
    try:
        import mlx_vlm  # noqa: F401
    except ImportError:
        return f"images need mlx-vlm, which is not installed: {VISION_EXTRA}"
    return None


def _has_tower(config: dict[str, Any]) -> bool:
    """Whether the config describes a vision tower: at its top, or in one of its parts' configs
    (Qwen3-Omni's sits in its ``thinker_config``)."""
    parts = [config, *(part for part in config.values() if isinstance(part, dict))]
    return any("vision_config" in part for part in parts)


FROM_A_MODEL_OBJECT = "this engine was built from a model object; load the model by name for images"
LAUNCHED = (
    "images are not supported under mlx.launch: a tensor-parallel group pages text only (the "
    "image embeddings are not sent with the step rows yet); serve this model without mlx.launch "
    "for images"
)


@dataclass(frozen=True)
class VisionSupport:
    """The model's vision encoder, or why requests with images are refused (exactly one)."""

    encoder: VisionEncoder | None = None
    refusal: str | None = None

    def __post_init__(self) -> None:
        if (self.encoder is None) == (self.refusal is None):
            raise ValueError("give a vision encoder or the reason there is none, exactly one")


def vision_for(name: str, text_model: nn.Module, launched: bool = False) -> VisionSupport:
    """The vision encoder of model ``name`` (as the loader resolves it), or why it has none
    (``launched``: the engine is rank 0 of an ``mlx.launch`` group)."""
    if launched:
        return VisionSupport(refusal=LAUNCHED)
    from macbatch.engine.loader import resolve_model_path

    path = resolve_model_path(name)
    if isinstance(path, str):  # a hub id: mlx-lm has downloaded it by now
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(path, local_files_only=True))
    reason = unavailable_reason(path, name)
    if reason is not None:
        return VisionSupport(refusal=reason)
    try:
        return VisionSupport(VisionEncoder(path, text_model))
    except ValueError as exc:  # a config the family's rule cannot run: text still serves
        return VisionSupport(refusal=f"images for model '{name}' are not supported: {exc}")
    except OSError as exc:  # no processor files (a text-only conversion): text still serves
        return VisionSupport(refusal=f"images for model '{name}' cannot be read: {exc}")


class EncodeCache:
    """Image embeddings by image digest, least recently used dropped past ``budget`` bytes."""

    def __init__(self, budget: int = ENCODE_CACHE_BYTES) -> None:
        self.budget = budget
        self.bytes = 0
        self.encoded = 0  # how many images were run through the tower (hits do not count)
        self._entries: OrderedDict[str, mx.array] = OrderedDict()

    def get(self, digest: str) -> mx.array | None:
        found = self._entries.get(digest)
        if found is not None:
            self._entries.move_to_end(digest)
        return found

    def put(self, digest: str, embeddings: mx.array) -> None:
        self.encoded += 1
        self._entries[digest] = embeddings
        self.bytes += embeddings.nbytes
        while self.bytes > self.budget and len(self._entries) > 1:
            _, dropped = self._entries.popitem(last=False)
            self.bytes -= dropped.nbytes


class VisionEncoder:
    """mlx-vlm's processor and vision half of one checkpoint (thread use: ``prompt_images`` on
    any thread, ``embeddings`` on the engine thread only)."""

    def __init__(self, path: Path | str, text_model: nn.Module) -> None:
        from mlx_vlm.utils import load

        # lazy: the text weights mlx-vlm would load are never read (its language_model is
        # replaced by the engine's before anything is evaluated); the vision half loads on use
        vlm, processor = load(str(path), lazy=True)
        self.processor: Any = processor
        kind = family(library_type(vlm.config.model_type))
        rules = kind.vision
        assert rules is not None, "unavailable_reason refuses the families without images"
        self.rules = rules
        # the part of mlx-vlm's model that reads images (``Vision.part``: Qwen3-Omni's thinker)
        vision_part = vlm if rules.part is None else getattr(vlm, rules.part)
        vision_part.language_model = text_model
        self.model = vision_part
        config = vision_part.config
        self.image_token = int(getattr(config, "image_token_index", None) or config.image_token_id)
        self.mrope = None
        if rules.mrope is not None:  # a text model handed M-RoPE position ids rotates by them
            rotates_itself = kind.position_id_axes == 3
            self.mrope = MRoPEPositions(vision_part, text_model, rules.mrope, rotates_itself)
        if rules.deepstack:
            count = len(getattr(config.vision_config, "deepstack_visual_indexes", None) or ())
            if count:
                install_deepstack(list(text_model.layers), count)
        # mlx-vlm overlays each image's block on its masks when the text config asks
        text_config = getattr(config, "text_config", None)
        both_ways = getattr(text_config, "use_bidirectional_attention", None) == "vision"
        self.bidirectional = rules.bidirectional_blocks and both_ways
        self.cache = EncodeCache()

    def prompt_images(self, text: str, images: Sequence[Image]) -> tuple[list[int], PromptImages]:
        """The prompt's ids with each image's placeholder expanded (the processor's own rule, as
        mlx-vlm's ``generate`` tokenizes it, but with one BOS: ``one_bos``), and where its
        image rows are."""
        inputs = self._inputs(text, images)
        flat = [int(t) for t in np.array(inputs["input_ids"]).reshape(-1)]
        flat = one_bos(getattr(self.processor, "tokenizer", self.processor), text, flat)
        positions = np.flatnonzero(np.array(flat) == self.image_token)
        if not positions.size:
            raise ValueError(
                "the prompt has images but no image placeholder: the chat template did not "
                "render the image parts"
            )
        placed = PromptImages(tuple(images), positions)
        if self.mrope is not None:
            grids = np.array(inputs["image_grid_thw"])
            placed.rope, placed.rope_delta = self.mrope.prompt_rope(
                np.array(flat), positions, grids
            )
        if self.bidirectional:
            placed.blocks = runs(positions)
        return flat, placed

    def _inputs(self, text: str, images: Sequence[Image]) -> dict[str, Any]:
        from mlx_vlm.utils import prepare_inputs

        return dict(
            prepare_inputs(
                self.processor,
                images=[image.pil() for image in images],
                prompts=text,
                image_token_index=self.image_token,
            )
        )

    def admit(self, images: PromptImages, chunk_budget: int) -> None:
        """Encode a request's images as it is queued (engine thread), so an image the tower
        cannot read fails its own request (``ValueError``), not a step of everyone's; an image
        block longer than a step's token budget (``chunk_budget``) could never be prefilled
        whole, and is refused."""
        if images.longest_block > chunk_budget:
            raise ValueError(
                f"an image of {images.longest_block} rows attends to itself both ways and must "
                f"be prefilled in one step, but max_num_batched_tokens is {chunk_budget}: raise "
                "it, or send a smaller image"
            )
        try:
            mx.eval(self.embeddings(images))
        except Exception as exc:
            raise ValueError(f"the request's images could not be encoded: {exc}") from exc

    def embeddings(self, images: PromptImages) -> mx.array:
        """``[P, H]``: every image row's embedding in prompt order (each image encoded once)."""
        parts = [self._encoded(image) for image in images.images]
        joined = mx.concatenate(parts) if len(parts) > 1 else parts[0]
        if joined.shape[0] != images.positions.size:
            raise ValueError(
                f"the prompt has {images.positions.size} image rows but its images encode to "
                f"{joined.shape[0]}"
            )
        return joined

    def _encoded(self, image: Image) -> mx.array:
        found = self.cache.get(image.digest)
        if found is not None:
            return found
        # the text the processor expands into one image's rows (``Vision.placeholder``,
        # ``Vision.boi_placeholder``)
        boi = getattr(self.processor, "boi_token", None) if self.rules.boi_placeholder else None
        inputs = self._inputs(self.rules.placeholder or boi or self.processor.image_token, [image])
        ids = inputs.pop("input_ids")
        mask = inputs.pop("attention_mask", None)  # as mlx-vlm's generate passes it (gemma3's)
        features = self.rules.features
        if features is ImageFeatures.TOWER:
            encoded = tower_features(self.model.vision_tower, inputs)
        elif features is ImageFeatures.ENCODE_IMAGE:
            # the tower's and projector's rows as mlx-vlm puts them in its language model's
            # input: after the token rows' scaling, which the adapter skips for them
            # (``Vision.scaled_rows``)
            pixels = inputs["pixel_values"]
            encoded = self.model.encode_image(pixels, inputs.get("image_position_ids"))[0]
        else:
            embedded = self.model.get_input_embeddings(ids, mask=mask, **inputs).inputs_embeds[0]
            rows = mx.array(np.flatnonzero(np.array(ids).reshape(-1) == self.image_token))
            encoded = embedded[rows]
        mx.eval(encoded)
        self.cache.put(image.digest, encoded)
        return encoded

    def add_to_step(self, batch: PackedBatch, chunks: Sequence[Any]) -> None:
        """Give a packed step (``chunks``: ``StepPlan.chunks``, in packing order) what its rows
        need of the images: the image rows and their embeddings, the image blocks that attend
        both ways, and the rows' M-RoPE positions (rank 0's alone: ``PackedBatch``)."""
        images = self._step_rows(chunks)
        if images is not None:
            batch.image_rows, batch.image_embeddings = images
            if self.bidirectional:
                batch.image_blocks = step_blocks(chunks)
        if self.mrope is not None:  # decode rows after an image shift too
            batch.rope_positions = step_rope(chunks)

    def _step_rows(self, chunks: Sequence[Any]) -> tuple[mx.array, mx.array] | None:
        """The packed rows of a step's chunks (``StepPlan.chunks``, in packing order) that are
        image rows, and their embeddings (None: the step has none). A chunk boundary may fall
        anywhere in an image's rows: each chunk takes the rows at its positions."""
        rows, parts = [], []
        offset = 0
        for chunk in chunks:
            images = chunk.request.images
            if images is not None:
                lo, hi = images.rows_between(chunk.start, chunk.start + chunk.num_tokens)
                if hi > lo:
                    rows.append(images.positions[lo:hi] - chunk.start + offset)
                    parts.append(self.embeddings(images)[lo:hi])
            offset += chunk.num_tokens
        if not rows:
            return None
        return mx.array(np.concatenate(rows).astype(np.int32)), mx.concatenate(parts)
