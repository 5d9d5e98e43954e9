"""A thinking budget on the real chat templates of Qwen3.5 (its generation prompt opens
``<think>``) and gpt-oss (harmony: the model opens the analysis channel itself), sampled at
temperature 1 over several seeds, with and without a JSON schema on the answer.

Qwen3.5 runs a tiny random model on the real Qwen3 tokenizer. gpt-oss runs the harmony
stand-in tokenizer (gpt-oss's special tokens; its real tokenizer is not vendored) and a random
bigram model that opens ``<|channel|>analysis<|message|>`` as a real gpt-oss model does, then
says random tokens (tests/support/scripted.py). The reasoning's length is counted in tokens: the
output ids after the opening marker (none for Qwen3.5, whose prompt opens it) up to the first
end marker (``</think>``; harmony's ``<|end|>``)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from macbatch.engine import Engine, EngineConfig, FinishReason, SamplingParams, StructuredOutput
from tests.support.real_templates import gpt_oss_reasoner, read_template
from tests.support.real_tokenizers import TOKENIZERS, generation_eos_ids, model_for
from tests.support.standin import harmony_tokenizer
from tests.support.structured import SKY_SCHEMA as SCHEMA

CHAT = [{"role": "user", "content": "Why is the sky blue?"}]
BUDGETS = [0, 1, 5, 17]
SEEDS = [1, 2, 3]
ANSWER = 8  # answer tokens an unconstrained reply has room for after the budget


@dataclass(frozen=True)
class Family:
    """An engine on one template and the markup the budget must produce with it."""

    engine: Engine
    opening: tuple[int, ...]  # what the model writes to open its reasoning
    end: tuple[int, ...]  # the template's own end of the reasoning
    header: tuple[int, ...]  # what opens the answer after a closed reasoning


def _ids(tokenizer: Any, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def _qwen3_5(directory: Path) -> Family:
    from mlx_lm.utils import load_tokenizer

    shutil.copytree(TOKENIZERS / "qwen3", directory)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = read_template("qwen3_5")
    config_path.write_text(json.dumps(config))
    tokenizer = load_tokenizer(directory, eos_token_ids=generation_eos_ids("qwen3"))
    engine = Engine(model_for("qwen3"), tokenizer, EngineConfig(num_blocks=64, block_size=16))
    return Family(engine, (), _ids(tokenizer, "</think>"), ())


def _gpt_oss() -> Family:
    tokenizer = harmony_tokenizer(read_template("gpt_oss"))
    opening = _ids(tokenizer, "<|channel|>analysis<|message|>")
    config = EngineConfig(num_blocks=64, block_size=16)
    engine = Engine(gpt_oss_reasoner(tokenizer), tokenizer, config)
    header = _ids(tokenizer, "<|start|>assistant<|channel|>final<|message|>")
    return Family(engine, opening, _ids(tokenizer, "<|end|>"), header)


@pytest.fixture(scope="module", params=["qwen3_5", "gpt_oss"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    if request.param == "gpt_oss":
        return _gpt_oss()
    return _qwen3_5(tmp_path_factory.mktemp("tokenizer") / "qwen3_5")


def _find(ids: list[int], pattern: tuple[int, ...], start: int) -> int:
    for i in range(start, len(ids) - len(pattern) + 1):
        if tuple(ids[i : i + len(pattern)]) == pattern:
            return i
    raise AssertionError(f"{pattern} not in {ids[start:]}")


def _check_reasoning(family: Family, out: Any, budget: int) -> int:
    """Asserts the reply opens its reasoning, ends it within ``budget`` tokens, and reports
    those tokens as its reasoning; returns where the answer's own tokens start."""
    ids = list(out.token_ids)
    assert tuple(ids[: len(family.opening)]) == family.opening
    opened = len(family.opening)
    close = _find(ids, family.end, opened)
    assert close - opened <= budget
    tokenizer = family.engine.tokenizer
    # (the streaming detokenizer drops a leading space of a reply's first token)
    assert out.reasoning.strip() == tokenizer.decode(ids[opened:close]).strip()
    answer_from = close + len(family.end)
    if close - opened == budget:  # the engine closed it: the answer's header follows
        assert tuple(ids[answer_from : answer_from + len(family.header)]) == family.header
        answer_from += len(family.header)
    return answer_from


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("budget", BUDGETS)
def test_reasoning_ends_within_the_budget_and_an_answer_follows(
    family: Family, budget: int, seed: int
) -> None:
    room = len(family.opening) + budget + len(family.end) + len(family.header) + ANSWER
    params = SamplingParams(
        max_tokens=room, temperature=1.0, seed=seed, ignore_eos=True,
        thinking_token_budget=budget,
    )  # fmt: skip
    [out] = family.engine.generate([CHAT], params)
    assert len(out.token_ids) == room
    answer_from = _check_reasoning(family, out, budget)
    answer = family.engine.tokenizer.decode(list(out.token_ids)[answer_from:])
    assert out.text.strip() == answer.strip() and out.text


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("budget", BUDGETS)
def test_a_schema_answer_validates(family: Family, budget: int, seed: int) -> None:
    params = SamplingParams(
        max_tokens=budget + 120, temperature=1.0, seed=seed, thinking_token_budget=budget,
        structured=StructuredOutput(json_schema=SCHEMA),
    )  # fmt: skip
    [out] = family.engine.generate([CHAT], params)
    assert out.finish_reason is FinishReason.STOP, out.text
    _check_reasoning(family, out, budget)
    jsonschema.validate(json.loads(out.text), SCHEMA)
