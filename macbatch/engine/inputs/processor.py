"""The input processor: a prompt and its sampling parameters in, a ``Request`` ready to queue out.

It templates chat messages (with their template variables and tools), tokenizes, checks the
prompt against the vocabulary and the context, fits ``max_tokens`` to the room left, and builds
the request's reasoning tracker and grammar matcher: vLLM v1's ``Processor``. It reads only facts
fixed at load (``EngineInfo``) and the tokenizer, never the engine's mutable state, so any thread
may call it (``EngineThread.submit`` does, on the caller's thread); the engine core checks what
depends on its state (a request id already in use) when the request is queued.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from macbatch.engine.core.outputs import PromptTooLongError, RequestMetrics
from macbatch.engine.core.request import Request
from macbatch.engine.inputs import chat_template
from macbatch.engine.inputs.prompt import Prompt, PromptInput
from macbatch.engine.model_info import EngineInfo
from macbatch.engine.multimodal.images import images_of
from macbatch.engine.multimodal.prompt_images import PromptImages
from macbatch.engine.multimodal.vision import VisionSupport
from macbatch.engine.parsers.reasoning import ReasoningTracker
from macbatch.engine.parsers.tool_calls import check_tools, template_messages
from macbatch.engine.pooling.embedding_profile import EmbeddingProfile
from macbatch.engine.pooling.methods import PoolingParams
from macbatch.engine.sample.params import SamplingParams
from macbatch.engine.structured_output.constraints import ConstraintCompiler, ConstraintState

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


class InputProcessor:
    """Turns prompts into requests for one model and KV pool (thread-safe)."""

    def __init__(
        self,
        tokenizer: TokenizerWrapper,
        info: EngineInfo,
        constraints: ConstraintCompiler,
        vision: VisionSupport,
    ) -> None:
        self.tokenizer = tokenizer
        self.info = info
        self.constraints = constraints
        self._eos_token_ids = frozenset(tokenizer.eos_token_ids or ())
        self._rng = random.Random()  # seeds of unseeded requests (getrandbits holds the GIL)
        self._token_chars: int | None = None  # longest_token, read on first need
        # The runner's vision encoder, or why requests with images are refused.
        self.vision = vision

    def encode(self, prompt: PromptInput) -> list[int]:
        """Token ids for a prompt: ids as given, raw text encoded (one BOS, as mlx-lm), chat
        messages templated with the prompt's template variables and tools."""
        return self.encode_with_images(prompt)[0]

    def encode_with_images(self, prompt: PromptInput) -> tuple[list[int], PromptImages | None]:
        """``encode``, and where the prompt's images are: with images, the template's text goes
        through the model's processor, which expands each image's placeholder."""
        images = images_of(prompt.prompt)
        encoder = self.vision.encoder
        if not images:
            ids, placed = self._encode(prompt), None
        elif encoder is None:
            raise ValueError(f"the prompt has {len(images)} image(s), but {self.vision.refusal}")
        else:
            assert isinstance(prompt.prompt, Sequence)
            text = self._render_chat([m for m in prompt.prompt if isinstance(m, dict)], prompt)
            ids, placed = encoder.prompt_images(text, images)
        if not ids:
            raise ValueError("prompt is empty")
        return ids, placed

    def _encode(self, prompt: PromptInput) -> list[int]:
        if prompt.tools is not None and not prompt.is_chat:
            raise ValueError("tools need a chat prompt (a list of messages)")
        text = prompt.prompt
        if isinstance(text, str):
            if not text:
                raise ValueError("prompt is empty")
            return chat_template.encode_text(self.tokenizer, text)
        if isinstance(text, Sequence):
            messages = [m for m in text if isinstance(m, dict)]
            if messages and len(messages) == len(text):
                return self._apply_chat_template(messages, prompt)
            ids = [t for t in text if isinstance(t, int) and not isinstance(t, bool)]
            if len(ids) == len(text):
                return self._check_token_ids(ids)
        raise ValueError(
            "prompt must be a list of token ids, a string, or a list of chat messages "
            "({'role': ..., 'content': ...})"
        )

    def _check_token_ids(self, ids: list[int]) -> list[int]:
        vocab = self.info.model.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        return ids

    def _apply_chat_template(
        self, messages: list[dict[str, Any]], prompt: PromptInput
    ) -> list[int]:
        text = self._render_chat(messages, prompt)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _render_chat(self, messages: list[dict[str, Any]], prompt: PromptInput) -> str:
        chat_template.check_content_parts(messages)
        # the history's calls in the shape the template takes
        messages = template_messages(messages, self.info.model.tool_format)
        if not chat_template.has_chat_template(self.tokenizer):
            raise ValueError(
                f"model '{self.info.model_name}' has no chat template; send a text prompt instead"
            )
        variables = chat_template.check_chat_template_kwargs(prompt.chat_template_kwargs)
        if prompt.tools is not None:
            variables["tools"] = check_tools(prompt.tools)
        return chat_template.render_chat(self.tokenizer, messages, variables)

    def process(
        self,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams,
        request_id: str | None = None,
    ) -> Request:
        """Validate and tokenize; ``ValueError`` saying what is wrong (no MLX work happens).
        ``PoolingParams``: a pooling request (a vector or a score out, never sampled)."""
        if isinstance(params, PoolingParams):
            return self._pooling_request(prompt, params, request_id)
        if not isinstance(params, SamplingParams):
            raise ValueError(
                f"params must be SamplingParams or PoolingParams, got {type(params).__name__}"
            )
        limit, what = self.info.context_limit, self.info.context_limit_reason
        self._refuse_beyond_characters(prompt, limit, f"leaves no room for a reply in {what}")
        ids, images = self.encode_with_images(prompt)
        room = limit - len(ids)
        if room < 1:
            raise PromptTooLongError(
                f"prompt ({len(ids)} tokens) leaves no room for a reply in {what} ({limit} tokens)"
            )
        capped = params.max_tokens is not None and params.max_tokens > room
        if params.max_tokens is None or capped:
            params = replace(params, max_tokens=room)
        fmt = self.info.model.reasoning_format
        reasoning = (
            ReasoningTracker(fmt, fmt.initial_phase(ids))
            if fmt is not None and prompt.is_chat
            else None
        )
        spec = params.structured
        constraint = (
            ConstraintState(self.constraints.compile(spec), reasoning, spec.own_channel)
            if spec is not None
            else None
        )
        return Request(
            request_id=request_id or uuid.uuid4().hex,
            prompt_token_ids=ids,
            params=params,
            seed=params.seed if params.seed is not None else self._rng.getrandbits(62),
            eos_token_ids=self._eos_token_ids,
            detokenizer=self.tokenizer.detokenizer,
            metrics=RequestMetrics(arrival_time=time.monotonic(), prompt_tokens=len(ids)),
            capped_max_tokens=room if capped else None,
            reasoning=reasoning,
            constraint=constraint,
            images=images,
            **self._adapter_fields(prompt),
        )

    def _refuse_beyond_characters(self, prompt: PromptInput, limit: int, what: str) -> None:
        """Refuse, before templating and tokenizing it, a prompt whose text alone must be more
        than ``limit`` tokens: no token stands for more characters than the vocabulary's longest
        entry, so ``characters / longest`` tokens at least. A 10 MB body against a 512-token
        context once took 2.5 GB and seconds to tokenize before its refusal."""
        chars = prompt_characters(prompt.prompt)
        if chars <= (limit + 1) * MIN_TOKEN_CHARS:
            return  # the common case: no vocabulary read (it takes ~0.2 s for 150k entries)
        if self._token_chars is None:
            self._token_chars = longest_token(self.tokenizer)  # the same from any thread
        if chars > (limit + 1) * self._token_chars:
            at_least = chars // self._token_chars
            raise PromptTooLongError(
                f"prompt (at least {at_least} tokens: {chars} characters) {what} "
                f"({self.info.context_limit} tokens)"
            )

    def _pooling_request(
        self, prompt: PromptInput, params: PoolingParams, request_id: str | None
    ) -> Request:
        if images_of(prompt.prompt):
            raise ValueError("embeddings and scores of images are not supported yet; send text")
        if params.lexical or params.colbert:
            raise ValueError(M3_ONLY)
        limit, what = self.info.context_limit, self.info.context_limit_reason
        if not params.truncate:
            self._refuse_beyond_characters(prompt, limit - 1, f"is longer than {what}")
        ids = fit_pooled(self.encode(prompt), params.truncate, limit, what)
        return pooling_request(
            ids,
            params,
            self.info.model.embedding,
            request_id,
            eos_token_ids=self._eos_token_ids,
            detokenizer=self.tokenizer.detokenizer,
            **self._adapter_fields(prompt),
        )

    def _adapter_fields(self, prompt: PromptInput) -> dict[str, Any]:
        """The request's adapter slot and prefix-cache scope; unknown names refused."""
        if prompt.adapter is None:
            return {}
        ref = self.info.model.adapters.get(prompt.adapter)
        if ref is None:
            known = ", ".join(sorted(self.info.model.adapters)) or "none"
            name = self.info.model_name
            raise ValueError(f"model '{name}' has no adapter '{prompt.adapter}' (loaded: {known})")
        return {"adapter_slot": ref.slot, "cache_scope": ref.cache_scope}


M3_ONLY = (
    "sparse lexical weights and ColBERT vectors come from an encoder that ships BGE-M3's heads "
    "(sparse_linear.pt, colbert_linear.pt)"
)
# What a pooling request carries as its sampling parameters: it never samples.
_POOLING_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)


def fit_pooled(ids: list[int], truncate: bool, limit: int, what: str) -> list[int]:
    """A pooling input's ``ids`` within ``limit`` tokens (``what`` sets it, in words): cut to
    it when the request asks for truncation, else refused."""
    if len(ids) <= limit:
        return ids
    if not truncate:
        raise PromptTooLongError(
            f"input ({len(ids)} tokens) is longer than {what} ({limit} tokens); "
            "ask for truncation to embed its first tokens"
        )
    return ids[:limit]


def pooling_request(
    ids: list[int],
    params: PoolingParams,
    profile: EmbeddingProfile,
    request_id: str | None,
    **fields: Any,
) -> Request:
    """A pooling request of ``ids``, the model's pooling and normalizing filled in where the
    request leaves them (``dimensions`` past its hidden size refused); ``fields``: the
    request's others (its tokenizer's, its adapter's, its token types)."""
    hidden = profile.hidden_size
    if params.dimensions is not None and hidden and params.dimensions > hidden:
        raise ValueError(f"dimensions ({params.dimensions}) is more than the model's {hidden}")
    params = replace(
        params,
        method=params.method or profile.pooling,
        normalize=profile.normalize if params.normalize is None else params.normalize,
    )
    return Request(
        request_id=request_id or uuid.uuid4().hex,
        prompt_token_ids=ids,
        params=_POOLING_SAMPLING,
        seed=0,
        metrics=RequestMetrics(arrival_time=time.monotonic(), prompt_tokens=len(ids)),
        pooling=params,
        **{"eos_token_ids": frozenset(), "detokenizer": None, **fields},
    )


class Processor(Protocol):
    """What turns a model's prompts into requests: ``InputProcessor``, or an encoder's
    (engine/encoder/requests.py). Safe from any thread."""

    vision: VisionSupport

    def encode(self, prompt: PromptInput) -> list[int]: ...

    def process(
        self,
        prompt: PromptInput,
        params: SamplingParams | PoolingParams,
        request_id: str | None = None,
    ) -> Request: ...


class PromptEncoder:
    """``encode_prompt``, for the engine and its thread alike (each gives its processor)."""

    def _processor(self) -> Processor:
        raise NotImplementedError

    def encode_prompt(
        self,
        prompt: Prompt | PromptInput,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The token ids a request for this prompt would get: ids as given, raw text encoded
        (one BOS, as mlx-lm), chat messages templated with ``chat_template_kwargs`` as template
        variables and ``tools`` (OpenAI-shaped function tools) rendered by the template.
        Tokenizer work only: an ``EngineThread``'s is safe from any thread."""
        return self._processor().encode(prompt_input(prompt, chat_template_kwargs, tools))


def prompt_input(
    prompt: Prompt | PromptInput,
    chat_template_kwargs: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> PromptInput:
    """A ``PromptInput`` from the public methods' arguments: one given, or one built from the
    prompt and the keywords (which a ``PromptInput`` must not be given alongside)."""
    if not isinstance(prompt, PromptInput):
        return PromptInput(prompt, chat_template_kwargs, tools)
    if chat_template_kwargs is not None or tools is not None:
        raise ValueError("give chat_template_kwargs and tools inside the PromptInput, not beside")
    return prompt


# a floor under the longest entry: a bound this loose refuses nothing that fits in any vocabulary
# seen (Mistral's longest is under 64 characters; Qwen3's is 128, and 5,000 spaces are 40 tokens)
MIN_TOKEN_CHARS = 64


def longest_token(tokenizer: Any) -> int:
    """The most characters one token's vocabulary entry has (its bytes, for byte-level BPE: at
    least the characters it decodes to), special tokens included; decided once at load."""
    try:
        vocab = tokenizer.get_vocab()
        return max(MIN_TOKEN_CHARS, *(len(entry) for entry in vocab))
    except Exception:  # a tokenizer without a readable vocabulary: a generous bound
        return 1024


def prompt_characters(prompt: Any) -> int:
    """The characters of a prompt's text (its messages' text content), cheaply: a prompt of
    token ids counts one per id."""
    if isinstance(prompt, str):
        return len(prompt)
    if not isinstance(prompt, Sequence):
        return 0
    total = 0
    for item in prompt:
        if isinstance(item, dict):
            content = item.get("content")
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(
                    len(part["text"])
                    for part in content
                    if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
        elif isinstance(item, int):
            total += 1
    return total
