"""Synthetic question generators shared by the demo model's training script and its question set.

Each task draws a random instance and phrases it as a chat question with one exact reply. The
held-out split is a property of the instance itself (a stable hash of its canonical key), not of a
seed: training never sees a held-out instance, whichever seeds the two sides use.
"""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

HELD_OUT_BUCKETS = 10  # one instance in this many is held out from training
DIGITS = 2  # operands of addition and subtraction have up to this many digits


JSON_REQUEST = "In JSON: "  # put before a question, asks for JSON_SCHEMA's shape
# The JSON shape the training script can teach (--chat-json; not in the shipped weights, whose
# plain replies it cost accuracy: docs/demo-model.md): the usual reply, the bare answer copied
# out of it, then the task. The usual reply comes first and the request before the question so
# that the reply starts as close to the question as a plain one: this model finds its operands by
# their distance, and a request after the question with the task first was learnt half as fast.
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "reply": {"type": "string", "maxLength": 40},
        "answer": {"type": "string", "maxLength": 20},
        "task": {"enum": ["add", "subtract", "reverse", "sort", "count"]},
    },
    "required": ["reply", "answer", "task"],
    "additionalProperties": False,
}


def json_question(question: str) -> str:
    """`question` asked for a reply in JSON_SCHEMA's shape."""
    return JSON_REQUEST + question


@dataclass(frozen=True)
class Example:
    """One question with its exact expected reply."""

    task: str
    key: str  # canonical instance ("add:482+37"): decides the held-out split
    question: str
    answer: str  # the exact reply
    value: str  # the bare answer inside it ("85", "tenalp", "7, 19, 42")

    def as_json(self) -> Example:
        """The same instance asked for JSON, replied in JSON_SCHEMA's shape as ``json.dumps``
        writes it (the layout a JSON constraint allows)."""
        reply = json.dumps({"reply": self.answer, "answer": self.value, "task": self.task})
        return Example(self.task, self.key, json_question(self.question), reply, self.value)


def _number(rng: random.Random, digits: int) -> int:
    """A number with 1..`digits` digits, each length equally likely (small numbers stay common)."""
    length = rng.randint(1, digits)
    return rng.randint(0 if length == 1 else 10 ** (length - 1), 10**length - 1)


def _word(rng: random.Random) -> str:
    """A lowercase letter string of 3..8 letters: a common word half the time."""
    if rng.random() < 0.5:
        return rng.choice(WORDS)
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8)))


def _add(rng: random.Random) -> tuple[str, str, str]:
    a, b = _number(rng, DIGITS), _number(rng, DIGITS)
    question = rng.choice(["What is {a} + {b}?", "Add {a} and {b}.", "Compute {a} + {b}."])
    return f"{a}+{b}", question.format(a=a, b=b), str(a + b)


def _subtract(rng: random.Random) -> tuple[str, str, str]:
    a, b = sorted((_number(rng, DIGITS), _number(rng, DIGITS)), reverse=True)
    question = rng.choice(["What is {a} - {b}?", "Subtract {b} from {a}.", "Compute {a} - {b}."])
    return f"{a}-{b}", question.format(a=a, b=b), str(a - b)


def _reverse(rng: random.Random) -> tuple[str, str, str]:
    word = _word(rng)
    question = rng.choice(["Reverse the word {w}.", "What is {w} spelled backwards?"])
    return word, question.format(w=word), word[::-1]


def _sort(rng: random.Random) -> tuple[str, str, str]:
    numbers = [_number(rng, 2) for _ in range(rng.randint(2, 5))]
    shown = ", ".join(map(str, numbers))
    question = rng.choice(["Sort {n} in ascending order.", "Put {n} in order from smallest."])
    return shown, question.format(n=shown), ", ".join(map(str, sorted(numbers)))


def _count(rng: random.Random) -> tuple[str, str, str]:
    word = _word(rng)
    # Balance the answers (a letter absent, present once, repeated) so 1 is not a safe guess.
    kind = rng.randrange(3)
    absent = sorted(set(string.ascii_lowercase) - set(word))
    if kind == 0:
        letter = rng.choice(absent)
    else:
        letter = rng.choice(word)
        if kind == 2:
            spots = sorted(rng.sample(range(len(word)), k=min(len(word), rng.randint(2, 3))))
            word = "".join(letter if i in spots else c for i, c in enumerate(word))
    question = rng.choice(
        ["How many times does {c} appear in {w}?", "Count the letter {c} in {w}."]
    )
    return f"{letter}@{word}", question.format(c=letter, w=word), str(word.count(letter))


# Each draws (instance key, question, bare answer); REPLIES phrases the answer.
TASKS: dict[str, Callable[[random.Random], tuple[str, str, str]]] = {
    "add": _add,
    "subtract": _subtract,
    "reverse": _reverse,
    "sort": _sort,
    "count": _count,
}

REPLIES = {
    "add": "The answer is {}.",
    "subtract": "The answer is {}.",
    "reverse": "Backwards it is {}.",
    "sort": "In order: {}.",
    "count": "The answer is {}.",
}


# What each task answers, with a question to try: the empty demo chat and the README show these.
SHOWCASE: dict[str, tuple[str, str]] = {
    "add": ("adds two numbers below 100", "What is 48 + 37?"),
    "subtract": ("subtracts a smaller number below 100", "Subtract 37 from 48."),
    "reverse": ("spells a word of 3 to 8 letters backwards", "Reverse the word planet."),
    "sort": ("sorts 2 to 5 numbers below 100", "Sort 42, 7, 19 in ascending order."),
    "count": ("counts a letter in a word", "How many times does a appear in banana?"),
}


def is_held_out(task: str, key: str) -> bool:
    """Whether an instance belongs to the held-out split (stable across runs and machines)."""
    digest = hashlib.blake2b(f"{task}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELD_OUT_BUCKETS == 0


def sample(task: str, rng: random.Random, held_out: bool) -> Example:
    """Draw one example of `task` from the training split or the held-out split."""
    if task not in TASKS:
        raise ValueError(f"unknown demo task {task!r}; known tasks: {', '.join(TASKS)}")
    while True:
        key, question, value = TASKS[task](rng)
        if is_held_out(task, key) == held_out:
            return Example(task, f"{task}:{key}", question, REPLIES[task].format(value), value)


WORDS = [
    "apple",
    "table",
    "water",
    "house",
    "river",
    "green",
    "light",
    "music",
    "paper",
    "stone",
    "bread",
    "chair",
    "cloud",
    "dream",
    "earth",
    "field",
    "glass",
    "heart",
    "horse",
    "lemon",
    "money",
    "night",
    "ocean",
    "piano",
    "plant",
    "queen",
    "radio",
    "smile",
    "snake",
    "sugar",
    "tiger",
    "train",
    "watch",
    "world",
    "zebra",
    "yellow",
    "orange",
    "purple",
    "silver",
    "garden",
    "window",
    "rabbit",
    "monkey",
    "pencil",
    "butter",
    "candle",
    "dragon",
    "flower",
    "forest",
    "friend",
    "island",
    "jacket",
    "kitten",
    "ladder",
    "marble",
    "needle",
    "pepper",
    "planet",
    "rocket",
    "summer",
    "winter",
    "spring",
    "autumn",
    "castle",
    "bridge",
    "market",
    "school",
    "doctor",
    "farmer",
    "letter",
    "number",
    "animal",
    "banana",
    "cherry",
    "grape",
    "melon",
    "peach",
    "mango",
    "tomato",
    "potato",
    "carrot",
    "onion",
    "salad",
    "coffee",
    "cookie",
    "pizza",
    "banjo",
    "violin",
    "guitar",
    "drum",
    "flute",
    "bell",
    "book",
    "desk",
    "door",
    "lamp",
    "ship",
    "boat",
    "car",
    "bus",
    "bike",
    "road",
    "hill",
    "lake",
    "sand",
    "snow",
    "rain",
    "wind",
    "fire",
    "gold",
    "iron",
    "wood",
    "milk",
    "rice",
    "fish",
    "bird",
    "frog",
    "duck",
    "goat",
    "lion",
    "wolf",
    "bear",
    "deer",
    "mouse",
    "whale",
    "shark",
    "eagle",
    "robin",
    "crown",
    "sword",
    "shield",
    "arrow",
    "tower",
    "village",
    "city",
    "storm",
    "thunder",
    "rainbow",
    "computer",
    "keyboard",
    "elephant",
    "giraffe",
    "balloon",
    "penguin",
    "dolphin",
]
