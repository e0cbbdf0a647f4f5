"""Run the launcher's synthesized state machine in moto's Step Functions interpreter (execute mode).

What is real: the definition (from the synthesized template, intrinsics resolved), moto's interpreter
(Retry/Catch, Choice, Wait, intrinsics, history), the `jobs.handler` functions (in-process), moto's
SageMaker and SNS. What is stood in: the SageMaker `.sync` integration (sagemaker_sync.py) and the Lambda
runtime (lambda_inprocess.py). The seams reach into moto internals; test_moto_internals.py pins them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

import boto3
from moto import mock_aws
from moto.sns.models import sns_backends
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.exec.state_task import (
    lambda_eval_utils,
    state_task_factory,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service_callback

from tests.launcher.definition import ACCOUNT, REGION, LauncherDefinition
from tests.launcher.lambda_inprocess import InProcessLambda
from tests.launcher.sagemaker_sync import (
    Outcome,
    ScriptedSageMaker,
    StateTaskServiceSageMaker,
    sagemaker_hooks,
    without_moto_keyword_keys,
)

MOTO_CONFIG = {"stepfunctions": {"execute_state_machine": True}}

STATE_MACHINE_ROLE = f"arn:aws:iam::{ACCOUNT}:role/mltrain-job-launcher"
# The `.sync` poll interval: moto waits 0.5 s between polls; the scripted jobs need no real time.
POLL_SECONDS = 0.005


@dataclass
class ExecutionResult:
    status: str
    output: Any
    error: str | None
    cause: str | None
    history: list[dict[str, Any]]
    create_calls: list[dict[str, Any]]
    lambda_calls: list[tuple[str, dict]]
    notifications: list[tuple[str | None, str]] = field(default_factory=list)  # (subject, message)
    # Every job the emulated SageMaker holds for this execution, and its TrainingJobStatus at the end.
    jobs: dict[str, str] = field(default_factory=dict)
    stop_calls: list[str] = field(default_factory=list)  # StopTrainingJob requests, by job name
    # The waits a Retry asked for before each retry, in seconds (the harness does not sleep them).
    retry_waits: list[float] = field(default_factory=list)

    @property
    def states_entered(self) -> list[str]:
        return [
            e["stateEnteredEventDetails"]["name"] for e in self.history if e["type"].endswith("StateEntered")
        ]

    @property
    def job_names(self) -> list[str]:
        return [c["TrainingJobName"] for c in self.create_calls]

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.history if e["type"] == kind]


class LauncherHarness:
    """Context manager: a moto world with the launcher's state machine created and its seams installed."""

    def __init__(self, launcher: LauncherDefinition, settings: dict[str, Any]):
        self.launcher = launcher
        self.settings = settings
        self.lambdas = InProcessLambda(handlers=launcher.handlers)
        self._stack = contextlib.ExitStack()
        self.state_machine_arn = ""
        self.retry_waits: list[float] = []

    def __enter__(self) -> LauncherHarness:
        original_factory = state_task_factory.state_task_service_for

        def service_for(service_name: str):
            return (
                StateTaskServiceSageMaker() if service_name == "sagemaker" else original_factory(service_name)
            )

        patches = [
            mock.patch.dict(
                os.environ,
                {
                    "PLATFORM_SETTINGS": json.dumps(self.settings),
                    "AWS_REGION": REGION,
                    "AWS_DEFAULT_REGION": REGION,
                },
            ),
            mock_aws(config=MOTO_CONFIG),
            mock.patch.object(state_task_factory, "state_task_service_for", service_for),
            mock.patch.object(lambda_eval_utils, "_invoke_lambda_function", self.lambdas.invoke),
            mock.patch.object(
                state_task_service_callback, "_DELAY_SECONDS_SYNC_CONDITION_CHECK", POLL_SECONDS
            ),
            sagemaker_hooks(),
            # A Retry's interval is recorded, not slept: the waits are asserted, and the suite does not spend them.
            mock.patch.object(retrier_decl, "time", SimpleNamespace(sleep=self.retry_waits.append)),
        ]
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            self._create_world()
            self._stack = stack.pop_all()
        return self

    def _create_world(self) -> None:
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        topic_arn = boto3.client("sns", region_name=REGION).create_topic(Name=self.launcher.topic_name)[
            "TopicArn"
        ]
        assert topic_arn == self.launcher.topic_arn, (topic_arn, self.launcher.topic_arn)
        self.state_machine_arn = self.sfn.create_state_machine(
            name="mltrain-job-launcher",
            definition=json.dumps(without_moto_keyword_keys(self.launcher.definition)),
            roleArn=STATE_MACHINE_ROLE,
            type="STANDARD",
        )["stateMachineArn"]

    def __exit__(self, *exc: Any) -> None:
        StateTaskServiceSageMaker.world = None
        self._stack.close()

    def run(
        self, request: dict[str, Any], outcomes: list[Outcome], *, name: str, timeout: float = 60
    ) -> ExecutionResult:
        world = ScriptedSageMaker(outcomes)
        StateTaskServiceSageMaker.world = world
        self.lambdas.calls.clear()
        self.retry_waits.clear()
        topic = sns_backends[ACCOUNT][REGION].topics[self.launcher.topic_arn]
        sent_before = len(topic.sent_notifications)
        arn = self.sfn.start_execution(
            stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(request)
        )["executionArn"]
        deadline = time.monotonic() + timeout
        while (described := self.sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"execution {name} still RUNNING after {timeout} s")
            time.sleep(0.01)
        history = [event for page in self.sfn.get_paginator("get_execution_history").paginate(executionArn=arn)
                   for event in page["events"]]
        output = described.get("output")
        return ExecutionResult(
            status=described["status"],
            output=json.loads(output) if output else None,
            error=described.get("error"),
            cause=described.get("cause"),
            history=history,
            create_calls=world.create_calls,
            lambda_calls=list(self.lambdas.calls),
            notifications=[
                (subject, message) for _, message, subject, _, _ in topic.sent_notifications[sent_before:]
            ],
            jobs=world.statuses(),
            stop_calls=list(world.stop_calls),
            retry_waits=list(self.retry_waits),
        )
