"""The demo tasks: answers agree with the questions, the split is disjoint, the file is current."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

from macbatch.demo.checker import accuracy_by_task, is_correct
from macbatch.demo.questions import (
    PER_TASK,
    QUESTIONS_PATH,
    held_out_examples,
    read_question_set,
    write_question_set,
)
from macbatch.demo.tasks import JSON_SCHEMA, TASKS, is_held_out, json_question, sample
from tests.support.demo_oracle import oracle


@pytest.mark.parametrize("task", list(TASKS))
def test_answers_agree_with_questions(task: str) -> None:
    rng = random.Random(1)
    for held_out in (False, True):
        for _ in range(300):
            example = sample(task, rng, held_out)
            assert example.answer == oracle(task, example.question), example
            assert example.answer.endswith(f" {example.value}."), example


@pytest.mark.parametrize("task", list(TASKS))
def test_json_replies_carry_the_answer_in_the_schema_shape(task: str) -> None:
    rng = random.Random(6)
    for _ in range(100):
        example = sample(task, rng, held_out=False)
        asked = example.as_json()
        assert asked.question == json_question(example.question) == f"In JSON: {example.question}"
        reply = json.loads(asked.answer)
        jsonschema.validate(reply, JSON_SCHEMA)
        assert reply == {"reply": example.answer, "answer": example.value, "task": task}
        assert asked.answer == json.dumps(reply)  # the layout the JSON constraint allows
        assert (asked.task, asked.key) == (example.task, example.key)  # same held-out split


def test_split_is_disjoint_and_about_one_in_ten() -> None:
    rng = random.Random(2)
    train = {sample(task, rng, held_out=False).key for task in TASKS for _ in range(2000)}
    held = {sample(task, rng, held_out=True).key for task in TASKS for _ in range(300)}
    assert not train & held
    draws = [rng.randint(0, 10**6) for _ in range(5000)]
    fraction = sum(is_held_out("add", f"{n}+1") for n in draws) / len(draws)
    assert 0.08 < fraction < 0.12


def test_unknown_task_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown demo task 'multiply'"):
        sample("multiply", random.Random(0), held_out=False)


def test_question_file_is_current_and_well_formed(tmp_path: Path) -> None:
    regenerated = tmp_path / "questions.jsonl"
    write_question_set(regenerated)
    assert regenerated.read_text() == QUESTIONS_PATH.read_text(), (
        "jobs/data/demo_questions.jsonl is stale: run `python -m macbatch.demo.questions`"
    )
    rows = [json.loads(line) for line in QUESTIONS_PATH.read_text().splitlines()]
    assert len(rows) == PER_TASK * len(TASKS)
    fields = {"id", "task", "question", "expected", "answer", "messages"}
    assert all(set(row) == fields for row in rows)
    assert len({row["id"] for row in rows}) == len(rows)
    answers = {row["question"]: row["expected"] for row in rows}
    for row in rows:
        assert row["expected"] == oracle(row["task"], row["question"])
        assert row["expected"].endswith(f" {row['answer']}.")
        # Turn 5: four other questions of the set, each answered correctly, then this one.
        *earlier, last = row["messages"]
        assert last == {"role": "user", "content": row["question"]}
        assert [m["role"] for m in earlier] == ["user", "assistant"] * 4
        pairs = [(q["content"], a["content"]) for q, a in zip(earlier[::2], earlier[1::2])]
        assert all(answers[q] == a and q != row["question"] for q, a in pairs)
    assert [e.question for e in read_question_set()] == [row["question"] for row in rows]


def test_held_out_examples_are_distinct_per_task() -> None:
    examples = held_out_examples(random.Random(3), 25)
    assert len(examples) == 25 * len(TASKS)
    assert len({e.key for e in examples}) == len(examples)
    assert all(is_held_out(e.task, e.key.split(":", 1)[1]) for e in examples)


def test_checker_strips_whitespace_only() -> None:
    assert is_correct("  The answer is 7.\n", "The answer is 7.")
    assert not is_correct("The answer is 7", "The answer is 7.")
    assert not is_correct("the answer is 7.", "The answer is 7.")
    examples = held_out_examples(random.Random(4), 2)
    replies = [e.answer if i % 2 == 0 else "no" for i, e in enumerate(examples)]
    assert accuracy_by_task(examples, replies) == {task: 0.5 for task in TASKS}
    with pytest.raises(ValueError, match="10 examples but 1 replies"):
        accuracy_by_task(examples, replies[:1])
