"""The Makefile's tools (make demo, make synth's summary) live in tools/, outside trainctl.

Which way the rooms import (cli -> jobs -> contract, never training) is tests/test_architecture.py's.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_makefile_runs_modules_that_exist():
    modules = re.findall(r"python -m ([\w.]+)", (ROOT / "Makefile").read_text())
    assert "tools.demo" in modules and "tools.deploy_summary" in modules
    for module in modules:
        assert importlib.util.find_spec(module) is not None, f"Makefile runs {module}, which does not exist"

