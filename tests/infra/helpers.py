"""Helpers the platform-config tests share."""

from __future__ import annotations

import json

import pytest

from platform_config import PlatformConfigError, load_config
from tests.conftest import ROOT


def cdk_json_context() -> dict:
    return json.loads((ROOT / "cdk.json").read_text())["context"]


def problems(**overrides) -> list[str]:
    """The problems load_config reports for cdk.json's context with these keys overridden."""
    with pytest.raises(PlatformConfigError) as err:
        load_config({**cdk_json_context(), **overrides})
    return err.value.problems
