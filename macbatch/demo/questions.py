"""The held-out demo question set (jobs/data/demo_questions.jsonl): build, write and read it.

Regenerate the shipped file with `python -m macbatch.demo.questions`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from macbatch.demo.conversation import chat_messages, draw_histories
from macbatch.demo.tasks import TASKS, Example, sample

QUESTIONS_PATH = Path(__file__).resolve().parents[2] / "jobs" / "data" / "demo_questions.jsonl"
PER_TASK = 200
SEED = 2024


def held_out_examples(rng: random.Random, per_task: int) -> list[Example]:
    """`per_task` distinct held-out examples of every task, task by task."""
    examples: list[Example] = []
    for task in TASKS:
        seen: set[str] = set()
        while len(seen) < per_task:
            example = sample(task, rng, held_out=True)
            if example.key not in seen:
                seen.add(example.key)
                examples.append(example)
    return examples


def write_question_set(path: Path, per_task: int = PER_TASK, seed: int = SEED) -> int:
    """Write the question set as JSON lines; returns the count.

    Each row has id, task, question, expected (the exact reply), answer (the bare answer in it:
    what a JSON reply carries) and `messages`: the same question asked as turn 5 of a conversation
    whose four earlier turns are other held-out questions, answered correctly.
    """
    rng = random.Random(seed)
    examples = held_out_examples(rng, per_task)
    histories = draw_histories(examples, rng)
    lines = [
        json.dumps(
            {
                "id": f"{e.task}-{i % per_task:03d}",
                "task": e.task,
                "question": e.question,
                "expected": e.answer,
                "answer": e.value,
                "messages": chat_messages(history, e.question),
            }
        )
        for i, (e, history) in enumerate(zip(examples, histories))
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def read_rows(path: Path = QUESTIONS_PATH) -> list[dict]:
    """The question set's rows as written."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_question_set(path: Path = QUESTIONS_PATH) -> list[Example]:
    """The question set as Examples (key is the row id)."""
    return [
        Example(r["task"], r["id"], r["question"], r["expected"], r["answer"])
        for r in read_rows(path)
    ]


if __name__ == "__main__":
    count = write_question_set(QUESTIONS_PATH)
    print(f"wrote {count} questions to {QUESTIONS_PATH}")
