"""A reply's text, detokenized from its tokens when it is read rather than when they arrive.

Incremental detokenization is the biggest per-token host cost of a step (a third of it or more),
so the engine thread does it only where it must: for a request with stop strings, whose text has
to be matched as tokens arrive. Every other request's text is detokenized by whoever reads an
output's ``text`` / ``new_text`` (a stream's consumer on its own thread, or nobody at all when
only the final output is read), off the engine's critical path.

Each output is a *mark*: the number of tokens it covers, and how much text it shows. A mark made
by the engine thread with a known visible end (stop strings hold text back) is fixed; one made
without is resolved when read, in order, as all the text of its tokens. A lock serializes the
engine thread and readers.

A reasoning model's mark also carries the split of its text into reasoning and answer as of that
output (``reasoning.ReasoningSplit``: the tracker's state then), applied when the text is read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

# (reasoning, answer) of a reply's text; reasoning is None when the reply has none.
Split = Callable[[str], tuple[str | None, str]]


@dataclass(slots=True)
class _Mark:
    num_tokens: int
    final: bool
    end: int | None  # characters shown; None: all of its tokens' text, resolved when read
    split: Split | None  # None: all of the text is the answer


class ReplyText:
    def __init__(self, detokenizer: Any, tokens: list[int]) -> None:
        self._detokenizer = detokenizer
        self._tokens = tokens  # the request's output tokens (appended by the engine thread)
        self._lock = threading.Lock()
        self._fed = 0
        self._finalized = False
        self._stopped = False
        self._text = ""
        self._marks: list[_Mark] = []
        self._resolved = 0

    def current(self, final: bool = False) -> str:
        """The text of every token so far (engine thread: stop-string matching)."""
        with self._lock:
            self._feed(len(self._tokens), final)
            return self._text

    def cut(self, length: int) -> None:
        """End the text at ``length`` characters (where a stop string starts); no later token
        or flush changes it."""
        with self._lock:
            self._text = self._text[:length]
            self._stopped = True

    def mark(
        self, num_tokens: int, final: bool, end: int | None = None, split: Split | None = None
    ) -> int:
        """Register an output covering ``num_tokens`` tokens that shows ``end`` characters (None:
        all of their text), split by ``split``; returns its index for ``parts``."""
        with self._lock:
            self._marks.append(_Mark(num_tokens, final, end, split))
            return len(self._marks) - 1

    def parts(self, index: int) -> tuple[str | None, str]:
        """(reasoning, answer) of output ``index``."""
        with self._lock:
            return self._parts(index)

    def new_parts(self, index: int) -> tuple[str, str]:
        """What output ``index`` adds to the previous one's reasoning and answer."""
        with self._lock:
            reasoning, answer = self._parts(index)
            before, answered = self._parts(index - 1) if index else (None, "")
            return (reasoning or "")[len(before or "") :], answer[len(answered) :]

    def _parts(self, index: int) -> tuple[str | None, str]:
        end = self._end(index)  # may detokenize more: read the text after it
        text = self._text[:end]
        split = self._marks[index].split
        return split(text) if split is not None else (None, text)

    def _end(self, index: int) -> int:
        while self._resolved <= index:
            mark = self._marks[self._resolved]
            if mark.end is None:
                self._feed(mark.num_tokens, mark.final)
                mark.end = len(self._text)
            if self._resolved:  # never show less than an earlier output did
                mark.end = max(mark.end, self._marks[self._resolved - 1].end or 0)
            self._resolved += 1
        end = self._marks[index].end
        assert end is not None
        return end

    def _feed(self, num_tokens: int, final: bool) -> None:
        if self._stopped:
            return
        if self._fed < num_tokens:
            for token in self._tokens[self._fed : num_tokens]:
                self._detokenizer.add_token(token)
            self._fed = num_tokens
            self._text = self._detokenizer.text
        if final and not self._finalized:
            self._detokenizer.finalize()
            self._finalized = True
            self._text = self._detokenizer.text


class TextView(NamedTuple):
    """What one output shows of its reply's text."""

    reply: ReplyText
    mark: int  # ReplyText.mark's: how far this output reads the reply

    @property
    def text(self) -> str:
        return self.reply.parts(self.mark)[1]

    @property
    def new_text(self) -> str:
        return self.reply.new_parts(self.mark)[1]

    @property
    def reasoning(self) -> str | None:
        return self.reply.parts(self.mark)[0]

    @property
    def new_reasoning(self) -> str:
        return self.reply.new_parts(self.mark)[0]


class FixedText(NamedTuple):
    """Text known when the output is made (an engine failure's outputs have none)."""

    text: str = ""
    new_text: str = ""
    reasoning: str | None = None
    new_reasoning: str = ""


NO_TEXT = FixedText()
