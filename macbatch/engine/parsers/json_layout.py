"""How the engine writes JSON in a grammar: one layout for structured output's JSON schemas and
the tool-call syntaxes' forced calls, here at the bottom so both read it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # the stub's name for these options

# JSON as json.dumps writes it: no free whitespace, so a model cannot pad its reply with newlines
# until max_tokens runs out.
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
