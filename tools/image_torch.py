"""Run the training and `trainctl local` tests on the PyTorch of every framework image the platform offers.

The SageMaker images bring their own torch (the platform's default is cdk.json's `pytorch_versions[0]`),
older than the torch pinned for development. For each offered version this makes `.venv-torch-<version>`,
a venv that sees the main venv's packages through a .pth file but has that torch installed in front of
them (PyPI's wheel: CPU-only builds are not on PyPI for these versions; the CUDA one runs on a CPU), and runs
the tests with it. `make test` calls it; `python -m tools.image_torch --list` prints the versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What runs on the image's torch: the package itself, and `trainctl local`, which starts it under torchrun.
TESTS = ("tests/training", "tests/cli/test_local.py")


def offered_versions() -> list[str]:
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    return list(context["pytorch_versions"])


def image_venv(version: str) -> Path:
    """`.venv-torch-<version>`: torch `version` in front of the main venv's packages (made once, then reused)."""
    venv = ROOT / f".venv-torch-{version}"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # The main venv's packages come after this venv's own site-packages on sys.path, so the torch installed
    # here shadows the pinned one while everything else (numpy, pytest, boto3...) is shared.
    Path(site, "main-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"torch=={version}"], check=True)
    marker.touch()
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the offered torch versions and exit")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -n 2)")
    args = parser.parse_args(argv)
    versions = offered_versions()
    if args.list:
        print(" ".join(versions))
        return 0
    for version in versions:
        python = image_venv(version)
        found = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                               check=True, capture_output=True, text=True).stdout.strip()
        print(f"== tests on torch {found} (the image's {version}) ==", flush=True)
        result = subprocess.run([str(python), "-m", "pytest", *TESTS, *args.pytest_args], cwd=ROOT)
        if result.returncode:
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
