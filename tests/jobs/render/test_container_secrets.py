"""A request's `secrets` in the container: the rendered entry reads each one and the image's start sees it as a
variable; the values never appear in the request that SageMaker gets.

What runs is the entry as rendered into ContainerEntrypoint (bash, its secrets step, the stop relay it `exec`s),
in a folder holding a stand-in for the image's start_with_right_hostname.sh that records what it inherited. The
`python` the entry calls is this environment's, with boto3, through a small wrapper that starts moto's Secrets
Manager in the process first (the code the entry passes it runs unchanged). The edge: the image's own python and
Secrets Manager itself, and the execution role's permission to read the secret (IAM, not this file).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from contract.container import ENV_SECRET_ARNS
from jobs.render.container_entry import IMAGE_START
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request, validate_for_platform
from tests.jobs.conftest import load_platform

ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:mltrain/{}"
# Everything a shell could misread: quotes, substitutions, a newline, a leading dash, spaces.
VALUES = {"mltrain/wandb-key": "0123456789abcdef0123456789abcdef01234567",
          "mltrain/hf-token": "it's \"$(id)\" `uname` $HOME\n-- next line; | & > *"}
# Starts moto, stores VALUES, then runs `python -c CODE ARGS...` as the real interpreter would.
BOOT = """import json, os, sys
from moto import mock_aws
import boto3
with mock_aws():
    client = boto3.client("secretsmanager", region_name="us-east-1")
    for name, value in json.loads(os.environ["TEST_SECRET_VALUES"]).items():
        client.create_secret(Name=name, SecretString=value)
    assert sys.argv[1] == "-c"
    code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
"""


def rendered_entry(secrets: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """ContainerEntrypoint and Environment of attempt 1 of a request with these secrets."""
    platform = load_platform()
    request = parse_request({"name": "secrets", "dataset": f"s3://{platform.dataset_bucket}/tokens/",
                             "instance": {"type": "ml.g5.12xlarge"}, "secrets": secrets})
    validate_for_platform(request, platform)
    create = render_create_training_job(request, platform, run_id="secrets-aaaaaaaaaaaaaaaa", attempt=1)
    assert not any(value in json.dumps(create) for value in VALUES.values())
    return create["AlgorithmSpecification"]["ContainerEntrypoint"], create["Environment"]


@pytest.fixture
def container(tmp_path: Path):
    """Run an entry in a folder with the image's stand-in; return (exit code, output, what the stand-in saw)."""
    bin_dir, image_root = tmp_path / "bin", tmp_path / "image"
    bin_dir.mkdir()
    image_root.mkdir()
    (tmp_path / "boot.py").write_text(BOOT)
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "boot.py"} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    seen = tmp_path / "seen.json"
    (image_root / IMAGE_START.split()[1]).write_text(
        f'[ "$1" = train ] || exit 64\n{sys.executable} -c "import json, os; json.dump(dict(os.environ), '
        f'open(\'{seen}\', \'w\'))"\n')

    def run(entry: list[str], environment: dict[str, str]) -> tuple[int, str, dict]:
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TEST_SECRET_VALUES": json.dumps(VALUES),
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", **environment}
        done = subprocess.run(entry, cwd=image_root, env=env, capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout + done.stderr, json.loads(seen.read_text()) if seen.exists() else {}
    return run


def test_each_secret_reaches_the_image_start_as_a_variable_and_no_output(container):
    entry, environment = rendered_entry({"WANDB_API_KEY": ARN.format("wandb-key"), "HF_TOKEN": ARN.format("hf-token")})
    code, output, seen = container(entry, environment)
    assert code == 0, output
    assert seen["WANDB_API_KEY"] == VALUES["mltrain/wandb-key"] and seen["HF_TOKEN"] == VALUES["mltrain/hf-token"]
    assert seen[ENV_SECRET_ARNS] == environment[ENV_SECRET_ARNS]  # the ARNs only
    assert not any(value in output for value in VALUES.values())


def test_a_secret_that_cannot_be_read_fails_the_job_before_the_image_starts(container):
    entry, environment = rendered_entry({"WANDB_API_KEY": ARN.format("wandb-key"), "HF_TOKEN": ARN.format("gone")})
    code, output, seen = container(entry, environment)
    assert code == 1 and "could not read the request's secrets" in output
    assert seen == {} and VALUES["mltrain/wandb-key"] not in output


def test_without_secrets_the_entry_starts_the_image_as_before(container):
    entry, environment = rendered_entry({})
    assert ENV_SECRET_ARNS not in environment
    code, output, seen = container(entry, environment)
    assert code == 0 and ENV_SECRET_ARNS not in seen, output


def test_a_name_the_shell_would_run_is_refused_in_the_container_too(container, tmp_path):
    """Prepare refuses such a name; the entry does not rely on it."""
    entry, environment = rendered_entry({})
    owned = tmp_path / "owned"
    code, output, seen = container(entry, {**environment, ENV_SECRET_ARNS: json.dumps(
        {f"X=1;touch {owned};Y": ARN.format("wandb-key")})})
    assert code == 1 and seen == {} and not owned.exists(), output
