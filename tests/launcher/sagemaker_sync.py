"""A test-only `arn:aws:states:::sagemaker:createTrainingJob.sync` integration for moto's interpreter.

moto 5.2.5 has no SageMaker `.sync` integration, and its training jobs complete at once, accept duplicate
names and cannot be stopped. This integration, modelled on moto's own Glue `.sync` one (StartJobRun, then poll
GetJobRun), calls CreateTrainingJob on moto's SageMaker and then polls DescribeTrainingJob, while a
`ScriptedSageMaker` plays each attempt's scripted outcome on moto's job record (status, secondary status
transitions, failure reason, metrics, artifacts). `sagemaker_hooks()` routes moto's own DescribeTrainingJob
and a StopTrainingJob (which moto lacks) through the world, so that every reader (the poller, the decide and
summarize Lambdas, the state machine's StopTrainingJob task, trainctl) sees, advances and stops the same job.

What the world emulates beyond outcomes, as the real API does (docs/REFERENCE.md):
- a reused job name: ResourceInUse "Training job names must be unique within an AWS account and region, and a
  training job with this name already exists" (moto would answer ValidationException);
- CreateTrainingJob answering HTTP 5xx after it created the job (`Outcome.error_after_create`), and a create
  whose answer was lost and that was sent again, meeting its own name in use (`Outcome.sent_twice`);
- DescribeTrainingJob throttled (ThrottlingException "Rate exceeded") while the job trains
  (`Outcome.throttled_describes`), whoever asks;
- StopTrainingJob: an InProgress job goes Stopping, then Stopped on the next look; any other job answers
  ValidationException (the service's wording for a job that cannot be stopped is unverified).

How failures surface, and how sure we are:
- A job that ends Failed or Stopped fails the task with Error `States.TaskFailed` and Cause = the
  DescribeTrainingJob output as JSON (docs/REFERENCE.md; the exact shape is unverified: timestamps here are epoch
  milliseconds, as Step Functions renders them in other SageMaker task outputs).
- A job that ends Completed returns the DescribeTrainingJob output (ResultPath `$.job`).
- An API error at CreateTrainingJob fails the task with Error `SageMaker.<Exception>`: the AWS Java SDK's
  exception name, `ResourceLimitExceededException` for modelled errors and `AmazonSageMakerException` for
  unmodelled ones (ThrottlingException, ValidationException), and a Cause in the Java SDK's form
  `<message> (Service: AmazonSageMaker; Status Code: 400; Error Code: <code>; Request ID: <id>; Proxy: null)`.
  The error names follow AWS's own Step Functions SageMaker retry example; the Cause form is unverified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.validate import ParamValidator
from moto.core.responses import EmptyResult
from moto.sagemaker.exceptions import SagemakerClientError, ValidationError
from moto.sagemaker.models import SageMakerModelBackend, sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse
from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import CustomErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
    FailureEvent,
    FailureEventException,
)
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
    StatesErrorNameType,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import ResourceCondition
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
    StateTaskServiceCallback,
)
from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

from jobs.retry.run_state import RUNNING
from tests.launcher.definition import ACCOUNT, REGION

RESOURCE = "arn:aws:states:::sagemaker:createTrainingJob.sync"

_SERVICE_MODEL = botocore.session.get_session().get_service_model("sagemaker")
CREATE_INPUT_SHAPE = _SERVICE_MODEL.operation_model("CreateTrainingJob").input_shape
# Exceptions the SageMaker API model declares get their own Java SDK class; the rest are AmazonSageMakerException.
MODELLED_ERRORS = {shape.name for shape in _SERVICE_MODEL.operation_model("CreateTrainingJob").error_shapes}


# moto 5.2.5's ASL lexer reads the payload key "RoleArn.$" as the `Credentials` keyword and keeps it as a
# literal key "RoleArn.$" with the path string as its value (AWS resolves the path). The harness renames such
# keys before moto parses the definition and this integration renames them back; test_moto_internals.py
# fails once moto parses them itself, so that the shim can go.
MOTO_KEYWORD_SUFFIX = "__moto_keyword"
MOTO_KEYWORD_KEYS = {"RoleArn.$": f"RoleArn{MOTO_KEYWORD_SUFFIX}.$"}


def without_moto_keyword_keys(value: Any) -> Any:
    if isinstance(value, list):
        return [without_moto_keyword_keys(v) for v in value]
    if isinstance(value, dict):
        return {MOTO_KEYWORD_KEYS.get(k, k): without_moto_keyword_keys(v) for k, v in value.items()}
    return value


class InvalidCreateRequest(AssertionError):
    """The state machine sent a CreateTrainingJob request that botocore itself would reject."""


def validate_create_request(params: dict[str, Any]) -> None:
    report = ParamValidator().validate(params, CREATE_INPUT_SHAPE)
    if report.has_errors():
        raise InvalidCreateRequest(report.generate_report())


# --------------------------------------------------------------------------------------- scripted outcomes


@dataclass(frozen=True)
class Outcome:
    """What one CreateTrainingJob attempt does: an API error at create, or a job that ends a certain way."""

    status: str = "Completed"  # final TrainingJobStatus: Completed | Failed | Stopped
    secondary: tuple[str, ...] = ("Starting", "Downloading", "Training", "Uploading", "Completed")
    failure_reason: str | None = None
    api_error: tuple[str, str] | None = None  # (error code, message) raised by CreateTrainingJob
    # FinalMetricDataList: each metric's last value, whatever the job's end (SageMaker scrapes the logs).
    metrics: dict[str, float] = field(default_factory=dict)
    training_seconds: int = 3600
    billable_seconds: int | None = None  # managed Spot bills fewer seconds than it trains; None: the same
    # (error code, message, HTTP status) that CreateTrainingJob answers although it created the job.
    error_after_create: tuple[str, str, int] | None = None
    # The first CreateTrainingJob created the job but its answer was lost; the same request, sent again,
    # meets the attempt's own name in use (ResourceInUse).
    sent_twice: bool = False
    # How many DescribeTrainingJob calls, by anyone, answer ThrottlingException once the job is Training.
    throttled_describes: int = 0
    # How many StopTrainingJob calls answer ThrottlingException before one is taken.
    throttled_stops: int = 0
    # How many DescribeTrainingJob calls answer "not found", and listings leave the job out, after it was created:
    # SageMaker's reads are eventually consistent, and a job whose create answered 5xx may show up late.
    unseen_looks: int = 0
    # Seconds of the world's clock (ScriptedSageMaker.clock) the job stays in Training, whatever the look-ups.
    trains_for_seconds: float = 0

    @property
    def label(self) -> str:
        return self.api_error[0] if self.api_error else f"{self.status}/{self.secondary[-1]}"


def completed(**metrics: float) -> Outcome:
    return Outcome(metrics=metrics or {"train_loss": 2.31, "tokens_per_sec": 12345.6})


def capacity_error(instance_type: str = "ml.p4d.24xlarge") -> Outcome:
    return Outcome(
        status="Failed",
        secondary=("Starting", "Failed"),
        failure_reason=(
            "CapacityError: Unable to provision requested ML compute capacity. "
            f"Please retry using a different ML instance type. ({instance_type})"
        ),
        training_seconds=0,
    )


def algorithm_error() -> Outcome:
    return Outcome(
        status="Failed",
        secondary=("Starting", "Downloading", "Training", "Failed"),
        failure_reason=(
            'AlgorithmError: ExecuteUserScriptError:\nExitCode 1\nErrorMessage "ValueError: '
            'expected a 2-D input, got 3-D"\nCommand "torchrun --nnodes 1 --nproc_per_node 8 train.py"'
        ),
        training_seconds=120,
    )


def internal_error() -> Outcome:
    return Outcome(
        status="Failed",
        secondary=("Starting", "Downloading", "Training", "Failed"),
        failure_reason="InternalServerError: We encountered an internal error. Please try again.",
        training_seconds=900,
    )


def spot_interrupted() -> Outcome:
    """Spot capacity reclaimed and not back within MaxWaitTimeInSeconds (SageMaker's own Spot lifecycle)."""
    return Outcome(
        status="Stopped",
        secondary=(
            "Starting",
            "Downloading",
            "Training",
            "Interrupted",
            "Starting",
            "Stopping",
            "MaxWaitTimeExceeded",
        ),
        training_seconds=1800,
    )


def max_runtime_reached() -> Outcome:
    """The attempt ran out its MaxRuntimeInSeconds (12 h, the test requests' max_runtime_hours): resumable."""
    return Outcome(status="Stopped", secondary=("Starting", "Downloading", "Training", "MaxRuntimeExceeded"),
                   training_seconds=12 * 3600)


def stopped_by_user() -> Outcome:
    return Outcome(
        status="Stopped",
        secondary=("Starting", "Downloading", "Training", "Stopping", "Stopped"),
        training_seconds=600,
    )


def resource_limit_exceeded() -> Outcome:
    return Outcome(
        api_error=(
            "ResourceLimitExceeded",
            "The account-level service limit 'ml.p4d.24xlarge for training job usage' is 2 Instances, with current "
            "utilization of 2 Instances and a request delta of 2 Instances. Please use AWS Service Quotas to request "
            "an increase for this quota.",
        )
    )


def throttled() -> Outcome:
    return Outcome(api_error=("ThrottlingException", "Rate exceeded"))


# The 5xx CreateTrainingJob answers in the Java SDK's words (docs/REFERENCE.md: "InternalFailure", 500).
INTERNAL_FAILURE = ("InternalFailure", "We encountered an internal error. Please try again.", 500)


def created_then_5xx(then: Outcome | None = None) -> Outcome:
    """CreateTrainingJob answers 500 InternalFailure, but the job was created and goes on as `then` does."""
    return dataclasses.replace(then or completed(), error_after_create=INTERNAL_FAILURE)


def throttled_while_training(then: Outcome | None = None, describes: int = 1) -> Outcome:
    """The job trains on to `then`'s end, but `describes` DescribeTrainingJob calls meanwhile are throttled."""
    return dataclasses.replace(then or completed(), throttled_describes=describes)


def created_unseen(looks: int = 1, then: Outcome | None = None) -> Outcome:
    """CreateTrainingJob answers 500 but created the job, which the first `looks` look-ups and listings miss."""
    return dataclasses.replace(created_then_5xx(then), unseen_looks=looks)


def name_in_use(then: Outcome | None = None) -> Outcome:
    """The create's answer is lost and it is sent again: ResourceInUse for the attempt's own, running job."""
    return dataclasses.replace(then or completed(), sent_twice=True)


class ThrottlingError(SagemakerClientError):
    code = "ThrottlingException"


_RESOURCE_IN_USE = ("Training job names must be unique within an AWS account and region, and a training job "
                    "with this name already exists")


class ScriptedSageMaker:
    """Plays one scripted Outcome per CreateTrainingJob call, in order, on moto's SageMaker job records.

    The world in use is `ScriptedSageMaker.current` (the last one made): `sagemaker_hooks()` sends every
    DescribeTrainingJob and StopTrainingJob that reaches moto to it.
    """

    current: ScriptedSageMaker | None = None

    def __init__(self, outcomes: list[Outcome]):
        self.outcomes = list(outcomes)
        self.create_calls: list[dict[str, Any]] = []  # every CreateTrainingJob request, API errors included
        self.describe_calls = 0
        self.stop_calls: list[str] = []
        self.job_names: list[str] = []  # the jobs this world created, in order
        self._steps: dict[str, Any] = {}
        self._throttle: dict[str, int] = {}
        self._stop_throttle: dict[str, int] = {}
        self._played = 0  # outcomes played: one per CreateTrainingJob the integration sends
        self._lock = threading.RLock()
        self._unseen: dict[str, int] = {}
        self.prefixes: dict[str, str] = {}  # job name -> its CheckpointConfig S3Uri
        # Every create made while another job on the same checkpoint prefix still ran: (new job, running job).
        self.overlaps: list[tuple[str, str]] = []
        # A test's hook, run at each look at a job once the look has moved it: (job name, its secondary status). It
        # may start, run or stop executions while the one that looks is held there.
        self.on_look: Callable[[str, str], None] | None = None
        # The time jobs see (Outcome.trains_for_seconds): the harness's simulated clock, when a test sets one.
        self.clock: Callable[[], float] | None = None
        self._trains_until: dict[str, float] = {}
        ScriptedSageMaker.current = self

    @property
    def backend(self):
        return sagemaker_backends[ACCOUNT][REGION]

    def create(self, client, params: dict[str, Any]) -> dict[str, Any]:
        validate_create_request(params)
        with self._lock:
            attempt, self._played = self._played, self._played + 1
            self.create_calls.append(json.loads(json.dumps(params)))
            if attempt >= len(self.outcomes):
                raise AssertionError(
                    f"CreateTrainingJob call {attempt + 1} has no scripted outcome "
                    f"({len(self.outcomes)} scripted)"
                )
            outcome = self.outcomes[attempt]
        name = params["TrainingJobName"]
        self._check_name_free(name)
        if outcome.api_error:
            raise _client_error(*outcome.api_error)
        prefix = params["CheckpointConfig"]["S3Uri"]
        self.overlaps += [(name, other) for other, theirs in self.prefixes.items()
                          if theirs == prefix and self.backend.training_jobs[other].training_job_status in RUNNING]
        self.prefixes[name] = prefix
        response = client.create_training_job(**params)
        job = self.backend.training_jobs[name]
        self.job_names.append(name)
        # moto drops or overwrites some fields; keep what was asked for.
        job.algorithm_specification = params["AlgorithmSpecification"]
        job.resource_config = params["ResourceConfig"]
        job.stopping_condition = params["StoppingCondition"]
        job.environment = params.get("Environment", {})  # SageMaker's DescribeTrainingJob returns it
        job.training_start_time = job.training_end_time = None  # moto stamps both at create; set as it plays
        self._steps[name] = self._play(job, outcome)
        self._throttle[name] = outcome.throttled_describes
        self._stop_throttle[name] = outcome.throttled_stops
        self._unseen[name] = outcome.unseen_looks
        if outcome.trains_for_seconds and self.clock is not None:
            self._trains_until[name] = self.clock() + outcome.trains_for_seconds
        next(self._steps[name])
        if outcome.sent_twice:
            self.create_calls.append(json.loads(json.dumps(params)))
            self._check_name_free(name)
        if outcome.error_after_create:
            raise _client_error(*outcome.error_after_create)
        return response

    def _check_name_free(self, name: str) -> None:
        if name in self.backend.training_jobs:
            # Real SageMaker rejects a reused name with ResourceInUse; moto would silently accept it.
            raise _client_error("ResourceInUse", f"{_RESOURCE_IN_USE} ({self.backend.training_jobs[name].arn})")

    def _play(self, job, outcome: Outcome):
        """Advance the job one secondary status per look, ending in the outcome's final status."""
        start = job.creation_time if isinstance(job.creation_time, datetime) else datetime.now(UTC)
        transitions = []
        final = {"Completed", "Failed", "Stopped", "MaxWaitTimeExceeded", "MaxRuntimeExceeded"}
        for i, secondary in enumerate(outcome.secondary):
            now = start + timedelta(seconds=60 * i)
            self._enter(job, transitions, secondary, now)
            if secondary in final:
                job.training_job_status = outcome.status
            elif secondary == "Stopping":
                job.training_job_status = "Stopping"
            else:
                job.training_job_status = "InProgress"
            if job.training_job_status in ("Completed", "Failed", "Stopped"):
                self._finish(job, outcome, now)
            yield

    @staticmethod
    def _enter(job, transitions: list[dict[str, Any]], secondary: str, now: datetime) -> None:
        if transitions:
            transitions[-1]["EndTime"] = now
        if secondary in ("Downloading", "Training") and getattr(job, "training_start_time", None) is None:
            job.training_start_time = now  # the instances are the job's: billing starts
        transitions.append({"Status": secondary, "StartTime": now, "StatusMessage": secondary})
        job.secondary_status = secondary
        job.secondary_status_transitions = list(transitions)
        job.last_modified_time = now

    def _finish(self, job, outcome: Outcome, now: datetime) -> None:
        job.training_end_time = now
        job.training_time_in_seconds = outcome.training_seconds
        job.billable_time_in_seconds = (outcome.training_seconds if outcome.billable_seconds is None
                                        else outcome.billable_seconds)
        if outcome.failure_reason:
            job.failure_reason = outcome.failure_reason
        job.final_metric_data_list = [
            {"MetricName": name, "Value": value, "Timestamp": now} for name, value in outcome.metrics.items()
        ]
        if outcome.status != "Completed":
            job.model_artifacts = None

    def look(self, name: str) -> None:
        """One DescribeTrainingJob of `name` reaches SageMaker: not found yet, throttled, or the job moves on one
        step (then the test's on_look hook runs, outside the lock)."""
        with self._lock:
            self.describe_calls += 1
            job = self.backend.training_jobs.get(name)
            if self._unseen.get(name, 0) > 0:
                self._unseen[name] -= 1
                raise ValidationError("Requested resource not found.")
            if job is not None and job.secondary_status == "Training" and self._throttle.get(name, 0) > 0:
                self._throttle[name] -= 1
                raise ThrottlingError("Rate exceeded")
            training = job is not None and job.secondary_status == "Training" and self.clock is not None \
                and self.clock() < self._trains_until.get(name, 0)
            if name in self._steps and not training:
                next(self._steps[name], None)
        if self.on_look is not None and job is not None:
            self.on_look(name, job.secondary_status)

    def listed(self, name: str) -> bool:
        """Whether a listing shows the job yet (a listing does not count as a look)."""
        return self._unseen.get(name, 0) == 0

    def describe(self, client, name: str) -> dict[str, Any]:
        description = client.describe_training_job(TrainingJobName=name)
        description.pop("ResponseMetadata", None)
        return description

    def stop(self, name: str) -> None:
        """StopTrainingJob: an InProgress job goes Stopping now and Stopped on the next look."""
        with self._lock:
            self.stop_calls.append(name)
            if self._stop_throttle.get(name, 0) > 0:
                self._stop_throttle[name] -= 1
                raise ThrottlingError("Rate exceeded")
            job = self.backend.training_jobs.get(name)
            if job is None:
                raise ValidationError("Requested resource not found.")
            if job.training_job_status != "InProgress":
                raise ValidationError(f"The job {name} is {job.training_job_status} and cannot be stopped.")
            self._steps[name] = self._stopping(job)
            next(self._steps[name])

    def _stopping(self, job):
        transitions = list(job.secondary_status_transitions or [])
        now = datetime.now(UTC)
        self._enter(job, transitions, "Stopping", now)
        job.training_job_status = "Stopping"
        yield
        self._enter(job, transitions, "Stopped", now)
        job.training_job_status = "Stopped"
        job.training_end_time = now
        job.final_metric_data_list, job.model_artifacts = [], None
        yield

    def statuses(self) -> dict[str, str]:
        """Every job this world created and its TrainingJobStatus, as SageMaker holds it now."""
        return {name: self.backend.training_jobs[name].training_job_status for name in self.job_names}


@contextlib.contextmanager
def sagemaker_hooks() -> Iterator[None]:
    """Route moto's DescribeTrainingJob through `ScriptedSageMaker.current`, and give moto a StopTrainingJob."""
    original = SageMakerModelBackend.describe_training_job

    def describe_training_job(backend, training_job_name: str):
        if ScriptedSageMaker.current is not None:
            ScriptedSageMaker.current.look(training_job_name)
        return original(backend, training_job_name)

    def stop_training_job(response):
        name = response._get_param("TrainingJobName")
        if ScriptedSageMaker.current is None:
            raise ValidationError("Requested resource not found.")
        ScriptedSageMaker.current.stop(name)
        return EmptyResult()

    original_list = SageMakerModelBackend.list_training_jobs

    def list_training_jobs(backend, *args, **kwargs):
        answer = original_list(backend, *args, **kwargs)
        world = ScriptedSageMaker.current
        if world is not None:
            answer["TrainingJobSummaries"] = [j for j in answer["TrainingJobSummaries"]
                                              if world.listed(j["TrainingJobName"])]
        return answer

    with mock.patch.object(SageMakerModelBackend, "describe_training_job", describe_training_job), \
            mock.patch.object(SageMakerModelBackend, "list_training_jobs", list_training_jobs), \
            mock.patch.object(SageMakerResponse, "stop_training_job", stop_training_job, create=True):
        try:
            yield
        finally:
            ScriptedSageMaker.current = None


def _client_error(code: str, message: str, status: int = 400) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": str(uuid.uuid4())},
        },
        "CreateTrainingJob",
    )


def _to_sfn_json(value: Any) -> Any:
    """DescribeTrainingJob output as Step Functions passes it on: timestamps as epoch milliseconds."""
    if isinstance(value, dict):
        return {k: _to_sfn_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_sfn_json(v) for v in value]
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return value


# ------------------------------------------------------------------------------------------ the integration


class StateTaskServiceSageMaker(StateTaskServiceCallback):
    """`sagemaker:createTrainingJob.sync`, backed by a ScriptedSageMaker (set `world` before executing)."""

    world: ScriptedSageMaker | None = None

    def __init__(self):
        # moto's callback base interrupts the task's callback endpoint in a `finally` even for `.sync`, and
        # creates that endpoint only for integrations that declare `.waitForTaskToken`: declare both.
        super().__init__(
            supported_integration_patterns={ResourceCondition.Sync, ResourceCondition.WaitForTaskToken}
        )

    def _get_supported_parameters(self) -> set[str] | None:
        if self.resource.api_action.lower() != "createtrainingjob":
            return None
        renamed = {alias.removesuffix(".$") for alias in MOTO_KEYWORD_KEYS.values()}
        return set(CREATE_INPUT_SHAPE.members) | renamed

    @staticmethod
    def _client():
        # One try per call: a throttled poll reaches the state machine, as the premise of the scenarios is.
        return boto3.client("sagemaker", region_name=REGION, config=Config(retries={"total_max_attempts": 1}))

    def _from_error(self, env, ex: Exception) -> FailureEvent:
        if isinstance(ex, ClientError):
            code = ex.response["Error"]["Code"]
            exception = f"{code}Exception" if code in MODELLED_ERRORS else "AmazonSageMakerException"
            error = f"SageMaker.{exception}"
            meta = ex.response["ResponseMetadata"]
            cause = (
                f"{ex.response['Error']['Message']} (Service: AmazonSageMaker; Status Code: "
                f"{meta['HTTPStatusCode']}; Error Code: {code}; Request ID: {meta['RequestId']}; Proxy: null)"
            )
            return FailureEvent(
                env=env,
                error_name=CustomErrorName(error),
                event_type=HistoryEventType.TaskFailed,
                event_details=EventDetails(
                    taskFailedEventDetails=TaskFailedEventDetails(
                        error=error,
                        cause=cause,
                        resource=self._get_sfn_resource(),
                        resourceType=self._get_sfn_resource_type(),
                    )
                ),
            )
        return super()._from_error(env=env, ex=ex)

    def _eval_service_task(self, env, resource_runtime_part, normalised_parameters: dict, state_credentials):
        # See MOTO_KEYWORD_KEYS: undo the rename that gets "RoleArn.$" past moto's lexer.
        for key in [k for k in normalised_parameters if k.endswith(MOTO_KEYWORD_SUFFIX)]:
            normalised_parameters[key.removesuffix(MOTO_KEYWORD_SUFFIX)] = normalised_parameters.pop(key)
        response = self.world.create(self._client(), normalised_parameters)
        response.pop("ResponseMetadata", None)
        env.stack.append(
            {
                "TrainingJobArn": response["TrainingJobArn"],
                "TrainingJobName": normalised_parameters["TrainingJobName"],
            }
        )

    def _build_sync_resolver(
        self, env, resource_runtime_part, normalised_parameters: dict, state_credentials
    ) -> Callable[[], Any] | None:
        created = env.stack.pop()
        name = created["TrainingJobName"]
        client = self._client()
        world = self.world

        def _sync_resolver() -> Any | None:
            description = world.describe(client, name)
            status = description["TrainingJobStatus"]
            if status in ("InProgress", "Stopping"):
                return None
            output = _to_sfn_json(description)
            if status == "Completed":
                return output
            raise FailureEventException(
                FailureEvent(
                    env=env,
                    error_name=StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed),
                    event_type=HistoryEventType.TaskFailed,
                    event_details=EventDetails(
                        taskFailedEventDetails=TaskFailedEventDetails(
                            resource=self._get_sfn_resource(),
                            resourceType=self._get_sfn_resource_type(),
                            error=StatesErrorNameType.StatesTaskFailed.to_name(),
                            cause=json.dumps(output),
                        )
                    ),
                )
            )

        return _sync_resolver
