"""The chat settings form checks values with the engine's own rule (SamplingParams), so it
accepts exactly what the engine accepts and shows the engine's message for the rest."""

from __future__ import annotations

import pytest

from macbatch.engine import InvalidSamplingParam, SamplingParams
from macbatch.tui.screens.settings import parse_settings


@pytest.mark.parametrize("temperature", ["-1", "0", "1.5", "2", "2.5", "3", "nan", "inf"])
def test_temperature_follows_sampling_params(temperature):
    try:
        SamplingParams(temperature=float(temperature))
    except InvalidSamplingParam as error:
        with pytest.raises(ValueError) as shown:
            parse_settings("", temperature, "1", "64")
        assert str(shown.value) == str(error)
    else:
        assert parse_settings("", temperature, "1", "64").temperature == float(temperature)


def test_a_value_that_is_not_a_number_names_the_field():
    with pytest.raises(ValueError, match="max tokens must be a whole number, got '1.5'"):
        parse_settings("", "0.7", "1", "1.5")
