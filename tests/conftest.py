"""Shared fixtures. The CDK app is synthesized once per test run through the real CDK CLI.

Under pytest-xdist every worker has its own session, so the synth is guarded by a file lock in the run's
shared temporary folder (pytest-xdist's documented recipe): the first worker synthesizes, the others reuse it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]


def offline_env(**extra: str) -> dict[str, str]:
    """An environment with no AWS credentials and no instance-metadata look-ups: synth must not need them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("CDK_")}
    # The venv's python3 runs app.py; node_modules/.bin holds the pinned Node 22 and CDK CLI.
    path = [str(Path(sys.executable).parent), str(ROOT / "node_modules" / ".bin"), env.get("PATH", "")]
    env["PATH"] = os.pathsep.join(path)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    env["AWS_CONFIG_FILE"] = os.devnull
    env.update(extra)
    return env


def cdk_synth(out_dir: Path, *context: str) -> subprocess.CompletedProcess[str]:
    """Run `npx cdk synth` (the pinned aws-cdk@2 CLI) into out_dir; `context` holds `key=value` pairs."""
    npx = shutil.which("npx")
    assert npx, "npx not found: install Node.js and run `npm ci`"
    cmd = [npx, "cdk", "synth", "--quiet", "--no-notices", "--no-version-reporting", "-o", str(out_dir)]
    for pair in context:
        cmd += ["-c", pair]
    return subprocess.run(cmd, cwd=ROOT, env=offline_env(), capture_output=True, text=True, timeout=600)


AWS_SETTINGS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
                "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")


@pytest.fixture(autouse=True, scope="session")
def no_real_aws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The test session runs as on a fresh laptop: no credentials, region, profile or instance metadata, and an
    empty cache folder (trainctl's price cache). On a developer's machine with AWS credentials, a test that forgot
    to mock AWS would otherwise call it (`trainctl plan --prices auto` asks the Price List API when it finds
    credentials). Session-scoped, so that module fixtures (the launcher's moto world) and tests set what they
    need on top; moto brings its own fake keys."""
    home = tmp_path_factory.mktemp("no-aws")
    with pytest.MonkeyPatch.context() as patch:
        for name in AWS_SETTINGS:
            patch.delenv(name, raising=False)
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "credentials"))
        patch.setenv("AWS_CONFIG_FILE", str(home / "config"))
        patch.setenv("XDG_CACHE_HOME", str(home / "cache"))
        yield


@pytest.fixture(scope="session")
def cdk_out(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The cloud assembly of the default configuration, synthesized by the CDK CLI with no credentials."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    out = shared / "cdk.out.default"
    with FileLock(str(shared / "cdk.out.lock")):
        if not (out / "manifest.json").exists():
            result = cdk_synth(out)
            assert result.returncode == 0, f"cdk synth failed:\n{result.stdout}\n{result.stderr}"
    return out


@pytest.fixture(scope="session")
def templates(cdk_out: Path) -> dict[str, dict]:
    """Every synthesized CloudFormation template, by stack name."""
    manifest = json.loads((cdk_out / "manifest.json").read_text())
    found = {}
    for name, artifact in manifest["artifacts"].items():
        if artifact.get("type") == "aws:cloudformation:stack":
            found[name] = json.loads((cdk_out / artifact["properties"]["templateFile"]).read_text())
    assert found, "no stacks in the cloud assembly"
    return found


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A real MLflow tracking server on loopback (SQLite, artifacts in a folder) for this worker's tests."""
    from tests.tracking import start

    server = start(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files holding slow tests first, the conformance matrix (the longest) before them. `make test` runs files
    whole on each of two workers (--dist loadfile) in the order given here (--no-loadscope-reorder; xdist's own
    order puts the files with most tests first): a long file that starts last holds the run while the other
    worker idles, as the demo transcript and the hsdp `trainctl local` run did at the end of xdist's order."""
    first = {}
    for index, item in enumerate(items):
        rank = 0 if item.path.name == LONGEST_FILE else 1 if item.get_closest_marker("slow") else 2
        first[item.path] = min(first.get(item.path, (rank, index)), (rank, index))
    items.sort(key=lambda item: first[item.path])


# Its module fixture alone takes 130 to 250 s (the whole parallel matrix on two and four gloo ranks).
LONGEST_FILE = "test_conformance.py"
