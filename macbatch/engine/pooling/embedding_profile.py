"""How the loaded model embeds and scores, decided once at load from the checkpoint's own files.

A sentence-transformers checkpoint (Qwen3-Embedding, gte-Qwen2) says how it pools in
``modules.json`` -> its Pooling module's ``config.json`` (``pooling_mode_lasttoken``,
``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``), whether it normalizes (a Normalize
module), and its query/document prompts in ``config_sentence_transformers.json``. A model
without them is a generation model that can embed too: last-token pooling of its hidden states.
A Qwen3-Reranker-style cross-encoder is recognised by its name (or ``EngineConfig.reranker``)
and scores with its own template: P("yes") against P("no") at the last position.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from macbatch.engine.tokenizer import Tokenizer

_POOLING_MODES = {  # the Pooling module's flags -> our method names
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}
_POOLING_MODULE = "sentence_transformers.models.Pooling"
_NORMALIZE_MODULE = "sentence_transformers.models.Normalize"

# Qwen3-Reranker's template and default instruction, from its model card (Qwen/Qwen3-Reranker-0.6B).
_RERANK_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
_RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


class TextPair(NamedTuple):
    """Two texts a cross-encoder reads as one input (a query and a document): its tokenizer
    joins them with its separators and gives the second its token type."""

    first: str
    second: str


class Reranking(Protocol):
    """How a reranker reads a (query, document) pair, and what scores it."""

    @property
    def score_tokens(self) -> tuple[int, int] | None:
        """A yes/no reranker's answer tokens (None: a classification head scores)."""
        ...

    def prompt_ids(
        self, tokenizer: Tokenizer, query: str, document: str, instruction: str | None = None
    ) -> Sequence[int] | TextPair: ...


@dataclass(frozen=True)
class PairFormat:
    """A cross-encoder with a classification head (bge-reranker, ms-marco MiniLM): the pair
    goes in as two texts and its head's logit scores it (engine/encoder/)."""

    score_tokens: tuple[int, int] | None = None

    def prompt_ids(
        self, tokenizer: Tokenizer, query: str, document: str, instruction: str | None = None
    ) -> TextPair:
        """The pair itself (its checkpoint has no instruction)."""
        return TextPair(query, document)


@dataclass(frozen=True)
class RerankFormat:
    """A yes/no cross-encoder: its template and the two answer tokens."""

    yes: int
    no: int

    @property
    def score_tokens(self) -> tuple[int, int]:
        return self.yes, self.no

    def prompt_ids(
        self, tokenizer: Tokenizer, query: str, document: str, instruction: str | None = None
    ) -> list[int]:
        """The pair's tokens, as the model card builds them (no special tokens added): pairs
        with the same query share every token up to the document, so its prefix blocks."""
        body = (
            f"<Instruct>: {instruction or RERANK_INSTRUCTION}\n<Query>: {query}\n"
            f"<Document>: {document}"
        )
        text = _RERANK_PREFIX + body + _RERANK_SUFFIX
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        return list(hf.encode(text, add_special_tokens=False))


@dataclass(frozen=True)
class EmbeddingProfile:
    """The model's embedding facts: its pooling, whether it normalizes, its named prompts
    (prepended to the text), its hidden size, and whether it is a cross-encoder reranker."""

    pooling: str = "last"
    normalize: bool = True
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    hidden_size: int = 0
    source: str = "the default for decoder models (no sentence-transformers config)"
    rerank: Reranking | None = None
    # sentence_bert_config.json's ``max_seq_length``: the longest input the checkpoint embeds
    # (longer ones are cut to it, as sentence-transformers does)
    max_seq_length: int | None = None

    @property
    def embedding_model(self) -> bool:
        """Whether the checkpoint is made for embedding (ships a sentence-transformers config)."""
        return self.source.startswith("sentence-transformers")


def profile_of(
    tokenizer: Tokenizer, model_name: str, hidden_size: int, reranker: bool | None = None
) -> EmbeddingProfile:
    """The profile of the model whose tokenizer was loaded from its directory (a hub model's
    cached snapshot). ``reranker`` None: a checkpoint whose name says "rerank" is one."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    where = Path(str(getattr(hf, "name_or_path", "") or ""))
    directory = where if (where / "config.json").exists() else None
    if reranker is None:
        names = f"{model_name} {directory.name if directory else ''}".lower()
        reranker = "rerank" in names
    rerank = _rerank_format(hf) if reranker else None
    base = EmbeddingProfile(hidden_size=hidden_size, rerank=rerank)
    return sentence_transformers_profile(directory, base) if directory else base


def _rerank_format(hf: Any) -> RerankFormat:
    ids = hf.convert_tokens_to_ids(["yes", "no"])
    unknown = getattr(hf, "unk_token_id", None)
    if any(i is None or i == unknown for i in ids):
        raise ValueError("a yes/no reranker needs 'yes' and 'no' to be single tokens")
    return RerankFormat(yes=int(ids[0]), no=int(ids[1]))


def sentence_transformers_profile(directory: Path, base: EmbeddingProfile) -> EmbeddingProfile:
    """``base`` with the sentence-transformers config the checkpoint in ``directory`` ships
    (``base`` itself when it ships none)."""
    modules = _read_json(directory / "modules.json")
    if not isinstance(modules, list):
        return base
    types = {m.get("type"): m.get("path", "") for m in modules if isinstance(m, dict)}
    pooling = base.pooling
    if _POOLING_MODULE in types:
        config = _read_json(directory / types[_POOLING_MODULE] / "config.json") or {}
        on = [name for flag, name in _POOLING_MODES.items() if config.get(flag)]
        if len(on) != 1:
            raise ValueError(
                f"{directory}: the sentence-transformers pooling config turns on "
                f"{on or 'no mode'}; macbatch pools with exactly one of last, mean, cls"
            )
        pooling = on[0]
    st = _read_json(directory / "config_sentence_transformers.json") or {}
    prompts = st.get("prompts")
    prompts = prompts if isinstance(prompts, dict) else {}
    return EmbeddingProfile(
        pooling=pooling,
        normalize=_NORMALIZE_MODULE in types,
        prompts={str(k): str(v) for k, v in prompts.items()},
        default_prompt=st.get("default_prompt_name") or None,
        hidden_size=base.hidden_size,
        source=f"sentence-transformers config ({directory.name}/modules.json)",
        rerank=base.rerank,
        max_seq_length=_max_seq_length(directory),
    )


def _max_seq_length(directory: Path) -> int | None:
    value = (_read_json(directory / "sentence_bert_config.json") or {}).get("max_seq_length")
    return value if isinstance(value, int) and value > 0 else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
