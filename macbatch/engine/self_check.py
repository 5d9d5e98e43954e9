"""The load-time self-check: a short prompt through the packed paged step and through the model
library's own forward (mlx-lm's model on mlx-lm's own cache), their log-probabilities compared.

Why at load: the adapter runs an unmodified library model through hooks and page-backed caches,
and a module whose layers do something the hooks do not see (a new architecture upstream, a KV
layout of its own) would otherwise answer wrong without a sign. A mismatch refuses the model,
naming the first decoder layer whose output differs (found by recording every layer's output on
both paths, only when the logits disagree). ``EngineConfig.self_check`` (``--no-self-check``)
skips it; docs/models.md gives its cost.

What is compared: the log-probabilities (logits less their log-sum-exp) of the engine's top
tokens at each of a few greedy steps, the prompt's prefill and its decode steps, against the
library's at the same token ids; a greedy choice that differs is a mismatch unless the library
itself holds the two tokens within the tolerance (a near-tie). The tolerance follows the
activations' dtype and the page format (``tolerance``). With fp8 indexer keys
(``EngineConfig.indexer_keys``) the library's caches round every indexer key they are handed
through that format first (``model/library_keys.py``: every family whose indexer the engine
pages), so both paths select over the same keys: a rounding that reorders two scores is the
format's choice, not a mismatch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx
import mlx.nn as nn

from macbatch.engine.core.outputs import FinishReason
from macbatch.engine.inputs.prompt import PromptInput
from macbatch.engine.model.library_keys import round_indexer_keys
from macbatch.engine.sample.params import SamplingParams
from macbatch.engine.stores.fp8_keys import round_trip

if TYPE_CHECKING:
    from collections.abc import Sequence

    from macbatch.engine.config import EngineConfig
    from macbatch.engine.core.outputs import RequestOutput
    from macbatch.engine.kv.manager import KVManager
    from macbatch.engine.worker.model_runner import ModelRunner


class CheckedEngine(Protocol):
    """What the check needs of the engine (``engine.Engine``, which imports this module)."""

    runner: ModelRunner
    config: EngineConfig
    kv: KVManager

    def generate(
        self, prompts: Sequence[PromptInput], params: SamplingParams
    ) -> list[RequestOutput]: ...

    def reset_counts(self) -> None: ...


PROMPT_TOKENS = 12
STEPS = 4  # greedy tokens compared: the prefill's, then three decode steps'
TOP = 8  # the engine's top tokens compared at each step
# Log-probability tolerance by activation dtype. float32: the paged kernel and mlx-lm's SDPA sum
# in different orders; 1e-4 is the most the parity tests measure (tests/support/oracle.py), 1e-3
# leaves a margin. Half precision: a logit of magnitude ~30 rounds by 30 * 2^-11 (float16) or
# 30 * 2^-8 (bfloat16) at each of the last ops alone, so a few roundings' worth; a broken
# layer moves log-probabilities by whole units.
_DTYPE_TOLERANCE = {mx.float32: 1e-3, mx.float16: 0.05, mx.bfloat16: 0.25}
# quantized pages: the engine attends over rounded K/V, the library over exact ones (the demo
# model measures 0.039 with 8-bit pages, 0.46 with 4-bit ones)
_KV_BITS_TOLERANCE = {None: 0.0, 8: 0.1, 4: 1.0}
# a layer's output differs when its largest difference passes this share of its largest value
_LAYER_TOLERANCE = {mx.float32: 1e-3, mx.float16: 2e-2, mx.bfloat16: 1e-1}


@dataclass(frozen=True)
class SelfCheck:
    """What the check found: ``problem`` is why the model is refused (None: it passed)."""

    worst: float  # the largest log-probability difference compared
    tolerance: float
    seconds: float
    problem: str | None = None

    @property
    def passed(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        """One line for logs and ``macbatch doctor``."""
        verdict = "passed" if self.passed else f"failed: {self.problem}"
        return (
            f"{verdict} (log-probabilities within {self.worst:.1e} of the library's, tolerance "
            f"{self.tolerance:.0e}; {STEPS} greedy tokens after a {PROMPT_TOKENS}-token prompt, "
            f"{self.seconds:.2f} s)"
        )


def tolerance(dtype: mx.Dtype, kv_bits: int | None) -> float:
    return _DTYPE_TOLERANCE.get(dtype, _DTYPE_TOLERANCE[mx.bfloat16]) + _KV_BITS_TOLERANCE[kv_bits]


def self_check(engine: CheckedEngine) -> SelfCheck:
    """Run the check on a freshly built engine (no request queued); the engine is left as it
    was: its counts are zeroed, and nothing the check computed enters the prefix cache."""
    started = time.perf_counter()
    runner = engine.runner
    model = runner.adapter.model
    tol = tolerance(runner.adapter.kv_dtype, engine.config.kv_bits)
    prompt = check_prompt(runner.vocab_size)
    worst, problem = 0.0, None
    with _prefix_cache_off(engine):
        try:
            worst, problem = _compare(engine, model, prompt, tol)
        except Exception as exc:  # a forward that raises: a refusal with its reason, no crash
            problem = f"the packed step or the library's forward raised {type(exc).__name__}: {exc}"
        if problem is not None:
            problem += _first_layer(engine, model, runner.adapter.kv_dtype)
    engine.reset_counts()
    return SelfCheck(worst, tol, time.perf_counter() - started, problem)


def check_prompt(vocab_size: int, shift: int = 0) -> list[int]:
    """A fixed prompt spread over the vocabulary (``shift``: another one as long)."""
    return [(i * 7919 + 17 + shift) % vocab_size for i in range(PROMPT_TOKENS)]


def _compare(
    engine: CheckedEngine, model: nn.Module, prompt: list[int], tol: float
) -> tuple[float, str | None]:
    """The largest log-probability difference, and the mismatch (None: none)."""
    params = SamplingParams(
        max_tokens=STEPS, temperature=0, ignore_eos=True, logprobs=TOP, speculative=False
    )
    (out,) = engine.generate([PromptInput(prompt)], params)
    if out.finish_reason == FinishReason.ERROR:
        return 0.0, f"the packed step failed: {out.error}"
    assert out.top_logprobs is not None
    worst = 0.0
    library = library_logprobs(model, prompt, _library_caches(engine, model))
    steps = zip(library, out.token_ids, out.top_logprobs)
    for step, (want, token, mine) in enumerate(steps):
        diffs = [abs(lp - float(want[t])) for t, lp in mine.items()]
        worst = max(worst, *diffs)
        best = int(mx.argmax(want))
        if token != best:
            margin = float(want[best] - want[token])
            if margin > tol:
                return worst, (
                    f"greedy token {step} is {token}, the library's {best} (which it prefers by "
                    f"{margin:.3f} in log-probability)"
                )
            break  # a near-tie: the steps after it continue different sequences
    if worst > tol:
        return worst, f"log-probabilities differ from the library's by up to {worst:.3g}"
    return worst, None


def library_logprobs(model: nn.Module, prompt: list[int], cache: list[Any]) -> Iterator[mx.array]:
    """The library's own greedy generation: each step's log-probabilities (mlx-lm's
    ``generate_step`` on ``cache``, a fresh one of the library's own: the adapter's
    ``library_caches``, DeepSeek V4's kept as its reference keeps them)."""
    from mlx_lm.generate import generate_step

    steps = generate_step(mx.array(prompt), _Logits(model), max_tokens=STEPS, prompt_cache=cache)
    for _, logprobs in steps:
        yield logprobs.astype(mx.float32)


def _library_caches(engine: CheckedEngine, model: nn.Module) -> list[Any]:
    """A fresh library cache for one request, its indexer keys in the engine's format."""
    caches = engine.runner.adapter.library_caches()
    if engine.config.indexer_keys == "fp8":
        round_indexer_keys(_layers(engine, model) or [], caches, round_trip)
    return caches


class _Logits(nn.Module):
    """A model whose forward returns its logits, where mlx-vlm's return them in an output
    record (``LanguageModelOutput``: Hunyuan V4's), for mlx-lm's ``generate_step``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        out = self.model(*args, **kwargs)
        return getattr(out, "logits", out)


@contextlib.contextmanager
def _prefix_cache_off(engine: CheckedEngine) -> Iterator[None]:
    """No prefix-cache reads or names (nor disk-tier copies) while the check runs: its prompt
    must run through the step, and leave nothing a user's request could hit."""
    kv = engine.kv
    root, disk = kv.prefix_root, kv.disk
    kv.prefix_root, kv.disk = None, None
    try:
        yield
    finally:
        kv.prefix_root, kv.disk = root, disk


class _Recorder:
    """A decoder layer that keeps its output of every call (attributes: the layer's)."""

    def __init__(self, layer: nn.Module, outputs: list[mx.array]) -> None:
        self._layer = layer
        self._outputs = outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._layer(*args, **kwargs)
        self._outputs.append(out if isinstance(out, mx.array) else out[0])
        return out


@contextlib.contextmanager
def _recording(layers: list[Any]) -> Iterator[list[list[mx.array]]]:
    """Every layer of ``layers`` (the model's own list, changed in place) recorded."""
    originals = list(layers)
    outputs: list[list[mx.array]] = [[] for _ in layers]
    layers[:] = [_Recorder(layer, out) for layer, out in zip(originals, outputs)]
    try:
        yield outputs
    finally:
        layers[:] = originals


def _layers(engine: CheckedEngine, model: nn.Module) -> list[Any] | None:
    """The model's decoder layers (its own list, or its inner model's; None: neither)."""
    layers = getattr(model, "layers", None)
    if isinstance(layers, list):
        return layers
    inner = getattr(engine.runner.adapter.inner, "layers", None)
    return inner if isinstance(inner, list) else None


def _first_layer(engine: CheckedEngine, model: nn.Module, dtype: mx.Dtype) -> str:
    """``; the first layer whose output differs is layer N (Class)``, or why none was named
    (recorded on another prompt as long, with one token sampled: the prefill alone)."""
    layers = _layers(engine, model)
    if layers is None:
        return ""
    other = check_prompt(engine.runner.vocab_size, 1)
    once = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, speculative=False)
    try:
        with _recording(layers) as paged:
            engine.generate([PromptInput(other)], once)
        with _recording(layers) as library:
            model(mx.array([other]), cache=_library_caches(engine, model))
    except Exception:  # a model that will not run with its layers wrapped: the reason stands
        return ""
    limit = _LAYER_TOLERANCE.get(dtype, _LAYER_TOLERANCE[mx.bfloat16])
    for index, (mine, want) in enumerate(zip(paged, library)):
        if not mine or len(want) != 1:  # a layer called more than once per forward: not told
            continue
        a = mx.concatenate([x.reshape(-1, x.shape[-1]) for x in mine]).astype(mx.float32)
        b = want[0].reshape(-1, want[0].shape[-1]).astype(mx.float32)
        if a.shape != b.shape:
            continue
        scale = max(float(mx.abs(b).max()), 1e-6)
        if float(mx.abs(a - b).max()) > limit * scale:
            name = type(layers[index]).__name__
            return f"; the first layer whose output differs is layer {index} ({name})"
    return "; no layer's output differs on its own (the head, or the decode steps, differ)"
