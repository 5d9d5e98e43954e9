"""Per-request output constraints (JSON schema, any JSON object, regex, choice, Lark/EBNF grammar)
turned into token masks for the sampled rows of one packed step.

llguidance does the grammar work: it compiles a constraint once per request (a ``ValueError`` at
submission when the schema, regex or grammar is wrong) and fills 32-bit bitmasks (one bit per
token) for all constrained rows in parallel with the GIL released. The engine starts the forward
pass on the device first (``mx.async_eval``) and fills the masks while it runs; the masks are then
applied with a few plain MLX ops (no Metal kernel). Steps without a constrained row cost nothing
extra; rows without a constraint get no mask work (they pass through the one select).

A constraint waits for reasoning to end: while a thinking model is inside ``<think>...</think>``
no mask applies (as vLLM does); the grammar starts with the first answer token.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from macbatch.engine.parsers.json_layout import JSON_LAYOUT
from macbatch.engine.parsers.reasoning import Phase, ReasoningTracker

_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one constraint on a request's answer.

    ``json_schema`` is a JSON Schema (a dict, or its JSON text); ``json_object=True`` asks for any
    JSON object; ``regex`` for text matching a regular expression (Rust regex syntax); ``choice``
    for exactly one of the strings; ``grammar`` for a Lark grammar (GBNF/EBNF is converted).
    The schema is kept as canonical JSON text so the params stay hashable. ``own_channel``: the
    grammar writes the reply's channel header itself (a forced harmony tool call names the
    commentary channel and its recipient), so a harmony reply is not made to open the final
    channel first.
    """

    json_schema: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    own_channel: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.json_schema, dict):
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        elif isinstance(self.json_schema, str):
            try:
                schema = json.loads(self.json_schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"json_schema is not valid JSON: {exc}") from None
            if not isinstance(schema, dict):
                raise ValueError(
                    "json_schema must be a JSON object (a schema), got " + repr(schema)
                )
        elif self.json_schema is not None:
            raise ValueError(f"json_schema must be a dict or JSON text, got {self.json_schema!r}")
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not all(
                isinstance(c, str) and c for c in self.choice
            ):
                raise ValueError(f"choice must be a list of non-empty strings, got {self.choice!r}")
            if not self.choice:
                raise ValueError("choice must list at least one string")
            object.__setattr__(self, "choice", tuple(self.choice))
        if not isinstance(self.own_channel, bool):
            raise ValueError(f"own_channel must be true or false, got {self.own_channel!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        given = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(
                f"a structured output takes exactly one of {', '.join(_KINDS)}; got "
                f"{', '.join(given) or 'none'}"
            )
        _check_grammar(self.kind, self.llguidance_grammar(), None)

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON schema as a dict (``{"type": "object"}`` for ``json_object``), else None."""
        if self.json_object:
            return {"type": "object"}
        return json.loads(self.json_schema) if self.json_schema else None

    def llguidance_grammar(self) -> str:
        """The constraint as an llguidance grammar (not yet validated)."""
        from llguidance import LLMatcher, grammar_from

        if self.schema is not None:  # a schema's own "x-guidance" options override these
            return on_large_stack(
                functools.partial(LLMatcher.grammar_from_json_schema, defaults=JSON_LAYOUT),
                self.schema,
            )
        if self.regex is not None:
            return on_large_stack(LLMatcher.grammar_from_regex, self.regex)
        if self.choice is not None:
            return LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(c) for c in self.choice)
            )
        try:
            return on_large_stack(grammar_from, "grammar", self.grammar or "")
        except ValueError as exc:
            raise ValueError(f"invalid grammar: {_summary(str(exc))}") from None


def _check_grammar(kind: str, grammar: str, tokenizer: Any) -> None:
    """``ValueError`` saying what is wrong with a grammar (checked against ``tokenizer``'s
    special tokens when given)."""
    from llguidance import LLMatcher

    error = on_large_stack(LLMatcher.validate_grammar, grammar, tokenizer)
    if error:
        raise ValueError(f"invalid {kind.replace('_', ' ')}: {_summary(error)}")


def _summary(error: str, width: int = 240) -> str:
    """llguidance's message, short: its first line and the line saying what is wrong, without
    the echo that follows (the whole regex or grammar again, or the parser's state: hundreds of
    lines that once reached clients as a 400 message)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return "no reason given"
    said = [line.removeprefix("error:").strip() for line in lines[1:] if line.startswith("error:")]
    parts = [_clip(lines[0], width), *(_clip(line, width) for line in said[:2])]
    return " ".join(parts) if parts[0].endswith(":") else "; ".join(parts)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


# llguidance compiles grammars recursively, one native stack frame per nested rule; a deep enough
# chain overflows the stack and the process dies with SIGSEGV (a $ref chain 1,000 deep did, on an
# 8 MB stack). Compiling on a thread with a large stack (address space, touched only as used)
# makes the request layer's bounds (openai/options.py) safe by a wide margin on every platform,
# whatever stack the calling thread has.
COMPILE_STACK_BYTES = 256 * 1024 * 1024
_compile_lock = threading.Lock()
_compile_pool: Any = None


def on_large_stack(function: Any, *args: Any) -> Any:
    """``function(*args)`` on the compile thread (its stack: ``COMPILE_STACK_BYTES``)."""
    global _compile_pool
    with _compile_lock:
        if _compile_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            previous = threading.stack_size(COMPILE_STACK_BYTES)
            try:
                pool = ThreadPoolExecutor(2, thread_name_prefix="macbatch-compile")
                for ready in [pool.submit(int) for _ in range(2)]:  # start both threads now
                    ready.result()
            finally:
                threading.stack_size(previous)
            _compile_pool = pool
    return _compile_pool.submit(function, *args).result()


class ConstraintState:
    """One request's grammar matcher. It advances with accepted answer tokens only, so it
    survives preemption and recompute unchanged (they replay no sampling); while the request's
    reasoning block is open it neither masks nor advances.

    While the model may still open its reasoning block (``Phase.MAYBE``) the mask is the
    grammar's plus the start marker's next token. A token that could begin either (harmony's
    ``<|channel|>`` opens both the analysis and a tool call's commentary channel) is consumed by
    the grammar tentatively, and rolled back if the marker completes; once a token is the
    marker's only, the rest of the marker is forced. ``own_channel``: the grammar writes its
    channel header itself (``StructuredOutput.own_channel``), so after the reasoning only the new
    message's start is forced, not the final channel's header.
    """

    def __init__(
        self, matcher: Any, reasoning: ReasoningTracker | None = None, own_channel: bool = False
    ) -> None:
        self.matcher = matcher
        self.reasoning = reasoning
        self._header: tuple[int, ...] = ()  # forced after the reasoning, before the grammar
        if reasoning is not None:
            fmt = reasoning.format
            self._header = fmt.message_start_ids if own_channel else fmt.answer_header_ids
        self._tentative = 0  # tokens of a maybe-reasoning prefix the grammar consumed
        self._marker_only = False  # that prefix has a token the grammar refused

    @property
    def masks(self) -> bool:
        return self.reasoning is None or self.reasoning.phase is not Phase.REASONING

    def forced_token(self, num_generated: int) -> int | None:
        """The one token allowed next: the rest of a reasoning start marker the grammar cannot
        follow, or the header due after the reasoning (harmony's final channel); the grammar
        starts after it."""
        if self.reasoning is None:
            return None
        if self._marker_only:
            return self.reasoning.next_start_token(num_generated)
        return self.reasoning.header_token(num_generated, self._header)

    def adjust_mask(self, words: np.ndarray, num_generated: int) -> None:
        """Let a model that may still open its reasoning block do so."""
        token = self.reasoning.next_start_token(num_generated) if self.reasoning else None
        if token is not None:
            _allow(words, token)

    def accept(self, token: int, before: Phase, index: int) -> str | None:
        """Advance by a token appended at output position ``index`` (``before``: the phase it
        was sampled in); an error message if the grammar rejects it."""
        after = self.reasoning.phase if self.reasoning else Phase.ANSWER
        if before is Phase.MAYBE and after is not Phase.ANSWER:
            self._maybe_reasoning(token, after)
            return None
        self._tentative = 0  # a maybe-reasoning prefix, if any, was the answer's start
        if before is Phase.REASONING or after is not Phase.ANSWER:
            return None
        if self.reasoning and self.reasoning.header_token(index, self._header) is not None:
            return None  # the header: not the grammar's
        if self.matcher.is_stopped():  # complete: only EOS is allowed, and ignore_eos keeps it
            return None
        if not self.matcher.consume_token(token):
            return f"the constraint rejected token {token}: {_summary(self.matcher.get_error())}"
        return None

    def _maybe_reasoning(self, token: int, after: Phase) -> None:
        """A token of the reasoning start marker: the grammar takes it too while it can; the
        marker completed, the grammar forgets the prefix and waits for the reasoning's end."""
        if after is Phase.REASONING:
            if self._tentative:
                self.matcher.rollback(self._tentative)
            self._tentative, self._marker_only = 0, False
        elif not self._marker_only and self.matcher.try_consume_tokens([token]) == 1:
            self._tentative += 1
        else:
            self._marker_only = True


# llguidance tokenizers by HF tokenizer (weakly) and (vocabulary, EOS ids): engines that share a
# tokenizer object (tests, a reloaded engine) build the index once.
_LL_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple, Any]] = weakref.WeakKeyDictionary()


def _ll_tokenizer(hf_tokenizer: Any, vocab_size: int, eos: list[int]) -> Any:
    import llguidance.hf

    built = _LL_TOKENIZERS.setdefault(hf_tokenizer, {})
    key = (vocab_size, tuple(eos))
    if key not in built:
        built[key] = llguidance.hf.from_tokenizer(
            hf_tokenizer, n_vocab=vocab_size, eos_token=eos or None
        )
    return built[key]


class ConstraintCompiler:
    """Builds matchers for one tokenizer; llguidance's tokenizer index (about 1-3 s for a
    150k vocabulary) is built on first use, so engines that never see a constraint never pay."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None
        self._executor: Any = None
        self._valid: set[str] = set()  # grammars already checked against this tokenizer
        self.mask_seconds = 0.0  # time spent filling masks (benchmarks read it)
        self.mask_steps = 0

    @property
    def ready(self) -> bool:
        """Whether the tokenizer index is built (no constrained request has to wait for it)."""
        return self._ll_tokenizer is not None

    def prepare(self) -> None:
        """Build the tokenizer index now (a server does it on a worker thread, so its event
        loop never waits the 1-3 s)."""
        _ = self.ll_tokenizer

    @property
    def ll_tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance

                self._ll_tokenizer = _ll_tokenizer(self._hf_tokenizer, self.vocab_size, self._eos)
                self._executor = llguidance.LLExecutor()
            return self._ll_tokenizer

    def compile(self, spec: StructuredOutput) -> Any:
        """A fresh matcher for ``spec``; ``ValueError`` saying what is wrong if it is invalid."""
        from llguidance import LLMatcher

        grammar = spec.llguidance_grammar()
        tokenizer = self.ll_tokenizer
        if grammar not in self._valid:
            _check_grammar(spec.kind, grammar, tokenizer)
            self._valid.add(grammar)
        matcher = on_large_stack(functools.partial(LLMatcher, log_level=0), tokenizer, grammar)
        if matcher.is_error():
            error = _summary(matcher.get_error())
            raise ValueError(f"invalid {spec.kind.replace('_', ' ')}: {error}")
        return matcher

    def mask_logits(
        self, logits: mx.array, states: list[ConstraintState | None], generated: list[int]
    ) -> mx.array:
        """``logits [R, V]`` with disallowed tokens at -inf in the rows that have a constraint.

        ``generated[i]``: how many tokens row i's request has generated. Starts the forward on
        the device, fills the masks on the CPU meanwhile, then applies them.
        """
        masked = {i: s for i, s in enumerate(states) if s is not None and s.masks}
        if not masked:
            return logits
        from llguidance.numpy import fill_next_token_bitmask_par

        mx.async_eval(logits)
        started = time.perf_counter()
        words = np.full((len(states), (self.vocab_size + 31) // 32), -1, dtype=np.int32)
        forced = {i: s.forced_token(generated[i]) for i, s in masked.items()}
        matchers = [(s.matcher, i) for i, s in masked.items() if forced[i] is None]
        if matchers:
            fill_next_token_bitmask_par(self._executor, matchers, words)
        for i, state in masked.items():
            if (token := forced[i]) is not None:
                words[i] = 0
                _allow(words[i], token)
            else:
                state.adjust_mask(words[i], generated[i])
        self.mask_seconds += time.perf_counter() - started
        self.mask_steps += 1
        return apply_bitmask(logits, words)


def _allow(words: np.ndarray, token: int) -> None:
    """Set ``token``'s bit in one row of 32-bit mask words."""
    words[token // 32] |= np.uint32(1 << (token % 32)).view(np.int32)


def apply_bitmask(logits: mx.array, words: np.ndarray) -> mx.array:
    """``logits [R, V]`` with -inf where ``words [R, ceil(V/32)]`` (int32; bit j of word w is
    token 32*w + j) has a 0 bit.

    The host expands the bits to one byte per token (``np.unpackbits``, about 0.3 ms for 32 rows
    of a 152k vocabulary, done while the forward runs) and the device does one fused
    compare-and-select. On MLX's CPU backend that measured 5-10x cheaper than expanding the bits
    with device ops (a shift/and/select over [32, 152k] logits took 15-30 ms: the unfused
    ``where`` is a scalar loop). Rows without a constraint have all bits set and pass through
    unchanged.
    """
    # As little-endian bytes (a no-op on Apple silicon and x86), bit j of a word is bit j % 8
    # of its byte j // 8: what bitorder="little" reads.
    little = words.astype("<i4", copy=False).view(np.uint8)
    allowed = np.unpackbits(little, axis=-1, count=logits.shape[-1], bitorder="little")
    return _select_allowed(mx.array(allowed), logits)


@functools.partial(mx.compile, shapeless=True)
def _select_allowed(allowed: mx.array, logits: mx.array) -> mx.array:
    """``logits`` where ``allowed`` (uint8) is nonzero, else -inf: compiled, so the compare and
    the select run as one fused elementwise kernel."""
    return mx.where(allowed > 0, logits, -mx.inf)
