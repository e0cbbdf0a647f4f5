"""`npx cdk synth` outside the venv: cdk.json runs `python3 app.py`, and a Python without the CDK's packages got a
ModuleNotFoundError and no word on how to set up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A Python without aws-cdk-lib and cdk-nag: importing them fails as if they were not installed.
WITHOUT_CDK = """
import runpy, sys
class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("aws_cdk", "cdk_nag"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Uninstalled())
runpy.run_path("app.py", run_name="__main__")
"""


def test_app_without_the_cdk_packages_says_how_to_set_up():
    result = subprocess.run([sys.executable, "-c", WITHOUT_CDK], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert "error: app.py needs the Python package 'aws_cdk'" in result.stderr
    assert "run `make setup`" in result.stderr
