"""Fitting a long chat into the context: the oldest whole turns go first, no more than needed."""

from __future__ import annotations

from macbatch.tui.context_window import fit_to_context, reply_room


def chat(turns: int, system: bool = True) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "Be brief."}] if system else []
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"a{i}"},
        ]
    return [*messages, {"role": "user", "content": "last"}]


def length(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"]) + 3 for m in messages)


def brute_force(messages, limit):
    """The oracle: try every cut from the oldest turn on, one by one."""
    head = 1 if messages[0]["role"] == "system" else 0
    for start in range(head, len(messages)):
        candidate = messages[:head] + messages[start:]
        if messages[start]["role"] == "user" and length(candidate) <= limit:
            return candidate, start - head
    return messages[:head] + messages[-1:], len(messages) - 1 - head


def test_a_chat_that_fits_is_sent_whole():
    messages = chat(3)
    assert fit_to_context(messages, length, length(messages)) == (messages, 0)


def test_the_oldest_whole_turns_go_first_and_no_more_than_needed():
    for system in (True, False):
        messages = chat(20, system)
        for limit in range(10, length(messages) + 5, 7):
            fitted, left_out = fit_to_context(messages, length, limit)
            assert (fitted, left_out) == brute_force(messages, limit), limit
            assert fitted[-1]["content"] == "last"
            assert (fitted[0]["role"] == "system") == system


def test_the_room_kept_for_a_reply():
    assert reply_room(512, 512) == 128  # the demo: a quarter of its context
    assert reply_room(256, 32768) == 256
    assert reply_room(512, 2) == 1
