"""The torch versions CI tests the training package on: the only PyTorch images the platform may offer.

The set is defined once, in `tested_torch.json` next to this file, and read by two programs:
- `tools/image_torch.py` (`make test`, hence CI) makes a venv with each version's torch and runs tests/training
  and tests/cli/test_local.py on it;
- the config loader refuses a `pytorch_versions` entry outside it (platform_config.model), so a platform never
  offers a framework image whose torch the package has not been tested on.
It is a data file rather than a constant because `tools` may not import `platform_config` (docs/ARCHITECTURE.md):
both read the same file, and tests/infra/test_tested_torch.py checks that they do. Standard library only: reading
the set imports no torch.

To offer a new image version: add it here (CI then makes `.venv-torch-<version>` and runs the tests on it), make
them pass, then add it to cdk.json's `pytorch_versions`.

The edge: `smp_versions` (the SMP v2 images) are not checked against this set. Their torch carries the SMP library
(`torch.sagemaker`), which exists only inside that image, so CI cannot run the package on it; what is tested is
the SMP strategy's config parsing and its error outside the image.
"""

from __future__ import annotations

import json
from pathlib import Path

TESTED_TORCH_FILE = Path(__file__).with_name("tested_torch.json")


def read_tested_torch(path: Path = TESTED_TORCH_FILE) -> tuple[str, ...]:
    """The versions listed in `path` (tested_torch.json), in order."""
    versions = json.loads(path.read_text())["versions"]
    if not versions or not all(isinstance(v, str) for v in versions):
        raise ValueError(f"{path}: 'versions' must be a non-empty list of torch versions such as \"2.8.0\"")
    return tuple(versions)


TESTED_TORCH_VERSIONS: tuple[str, ...] = read_tested_torch()
