"""Speculative decoding's methods are named once (``speculative/methods.py``): the drafters'
registry holds one drafter under each name, and the config accepts exactly them, "off" and
"auto"."""

from __future__ import annotations

import pytest

from macbatch.engine import EngineConfig, check_speculative
from macbatch.engine.speculative.drafters import DRAFTERS
from macbatch.engine.speculative.methods import (
    SPECULATIVE_METHODS,
    SPECULATIVE_MODES,
    resolved_mode,
)


def test_the_registry_holds_a_drafter_under_each_method_name():
    assert sorted(DRAFTERS) == sorted(SPECULATIVE_METHODS)


def test_auto_drafts_with_what_was_loaded_else_by_prompt_lookup():
    """The checkpoint's MTP heads, or the drafter named as the draft model (DFlash, Eagle-3 or
    a plain model), else prompt lookup (the policy keeps it to where it pays)."""
    for loaded in ("mtp", "dflash", "eagle3", "draft"):
        assert resolved_mode("auto", loaded) == loaded
    assert resolved_mode("auto", None) == "ngram"
    assert resolved_mode("draft", "dflash") == "dflash"  # its config says what it is
    assert resolved_mode("draft", "eagle3") == "eagle3"
    assert [resolved_mode(m, "mtp") for m in SPECULATIVE_METHODS] == list(SPECULATIVE_METHODS)


def test_the_config_accepts_off_auto_and_the_methods_only():
    assert set(SPECULATIVE_MODES) == {"off", "auto", *SPECULATIVE_METHODS}
    for mode in SPECULATIVE_MODES:
        check_speculative(mode, None)
    with pytest.raises(ValueError, match="speculative must be one of off, auto, ngram"):
        EngineConfig(speculative="medusa")
    assert EngineConfig(speculative="off").draft_length == 0
