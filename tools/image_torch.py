"""Run the training package's tests on every torch version in the platform's tested set (but trainctl local's plumbing).

The tested set is `platform_config/tested_torch.json` (read here as a file: `tools` may not import
`platform_config`, see docs/ARCHITECTURE.md). The config loader refuses a cdk.json `pytorch_versions` entry outside
it, so every PyTorch image the platform offers (the default is `pytorch_versions[0]`) brings a torch tested here.
The SMP images are the edge: their torch exists only in the image, so they are not run here.

The SageMaker images bring their own torch, older than the torch pinned for development. For each tested version
this makes `.venv-torch-<version>`, a venv that sees the main venv's packages through a .pth file but has that torch
installed in front of them (PyPI's wheel: CPU-only builds are not on PyPI for these versions; the CUDA one runs on a
CPU), and runs the tests with it. `make test` calls it; `python -m tools.image_torch --list` prints the versions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What runs on the image's torch: the package itself, under torchrun too (its signals, grace and exit: the container
# stop, clean exit and many-hosts tests). Requests through `trainctl local`'s emulated container (marked
# trainctl_local, and tests/cli/) test the CLI's plumbing on the pinned torch: what they run of torch, every layout's
# training, checkpoint and resume, the conformance matrix runs here on each version.
TESTS = ("tests/training",)
SELECTION = ("-m", "not soak and not trainctl_local")  # replaces pyproject's addopts -m, which keeps soak out


# The tested set, defined once; platform_config.tested_torch reads the same file for the config loader.
TESTED_TORCH_FILE = ROOT / "platform_config" / "tested_torch.json"


def tested_versions() -> tuple[str, ...]:
    """The torch versions CI tests the package on, in the file's order."""
    return tuple(json.loads(TESTED_TORCH_FILE.read_text())["versions"])


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
    parser.add_argument("--list", action="store_true", help="print the tested torch versions and exit")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (e.g. -n 2)")
    args = parser.parse_args(argv)
    versions = tested_versions()
    if args.list:
        print(" ".join(versions))
        return 0
    failed = []
    for version in versions:  # every version, so one run reports each version that fails
        python = image_venv(version)
        found = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                               check=True, capture_output=True, text=True).stdout.strip()
        if found.split("+")[0] != version:
            print(f"{python} has torch {found}, not {version}: delete .venv-torch-{version} and run again",
                  file=sys.stderr)
            return 1
        print(f"== tests on torch {found} (tested version {version}) ==", flush=True)
        if subprocess.run([str(python), "-m", "pytest", *TESTS, *SELECTION, *args.pytest_args], cwd=ROOT).returncode:
            failed.append(version)
    if failed:
        print(f"tests failed on torch {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
