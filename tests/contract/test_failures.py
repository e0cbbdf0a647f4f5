"""The failure line the training package writes is the one the launcher reads back."""

from __future__ import annotations

import pytest

from contract.failures import FailureCode, failure_line, parse_failure_line


@pytest.mark.parametrize("code", list(FailureCode))
def test_a_line_round_trips_inside_a_failure_reason(code):
    line = failure_line(code, "micro_batch_size=8 does not fit:\nlower it to 4")
    assert "\n" not in line
    assert parse_failure_line(f"AlgorithmError: {line}") == (code, "micro_batch_size=8 does not fit: lower it to 4")


def test_other_text_is_not_a_failure_line():
    assert parse_failure_line("AlgorithmError: ExecuteUserScriptError: exit code 1") is None
    assert parse_failure_line("[training:made_up] text") is None
