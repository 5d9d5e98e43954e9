"""Speculative decoding's methods are named once (``speculative/methods.py``): the drafters'
registry holds one drafter under each name, and the config accepts exactly them and "off"."""

from __future__ import annotations

import pytest

from macbatch.engine import EngineConfig, check_speculative
from macbatch.engine.speculative.drafters import DRAFTERS
from macbatch.engine.speculative.methods import SPECULATIVE_METHODS, SPECULATIVE_MODES


def test_the_registry_holds_a_drafter_under_each_method_name():
    assert sorted(DRAFTERS) == sorted(SPECULATIVE_METHODS)


def test_the_config_accepts_off_and_the_methods_only():
    assert set(SPECULATIVE_MODES) == {"off", *SPECULATIVE_METHODS}
    for mode in SPECULATIVE_MODES:
        check_speculative(mode, None)
    with pytest.raises(ValueError, match="speculative must be one of off, ngram"):
        EngineConfig(speculative="medusa")
    assert EngineConfig(speculative="off").draft_length == 0
