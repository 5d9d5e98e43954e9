"""Speculative decoding's methods and draft lengths: facts the command line states in its
``--help`` without importing MLX, and the engine's config checks against."""

SPECULATIVE_MODES = ("off", "ngram", "draft", "mtp")
MAX_SPECULATIVE_TOKENS = 16
# The most drafts per request per step when none is given. Prompt lookup's drafts cost nothing
# to make, and where they hold they hold for long runs: on the copy-heavy job of
# benchmarks/speculative.py (100% accepted) 4 gave x1.56 the job without speculation, and 16
# decoded in 3.1 to 5.0 s where 8 took 5.7 s (docs/speculative.md); the policy's slow start
# begins at 4 either way. A draft model runs one forward per draft, so it drafts fewer.
DEFAULT_SPECULATIVE_TOKENS = {"ngram": 16, "draft": 4, "mtp": 4, "off": 4}
