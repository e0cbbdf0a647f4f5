"""The issue's hostile request through the synthesized state machine: Prepare ends the execution with
RequestInvalid naming every abused field, and nothing is launched. A request with secrets launches with their
ARNs only. (Every field, variable and spelling one by one: tests/jobs/request/test_request_hardening.py.)"""

from __future__ import annotations

import json

from contract.container import ENV_SECRET_ARNS
from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request

SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:mltrain/wandb-key"


def test_the_issues_hostile_request_ends_in_prepare_naming_each_field(harness):
    request = job_request(
        hyperparameters={"checkpoint_dir": "/opt/ml/checkpoints$(id>/tmp/x)", "Model-Dir": "/tmp",
                         "sagemaker_program": "evil.py", "init_from": "/opt/ml/x;id"},
        environment={"PYTHONWARNINGS": "ignore::antigravity.x", "BROWSER": "id", "LD_PRELOAD": "/tmp/x.so",
                     "BASH_ENV": "/tmp/x", "SAGEMAKER_TRAINING_MODULE": "x:y", "TRAINING_STOP_FILE": "/dev/null",
                     "TRAINING_CHECKPOINT_DIR": "/tmp", "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"},
        image="docker.io/attacker/image:latest")
    result = harness.run(request, [], name="hostile-request")
    assert result.status == "FAILED" and result.error == "RequestInvalid"
    assert result.states_entered == ["Prepare", "ParseRequestError", "RequestInvalid"]
    for field in ("hyperparameters.checkpoint_dir", "hyperparameters.Model-Dir", "hyperparameters.sagemaker_program",
                  "hyperparameters.init_from", "environment.PYTHONWARNINGS", "environment.BROWSER",
                  "environment.LD_PRELOAD", "environment.BASH_ENV", "environment.SAGEMAKER_TRAINING_MODULE",
                  "environment.TRAINING_STOP_FILE", "environment.TRAINING_CHECKPOINT_DIR",
                  "environment.WANDB_API_KEY"):
        assert f"{field}: " in result.cause, field
    assert "0123456789abcdef0123456789abcdef01234567" not in result.cause  # a credential is never echoed
    assert result.create_calls == [] and result.notifications == []


def test_secrets_reach_the_job_as_arns_only(harness):
    request = job_request(secrets={"WANDB_API_KEY": SECRET}, environment={"NCCL_DEBUG": "WARN"})
    result = harness.run(request, [sm.completed()], name="with-secrets")
    assert result.status == "SUCCEEDED", result.cause
    (create,) = result.create_calls
    assert json.loads(create["Environment"][ENV_SECRET_ARNS]) == {"WANDB_API_KEY": SECRET}
    assert "WANDB_API_KEY" not in create["Environment"]
