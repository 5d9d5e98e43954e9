"""Structured outputs: grammars compiled from JSON schemas, regexes and choices, and the masks
they put on a step's logits."""
