"""The deploy summary counts what the templates hold and prices the always-on resources."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from tools.deploy_summary import cost_drivers, load_templates, print_summary


def test_cost_drivers_of_the_default_platform(cdk_out):
    drivers = dict(cost_drivers(load_templates(cdk_out)))
    fsx = next(v for k, v in drivers.items() if k.startswith("FSx for Lustre PERSISTENT_2 1200 GiB"))
    assert fsx == pytest.approx(1200 * 0.21)
    nat = next(v for k, v in drivers.items() if "NAT" in k)
    assert nat == pytest.approx(0.045 * 730)
    assert not any("interface endpoints" in k for k in drivers)  # NAT configured: no interface endpoints


def test_summary_lists_every_stack_and_the_total(cdk_out):
    out = io.StringIO()
    total = print_summary(cdk_out, Console(file=out, width=140))
    text = out.getvalue()
    assert "mltrain-platform" in text and "mltrain-launcher" in text
    assert "AWS::FSx::FileSystem" in text
    assert f"{total:,.2f}" in text and total > 250
