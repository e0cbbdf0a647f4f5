"""Run the launcher's synthesized state machine in moto's Step Functions interpreter (execute mode).

What is real: the definition (from the synthesized template, intrinsics resolved), moto's interpreter
(Retry/Catch, Choice, Wait, intrinsics, history, StopExecution), the `jobs.handler` functions (in-process), moto's
SageMaker, SNS and DynamoDB (the run registry's table, created as the template declares it), and the execution-status
rule's pattern (moto's EventBridge matcher). What is stood in: the SageMaker `.sync` integration (sagemaker_sync.py),
the StartExecution task's parameter names (moto passes them to boto3 uncased), GetExecutionHistory's paging (moto
answers every event at once), the Lambda runtime (lambda_inprocess.py), and EventBridge's delivery: when an
execution has ended, `wait` hands the status change (the documented event) to the rule's target handler, once, as
EventBridge would shortly after.
The seams reach into moto internals; test_moto_internals.py pins them.

Interleavings are forced, not timed: `on_wait(execution ARN, state name, seconds)` runs inside a Wait state
(Backoff, WaitForJob), `lambdas.before(handler, event)` before a function runs; either may start, run or stop other
executions while this one is held there. Wait states record their seconds and do not sleep them.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

import boto3
from moto import mock_aws
from moto.events.models import EventPattern
from moto.sns.models import sns_backends
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.exec.state_task import (
    lambda_eval_utils,
    state_task_factory,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service_callback
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_sfn import (
    StateTaskServiceSfn,
)
from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import WaitFunction
from moto.stepfunctions.responses import StepFunctionResponse

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


_ORIGINAL_SFN_PARAMETERS = StateTaskServiceSfn._normalise_parameters


def _sfn_parameters(self, parameters: dict, boto_service_name: str | None = None,
                    service_action_name: str | None = None) -> None:
    """moto's own normalisation (Input as a JSON string), then the API's member names (first letter lower-cased)."""
    _ORIGINAL_SFN_PARAMETERS(self, parameters, boto_service_name, service_action_name)
    for key in list(parameters):
        parameters[key[0].lower() + key[1:]] = parameters.pop(key)


_ORIGINAL_HISTORY = StepFunctionResponse.get_execution_history


def _history_page(self):
    """GetExecutionHistory paged as Step Functions pages it (reverseOrder, maxResults, nextToken; 1,000 events a page
    at most): moto 5.2.5 answers every event, oldest first, whatever is asked. Decide asks for the newest event only
    (jobs.handler.history_length); answering the whole history each time cost the suite about 30 s."""
    answer = _ORIGINAL_HISTORY(self)
    events = list(answer.result["events"])
    if self._get_param("reverseOrder"):
        events.reverse()
    start, size = int(self._get_param("nextToken") or 0), min(self._get_int_param("maxResults") or 1000, 1000)
    page = {"events": events[start:start + size]}
    if start + size < len(events):
        page["nextToken"] = str(start + size)
    return type(answer)(page)


def _sfn_response(self, response, boto_service_name: str | None = None, service_action_name: str | None = None) -> None:
    if isinstance(response, dict):
        for key in list(response):
            response[key[0].upper() + key[1:]] = response.pop(key)


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
    # What the execution-status rule's target returned for this execution's end (None: not delivered).
    reaped: dict[str, Any] | None = None

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
        # Wait states: (execution name, state name, seconds), in order; and the test's hook, if any.
        self.waits: list[tuple[str, str, float]] = []
        self.on_wait: Callable[[str, str, float], None] | None = None
        self.world: ScriptedSageMaker | None = None
        self._sent_before = 0
        # Seconds the Wait states have asked for, all executions together: a test's simulated clock runs on them.
        self.waited = 0.0

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
            # Step Functions takes the StartExecution task's parameters as StateMachineArn, Name, Input and answers
            # ExecutionArn, StartDate; moto 5.2.5 hands boto3 the names as they are (it knows stateMachineArn, ...) and
            # passes its answer on as boto3 spells it (executionArn, ...).
            mock.patch.object(StateTaskServiceSfn, "_normalise_parameters", _sfn_parameters),
            mock.patch.object(StateTaskServiceSfn, "_normalise_response", _sfn_response),
            mock.patch.object(StepFunctionResponse, "get_execution_history", _history_page),
            mock.patch.object(WaitFunction, "_wait_interval",
                              lambda function, env, wait_seconds: self._wait_interval(function, env, wait_seconds)),
        ]
        with contextlib.ExitStack() as stack:
            for patch in patches:
                stack.enter_context(patch)
            self._create_world()
            self._stack = stack.pop_all()
        return self

    def _wait_interval(self, function: WaitFunction, env, wait_seconds: int) -> None:
        """A Wait state: recorded, the test's hook run inside it (this execution held there), never slept."""
        data = env.states.context_object.context_object_data
        arn, state = data["Execution"]["Id"], data["State"]["Name"]
        self.waits.append((arn.rsplit(":", 1)[-1], state, wait_seconds))
        self.waited += wait_seconds
        if self.on_wait is not None:
            self.on_wait(arn, state, wait_seconds)

    def _create_world(self) -> None:
        boto3.client("dynamodb", region_name=REGION).create_table(**self.launcher.table)
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

    def new_world(self, outcomes: list[Outcome]) -> ScriptedSageMaker:
        """A fresh emulated SageMaker playing `outcomes`, one per CreateTrainingJob, whichever execution sends it."""
        self.world = ScriptedSageMaker(outcomes)
        StateTaskServiceSageMaker.world = self.world
        self.lambdas.calls.clear()
        self.retry_waits.clear()
        self._sent_before = len(self._topic().sent_notifications)
        return self.world

    def _topic(self):
        return sns_backends[ACCOUNT][REGION].topics[self.launcher.topic_arn]

    def start(self, request: dict[str, Any], *, name: str, outcomes: list[Outcome] | None = None) -> str:
        """StartExecution (in a new world when `outcomes` is given); the execution's ARN, without waiting."""
        if outcomes is not None:
            self.new_world(outcomes)
        return self.sfn.start_execution(
            stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(request))["executionArn"]

    def stop(self, arn: str) -> None:
        """StopExecution, as the console's Stop button or code sends it."""
        self.sfn.stop_execution(executionArn=arn, error="Stopped", cause="stopped from the console")

    def wait(self, arn: str, *, timeout: float = 60, deliver: bool = True) -> ExecutionResult:
        """Wait for the execution to end; then (unless `deliver` is False) hand its status change to the
        execution-status rule's target, as EventBridge would."""
        deadline = time.monotonic() + timeout
        while (described := self.sfn.describe_execution(executionArn=arn))["status"] == "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"execution {arn} still RUNNING after {timeout} s")
            time.sleep(0.01)
        history = [event for page in self.sfn.get_paginator("get_execution_history").paginate(executionArn=arn)
                   for event in page["events"]]
        reaped = self.deliver_end(arn) if deliver else None
        output = described.get("output")
        world = self.world
        return ExecutionResult(
            status=described["status"],
            output=json.loads(output) if output else None,
            error=described.get("error"),
            cause=described.get("cause"),
            history=history,
            create_calls=world.create_calls,
            lambda_calls=list(self.lambdas.calls),
            notifications=[
                (subject, message) for _, message, subject, _, _ in self._topic().sent_notifications[self._sent_before:]
            ],
            jobs=world.statuses(),
            stop_calls=list(world.stop_calls),
            retry_waits=list(self.retry_waits),
            reaped=reaped,
        )

    def run(
        self, request: dict[str, Any], outcomes: list[Outcome], *, name: str, timeout: float = 60
    ) -> ExecutionResult:
        return self.wait(self.start(request, name=name, outcomes=outcomes), timeout=timeout)

    def status_change(self, arn: str) -> dict[str, Any]:
        """The "Step Functions Execution Status Change" event EventBridge sends for an execution (the shape of the
        Step Functions developer guide's example)."""
        described = self.sfn.describe_execution(executionArn=arn)
        millis = lambda t: int(t.timestamp() * 1000) if t else None  # noqa: E731
        return {
            "version": "0", "id": str(uuid.uuid4()), "detail-type": "Step Functions Execution Status Change",
            "source": "aws.states", "account": ACCOUNT, "time": described["startDate"].isoformat(),
            "region": REGION, "resources": [arn],
            "detail": {"executionArn": arn, "stateMachineArn": described["stateMachineArn"],
                       "name": described["name"], "status": described["status"],
                       "startDate": millis(described["startDate"]), "stopDate": millis(described.get("stopDate")),
                       "input": described.get("input"), "output": described.get("output"),
                       "inputDetails": {"included": True}, "outputDetails": {"included": True}},
        }

    def deliver_end(self, arn: str) -> dict[str, Any] | None:
        """Deliver the execution's status change to each execution rule whose pattern (moto's matcher) takes it;
        the (single) target's answer, or None when no rule took it. A target that raises is run again, as Lambda
        retries an asynchronous event twice; the last error propagates."""
        event = self.status_change(arn)
        answer = None
        for pattern, targets in self.launcher.execution_rules:
            if not EventPattern.load(json.dumps(pattern)).matches_event(event):
                continue
            for handler in targets:
                function = self.lambdas.handler_for_name(handler)
                for tries_left in (2, 1, 0):
                    try:
                        answer = function(json.loads(json.dumps(event)), None)
                        break
                    except Exception:
                        if not tries_left:
                            raise
        return answer
