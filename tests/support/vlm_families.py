"""The tiny VLM families the family-generic vision tests run over (Mistral 3, Gemma 3, Gemma 4,
Idefics 3, SmolVLM, LLaVA-OneVision, Aya Vision, InternVL 2.5 and 3: tests/support/tiny_vlm*.py),
and ``TinyVlm``, the value of the ``family_vlm`` fixture that test modules name in their
signatures; here so they need not import tests/vision/conftest.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support import (
    tiny_vlm,
    tiny_vlm_aya,
    tiny_vlm_gemma3,
    tiny_vlm_gemma4,
    tiny_vlm_idefics3,
    tiny_vlm_internvl,
    tiny_vlm_onevision,
)
from tests.support.tiny_vlm import save_tiny_vlm


@dataclass(frozen=True)
class TinyVlm:
    """One family's tiny model: where it is saved, and what its chat template renders for a
    user message of ``n`` images then a question (the text mlx-vlm is given)."""

    family: str
    path: Path
    rendered: Callable[[str, int], str]


# family -> (the builder, its template's rendering): the families the engine tests run over
TINY_VLMS = {
    "mistral3": (save_tiny_vlm, tiny_vlm.rendered),
    "gemma3": (tiny_vlm_gemma3.save_tiny_gemma3, tiny_vlm_gemma3.rendered),
    "gemma4": (tiny_vlm_gemma4.save_tiny_gemma4, tiny_vlm_gemma4.rendered),
    "idefics3": (tiny_vlm_idefics3.save_tiny_idefics3, tiny_vlm_idefics3.rendered),
    "smolvlm": (tiny_vlm_idefics3.save_tiny_smolvlm, tiny_vlm_idefics3.rendered),
    "llava_onevision": (tiny_vlm_onevision.save_tiny_onevision, tiny_vlm_onevision.rendered),
    "aya_vision": (tiny_vlm_aya.save_tiny_aya, tiny_vlm_aya.rendered),
    "internvl_chat": (tiny_vlm_internvl.save_tiny_internvl, tiny_vlm_internvl.rendered),
    "internvl": (tiny_vlm_internvl.save_tiny_internvl3, tiny_vlm_internvl.rendered),
}
