"""Reading a reply as it streams: its text (detokenized and stop strings), its reasoning and its
tool calls in every syntax a model family writes (``tool_formats/``)."""
