"""The one place where OpenAI request bodies become engine requests and engine outputs become
OpenAI responses (chat and legacy completions, streamed and whole, tools, reasoning, logprobs,
usage). ``serve`` and ``run`` both use it, so a body means the same thing to both; only their
defaults tables differ. See docs/architecture.md.
"""

from macbatch.openai.errors import InvalidRequest
from macbatch.openai.image_parts import DATA_ONLY, ImageAccess
from macbatch.openai.requests import (
    MAX_CHOICES,
    Bound,
    Endpoint,
    Generation,
    choice_params,
    parse_body,
    parse_chat,
    parse_completion,
)
from macbatch.openai.responses import ChoiceProgress, Formatter, formatter_for, usage
from macbatch.openai.sampling import (
    OPENAI_CHAT,
    OPENAI_COMPLETION,
    SAMPLING_FIELDS,
    Defaults,
    sampling_params,
)

__all__ = [
    "MAX_CHOICES",
    "OPENAI_CHAT",
    "OPENAI_COMPLETION",
    "SAMPLING_FIELDS",
    "DATA_ONLY",
    "Bound",
    "ChoiceProgress",
    "Defaults",
    "Endpoint",
    "Formatter",
    "Generation",
    "ImageAccess",
    "InvalidRequest",
    "choice_params",
    "formatter_for",
    "parse_body",
    "parse_chat",
    "parse_completion",
    "sampling_params",
    "usage",
]
