"""Speculative decoding's methods and draft lengths, and the check of a choice of them: the one
list of the drafters' names (``drafters.DRAFTERS`` registers one drafter under each, a test holds
them equal). No MLX, so that the command line checks ``--speculative`` and quotes the defaults in
its ``--help`` without loading it."""

# Each method's most drafts per request per step when none is given. Prompt lookup's drafts cost
# nothing to make, and where they hold they hold for long runs: on the copy-heavy job of
# benchmarks/speculative.py (100% accepted) 4 gave x1.56 the job without speculation, and 16
# decoded in 3.1 to 5.0 s where 8 took 5.7 s (docs/speculative.md); the policy's slow start
# begins at 4 either way. A draft model runs one forward per draft, so it drafts fewer.
# A DFlash drafter proposes a whole block in one forward: up to its checkpoint's block size
# less one (the known token), capped there by the drafter. An Eagle-3 drafter runs one forward
# of its one layer per draft, as an MTP layer does.
DEFAULT_SPECULATIVE_TOKENS = {"ngram": 16, "draft": 4, "mtp": 4, "dflash": 15, "eagle3": 4}
SPECULATIVE_METHODS = tuple(DEFAULT_SPECULATIVE_TOKENS)
# the methods that draft with the model ``--draft-model`` names (its config says which)
DRAFT_MODEL_METHODS = ("draft", "dflash", "eagle3")
# what ``EngineConfig.speculative`` may be; "auto" is resolved when the engine loads
SPECULATIVE_MODES = ("off", "auto", *SPECULATIVE_METHODS)
MAX_SPECULATIVE_TOKENS = 16


def resolved_mode(mode: str, loaded: str | None) -> str:
    """What a mode means given the drafting model loaded beside the checkpoint (``loaded``:
    "mtp" for its own MTP layer, "dflash" / "eagle3" for such a drafter named as the draft
    model, "draft" for a plain draft model, None for none). "auto" drafts with the one loaded
    (``Engine.load`` tries the checkpoint's MTP heads first, then ``--draft-model``), else by
    prompt lookup (free drafts, which the policy's measured break-even keeps to where they
    pay); "draft" with a DFlash or Eagle-3 drafter is that (its config says what it is); other
    modes are themselves."""
    if mode == "auto":
        return loaded or "ngram"
    if mode == "draft" and loaded in ("dflash", "eagle3"):
        return loaded
    return mode


def check_speculative(mode: str, num_tokens: int | None) -> None:
    """``ValueError`` saying what is wrong with a speculative mode or draft length (None: the
    mode's default)."""
    if mode not in SPECULATIVE_MODES:
        raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, got {mode!r}")
    if num_tokens is None:
        return
    if not (isinstance(num_tokens, int) and 1 <= num_tokens <= MAX_SPECULATIVE_TOKENS):
        raise ValueError(
            f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
            f"got {num_tokens!r}"
        )
