"""The one error a bad OpenAI request body raises, whichever front end received it: ``serve``
answers it as a 400 with ``param``, ``run`` writes it to the job's errors file with the row's line
number."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request field that cannot be honoured; ``param`` names it (OpenAI's error ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
