"""Score a demo model on the whole held-out question set, turn 1 and turn 5, and check that the
engine gives exactly mlx-lm's greedy replies on every question.

    python scripts/check_demo_model.py [MODEL_DIR]      # default: the shipped demo model

Prints accuracy per task and turn (engine, greedy), the number of replies where the engine and
mlx-lm's batch_generate differ (must be 0), accuracy at the chat's default temperature, and
accuracy of the same questions asked for JSON under the JSON shape the training script can teach
(`--chat-json`; near 0 for weights not taught it).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from macbatch.demo import MODEL_DIR  # noqa: E402
from macbatch.demo.checker import accuracy_by_task  # noqa: E402
from macbatch.demo.questions import read_question_set, read_rows  # noqa: E402
from macbatch.demo.tasks import JSON_SCHEMA, json_question  # noqa: E402
from macbatch.session_settings import SessionSettings  # noqa: E402

MAX_TOKENS = 32
JSON_MAX_TOKENS = 96  # {"reply": "In order: ...", ...}: a token per character


def engine_replies(engine, chats, params) -> list[str]:
    ids = [engine.add_request(chat, params) for chat in chats]
    finals: dict[str, str] = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o.text for o in engine.step() if o.finished})
    return [finals[i] for i in ids]


def shown(accuracy: dict[str, float]) -> str:
    return " ".join(f"{task} {value:.3f}" for task, value in accuracy.items())


def main() -> None:
    from mlx_lm import load
    from mlx_lm.generate import batch_generate

    from macbatch.engine import Engine, SamplingParams, StructuredOutput

    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else MODEL_DIR
    examples = read_question_set()
    fifth = [row["messages"] for row in read_rows()]
    chats = {"turn 1": [[{"role": "user", "content": e.question}] for e in examples]}
    chats["turn 5"] = fifth
    model, tokenizer = load(str(model_dir))
    engine = Engine.load(str(model_dir))
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    for turn, turn_chats in chats.items():
        prompts = [tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in turn_chats]
        reference = batch_generate(model, tokenizer, prompts, max_tokens=MAX_TOKENS).texts
        replies = engine_replies(engine, turn_chats, greedy)
        differ = sum(a != b for a, b in zip(replies, reference))
        print(f"{turn} greedy: {shown(accuracy_by_task(examples, replies))}")
        print(f"{turn} engine replies that differ from mlx-lm's: {differ} of {len(replies)}")
    temperature = SessionSettings().temperature
    sampled = SamplingParams(temperature=temperature, seed=0, max_tokens=MAX_TOKENS)
    for turn, turn_chats in chats.items():
        accuracy = accuracy_by_task(examples, engine_replies(engine, turn_chats, sampled))
        print(f"{turn} at temperature {temperature:g}: {shown(accuracy)}")
    constrained = SamplingParams(
        temperature=0,
        max_tokens=JSON_MAX_TOKENS,
        structured=StructuredOutput(json_schema=JSON_SCHEMA),
    )
    as_json = [e.as_json() for e in examples]
    for turn, turn_chats in chats.items():
        asked = [
            [*chat[:-1], {"role": "user", "content": json_question(chat[-1]["content"])}]
            for chat in turn_chats
        ]
        accuracy = accuracy_by_task(as_json, engine_replies(engine, asked, constrained))
        print(f"{turn} asked for JSON (schema, greedy): {shown(accuracy)}")


if __name__ == "__main__":
    main()
