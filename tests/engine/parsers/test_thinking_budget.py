"""A thinking budget (``SamplingParams.thinking_token_budget``) with the real Qwen3 tokenizer and
template, as Qwen3's thinking releases ship it (the generation prompt opens ``<think>``), over a
tiny random model, which never closes its reasoning itself: at the budget the engine writes
``</think>`` and the answer follows; without one nothing changes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from macbatch.engine import (
    Engine,
    EngineConfig,
    InvalidSamplingParam,
    PromptInput,
    SamplingParams,
)
from tests.support.real_tokenizers import (
    TOKENIZERS,
    generation_eos_ids,
    model_for,
    open_reasoning,
)

CHAT = [{"role": "user", "content": "Why is the sky blue?"}]


def _engine(directory: Path, pipelined: bool) -> Engine:
    from mlx_lm.utils import load_tokenizer

    shutil.copytree(TOKENIZERS / "qwen3", directory)
    tokenizer = load_tokenizer(open_reasoning(directory), eos_token_ids=generation_eos_ids("qwen3"))
    config = EngineConfig(num_blocks=32, block_size=16, pipelined=pipelined)
    return Engine(model_for("qwen3"), tokenizer, config)


@pytest.fixture(scope="module", params=[True, False], ids=["pipelined", "serial"])
def qwen3(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return _engine(tmp_path_factory.mktemp("tokenizer") / "qwen3", request.param)


def _end_id(engine: Engine) -> int:
    [end] = engine.tokenizer.encode("</think>", add_special_tokens=False)
    return end


def test_the_prompt_opens_the_reasoning(qwen3: Engine) -> None:
    text = qwen3.tokenizer.decode(qwen3.encode_prompt(CHAT))
    assert text.endswith("<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize("budget", [0, 1, 5, 12])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reasoning_ends_at_the_budget_and_an_answer_follows(
    qwen3: Engine, budget: int, temperature: float
) -> None:
    params = SamplingParams(
        max_tokens=budget + 8, temperature=temperature, seed=7, ignore_eos=True,
        thinking_token_budget=budget,
    )  # fmt: skip
    [out] = qwen3.generate([CHAT], params)
    end = _end_id(qwen3)
    ids = list(out.token_ids)
    assert len(ids) == budget + 8
    assert ids[budget] == end and end not in ids[:budget]
    tokenizer = qwen3.tokenizer
    assert out.reasoning == tokenizer.decode(ids[:budget]).lstrip("\n")
    assert out.text == tokenizer.decode(ids[budget + 1 :]).lstrip("\n")
    assert out.text  # seven answer tokens: the random model writes some text


def test_without_a_budget_nothing_changes(qwen3: Engine) -> None:
    """Greedy, the budget changes nothing before it; without one the reply only reasons."""
    free = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    [plain] = qwen3.generate([CHAT], free)
    [budgeted] = qwen3.generate([CHAT], SamplingParams(
        max_tokens=20, temperature=0, ignore_eos=True, thinking_token_budget=6
    ))  # fmt: skip
    assert _end_id(qwen3) not in plain.token_ids
    assert plain.text == "" and plain.reasoning
    assert list(budgeted.token_ids)[:6] == list(plain.token_ids)[:6]
    # a budget larger than the reply never fires
    [large] = qwen3.generate([CHAT], SamplingParams(
        max_tokens=20, temperature=0, ignore_eos=True, thinking_token_budget=50
    ))  # fmt: skip
    assert list(large.token_ids) == list(plain.token_ids)


def test_a_batch_mixes_budgets(qwen3: Engine) -> None:
    budgets = [None, 2, 9, 0]
    params = [
        SamplingParams(max_tokens=14, temperature=0, ignore_eos=True, thinking_token_budget=b)
        for b in budgets
    ]
    outs = qwen3.generate([CHAT] * len(budgets), params)
    end = _end_id(qwen3)
    for budget, out in zip(budgets, outs, strict=True):
        ids = list(out.token_ids)
        assert (ids.index(end) if end in ids else None) == budget


def test_no_reasoning_ignores_the_budget(qwen3: Engine) -> None:
    """``enable_thinking=False`` writes an empty block: the answer comes at once, untouched."""
    off = {"enable_thinking": False}
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    [plain] = qwen3.generate([PromptInput(CHAT, off)], params)
    budget = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, thinking_token_budget=0)
    [out] = qwen3.generate([PromptInput(CHAT, off)], budget)
    assert list(out.token_ids) == list(plain.token_ids)
    assert out.reasoning is None or out.reasoning == ""


@pytest.mark.parametrize("bad", [-1, 1.5, "3"])
def test_a_bad_budget_is_refused(bad: object) -> None:
    with pytest.raises(InvalidSamplingParam, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=bad)  # type: ignore[arg-type]
