"""Real chat templates of current families (tests/support/templates, sources in its SOURCE.txt),
attached to the vendored real Qwen3 tokenizer: the template decides the text, Qwen3's
vocabulary tokenizes it (a family's markup that is not a Qwen3 token is plain text to it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "templates"

# Each vendored template and the tool-call syntax detection must find in it.
FAMILIES = {
    "qwen3_5": "qwen3_xml",
    "qwen3_coder": "qwen3_xml",
    "nemotron_3": "qwen3_xml",
    "seed_oss": "seed_oss",
    "gpt_oss": "harmony",
    "llama3_3": "llama3_json",
    "mistral_small_3_2": "mistral_args",
    "ministral_3": "mistral_args",
    "mistral_nemo": "mistral_nemo",
    "deepseek_v3_1": "deepseek_v31",
    "glm4_6": "glm45",
    "glm4_7": "glm47",
    "kimi_k2": "kimi_k2",
    "kimi_k2_thinking": "kimi_k2",  # writes each call's id where Instruct writes its name
    "glm4_5": "glm45",  # llama.cpp's GLM 4.5, spaced unlike GLM's: not tuned to (issue 46)
    "minimax_m2": "minimax_m2",
    "nemotron_nano_v2": "nemotron_v2",
    "granite4": "hermes",
    "apriel_1_5": "apriel",
    "apriel_1_6": "apriel",
    "devstral": "mistral_args",
    "gemma4": "gemma4",
    "deepseek_v3_2": "deepseek_v32",
    "lfm2": "lfm2",
    "lfm2_5": "lfm2",
}
# Special tokens of a family that the Qwen3 vocabulary lacks and detection needs (LFM2's
# templates render no calls: its markers are found among the tokens), added to a copy of it.
_LFM2_TOKENS = ("<|tool_call_start|>", "<|tool_call_end|>")
EXTRA_TOKENS = {"lfm2": _LFM2_TOKENS, "lfm2_5": _LFM2_TOKENS}


def tokenizer_for(name: str) -> Any:
    """The real Qwen3 tokenizer (one shared object), or a copy with the template's family's
    extra special tokens."""
    from tests.support.structured import real_tokenizer

    extra = EXTRA_TOKENS.get(name)
    return real_tokenizer("qwen3") if extra is None else _with_tokens(extra)


@cache
def _with_tokens(tokens: tuple[str, ...]) -> Any:
    """Saved and loaded again, as mlx-lm loads a model's tokenizer (its streaming detokenizer
    reads the vocabulary once, when the wrapper is built)."""
    import atexit
    import shutil
    import tempfile

    from mlx_lm.utils import load_tokenizer
    from transformers import AutoTokenizer

    from tests.support.real_tokenizers import TOKENIZERS, generation_eos_ids

    hf = AutoTokenizer.from_pretrained(TOKENIZERS / "qwen3")
    hf.add_special_tokens({"additional_special_tokens": list(tokens)})
    copy = Path(tempfile.mkdtemp(prefix="macbatch-tokenizer-"))
    atexit.register(shutil.rmtree, copy, True)
    hf.save_pretrained(copy)
    return load_tokenizer(copy, eos_token_ids=generation_eos_ids("qwen3"))


def read_template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@contextmanager
def template_on(tokenizer: Any, name: str) -> Iterator[Any]:
    """``tokenizer`` (an mlx-lm wrapper) with the named template, the old one back after."""
    hf = tokenizer._tokenizer
    before = hf.chat_template
    hf.chat_template = read_template(name)
    try:
        yield tokenizer
    finally:
        hf.chat_template = before


def save_with_template(path: Path, name: str) -> Path:
    """A tiny random model with the real Qwen3 tokenizer and the named real template, in the
    Hugging Face layout, for ``Engine.load`` and the server."""
    from tests.support.structured import QWEN3_VOCAB, save_model_with_tokenizer

    save_model_with_tokenizer(path, "qwen3", QWEN3_VOCAB)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = read_template(name)
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return path


def gpt_oss_reasoner(tokenizer: Any) -> Any:
    """A tiny random (bigram) model that, after gpt-oss's generation prompt, opens the analysis
    channel as a real gpt-oss model does, then says random tokens (``tokenizer``: the harmony
    stand-in with gpt-oss's template)."""
    from tests.support.scripted import opening_model
    from tests.support.tiny import VOCAB_SIZE

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=True,
                                           add_generation_prompt=True)  # fmt: skip
    opening = tokenizer.encode("<|channel|>analysis<|message|>", add_special_tokens=False)
    return opening_model("qwen3", VOCAB_SIZE, [prompt[-1], *opening])


def save_gpt_oss(path: Path, reasons: bool = False) -> Path:
    """A tiny random model with gpt-oss's real template on the harmony stand-in tokenizer
    (gpt-oss's special tokens: its real tokenizer is not vendored), ``<|return|>`` and
    ``<|call|>`` as EOS, in the Hugging Face layout; ``reasons``: ``gpt_oss_reasoner``'s."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from tests.support.standin import harmony_tokenizer
    from tests.support.tiny import save_model

    save_model(path)
    wrapper = harmony_tokenizer(read_template("gpt_oss"))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).unlink(missing_ok=True)
    wrapper._tokenizer.save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    config["eos_token_id"] = sorted(wrapper.eos_token_ids)
    if reasons:
        weights = dict(tree_flatten(gpt_oss_reasoner(wrapper).parameters()))
        mx.save_safetensors(str(path / "model.safetensors"), weights)
        config["tie_word_embeddings"] = False
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
