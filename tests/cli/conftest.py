"""Fixtures for trainctl's tests: a platform-settings file, request files, and a moto-backed AWS.

The AWS commands run in-process under moto 5.2.5 (`mock_aws`), whose Step Functions interpreter
really executes the small state machines these tests create.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from cli.main import app

DATA = Path(__file__).with_name("data")
REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/stepfunctions"


def channel_folder(path: Path, shards: bool = True) -> Path:
    """A token channel: the meta.json and (unless `shards` is false) a shard, what trainctl local checks before it
    starts anything."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").write_text(json.dumps({"format": "tokens", "dtype": "uint16", "vocab_size": 256}))
    if shards:
        (path / "shard-00000.bin").write_bytes(b"\0\0" * 64)
    return path


def run(*args: str, **kwargs: Any):
    """Invoke trainctl in-process; returns click's Result (exit_code, stdout, stderr, output)."""
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False, **kwargs)


@pytest.fixture
def platform_file() -> Path:
    return DATA / "platform.json"


@pytest.fixture
def platform_doc(platform_file: Path) -> dict[str, Any]:
    return json.loads(platform_file.read_text())


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """moto with Step Functions executing definitions for real, in us-east-1."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield


@pytest.fixture
def deployed(aws: None, platform_doc: dict[str, Any]):
    """A deployed platform as trainctl finds it: the two SSM parameters. Returns a state-machine factory."""
    ssm = boto3.client("ssm", region_name=REGION)
    ssm.put_parameter(Name="/mltrain/platform-settings", Value=json.dumps(platform_doc), Type="String")
    sfn = boto3.client("stepfunctions", region_name=REGION)

    def deploy(definition: dict[str, Any], name: str = "mltrain-launcher") -> str:
        arn = sfn.create_state_machine(name=name, definition=json.dumps(definition), roleArn=ROLE)[
            "stateMachineArn"]
        ssm.put_parameter(Name="/mltrain/state-machine-arn", Value=arn, Type="String", Overwrite=True)
        return arn

    return deploy


class RunningJobs:
    """Training jobs that stay InProgress, and a StopTrainingJob for them.

    moto 5.2.5's SageMaker completes every training job at once and has no StopTrainingJob; `stop` must
    see a running job to stop it. This reaches into moto's SageMaker backend (pinned: moto==5.2.5) and
    adds the missing action to its response handler; test_moto_still_lacks_stop_training_job fails loudly
    if moto changes under it.
    """

    def __init__(self) -> None:
        self.stopped: list[str] = []

    @staticmethod
    def backend():
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.sagemaker.models import sagemaker_backends

        return sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION]

    def mark_in_progress(self, name: str) -> None:
        job = self.backend().training_jobs[name]
        job.training_job_status, job.secondary_status = "InProgress", "Training"

    def stop(self, name: str) -> None:
        job = self.backend().training_jobs[name]
        job.training_job_status, job.secondary_status = "Stopping", "Stopping"
        self.stopped.append(name)


@pytest.fixture
def running_jobs(aws: None, monkeypatch: pytest.MonkeyPatch) -> RunningJobs:
    from moto.core.responses import EmptyResult
    from moto.sagemaker.responses import SageMakerResponse

    jobs = RunningJobs()

    def stop_training_job(self: SageMakerResponse) -> EmptyResult:
        jobs.stop(self._get_param("TrainingJobName"))
        return EmptyResult()

    monkeypatch.setattr(SageMakerResponse, "stop_training_job", stop_training_job, raising=False)
    return jobs
