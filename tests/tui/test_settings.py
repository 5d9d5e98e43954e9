"""The chat settings form checks values with the engine's own rule (SamplingParams), so it
accepts exactly what the engine accepts and shows the engine's message for the rest; the form,
the engine request and the export all come from one field list."""

from __future__ import annotations

import dataclasses

import pytest

from macbatch.engine import InvalidSamplingParam, SamplingParams
from macbatch.session_settings import SAMPLING_FIELDS, SessionSettings, parse_settings


def form(temperature: str = "0.7", top_p: str = "1", max_tokens: str = "64") -> dict[str, str]:
    """The form's sampling inputs, by setting name."""
    return {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}


@pytest.mark.parametrize("temperature", ["-1", "0", "1.5", "2", "2.5", "3", "nan", "inf"])
def test_temperature_follows_sampling_params(temperature):
    try:
        SamplingParams(temperature=float(temperature))
    except InvalidSamplingParam as error:
        with pytest.raises(ValueError) as shown:
            parse_settings("", form(temperature))
        assert str(shown.value) == str(error)
    else:
        assert parse_settings("", form(temperature)).temperature == float(temperature)


def test_a_value_that_is_not_a_number_names_the_field():
    with pytest.raises(ValueError, match="max tokens must be a whole number, got '1.5'"):
        parse_settings("", form(max_tokens="1.5"))


def test_every_sampling_setting_is_an_engine_parameter_sent_with_each_request():
    engine_fields = {f.name for f in dataclasses.fields(SamplingParams)}
    assert [f.name for f in SAMPLING_FIELDS] == ["temperature", "top_p", "max_tokens"]
    assert {f.name for f in SAMPLING_FIELDS} <= engine_fields
    settings = SessionSettings("", 0.25, 0.5, 7)
    assert settings.sampling_params() == SamplingParams(temperature=0.25, top_p=0.5, max_tokens=7)
    assert [f.default for f in SAMPLING_FIELDS] == [0.7, 1.0, 512]


def test_settings_are_valid_or_not_made_at_all():
    with pytest.raises(InvalidSamplingParam) as refused:
        SessionSettings(top_p=0.0)
    assert refused.value.field == "top_p"
    with pytest.raises(InvalidSamplingParam):
        dataclasses.replace(SessionSettings(), max_tokens=0)
