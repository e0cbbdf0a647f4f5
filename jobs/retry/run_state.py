"""The run state the state machine carries between attempts, and the summary it ends with.

A run is one execution of the state machine: one request, one checkpoint prefix, one or more attempts
(training jobs). `RunState` travels through Step Functions as plain JSON, e.g.
    {"run_id", "name", "execution", "started_at", "started_epoch", "attempt", "job_name", "instance_type",
     "spot", "checkpoint_s3_uri", "counts": {...}, "waited_seconds", "attempts": [{...}, ...], "resumed_after"}
It holds what changes as the run goes, not the request: the request is the execution's input, which the state
machine hands to the functions that need it (`$$.Execution.Input`), so the state does not grow with it
(jobs.request.state_size). The handlers read it with `RunState.from_dict` and hand `to_dict()` to the next state; the
ASL reads `name` and `job_name`; the shape is the launcher's contract with its own past executions (and
trainctl reads it back from their histories), so from_dict still takes the shape before `name` replaced
`request`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from contract.container import (
    ENV_MLFLOW_EXPERIMENT,
    ENV_MLFLOW_TRACKING_URI,
    ENV_RUN_ID,
    ENV_TENSORBOARD_DIR,
    mlflow_place,
)
from contract.metrics import (
    CHECKPOINT_AGE_S,
    CHECKPOINT_S,
    CHECKPOINT_SAVES,
    EVAL_S,
    STARTUP_S,
    STEP,
    TRAIN_S,
)
from contract.schema import to_jsonable
from jobs.naming import LEGACY_RUN_ID
from jobs.request.schema import JobRequest
from jobs.retry.classify import Category, Failure
from jobs.timestamps import to_epoch


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """boto3 output (datetimes) as JSON values."""
    return json.loads(json.dumps(value, default=lambda v: v.isoformat() if hasattr(v, "isoformat") else str(v)))


@dataclass
class Execution:
    name: str = ""
    start_time: str = ""
    # Its ARN ($$.Execution.Id): who holds the run in the registry (jobs.registry). Empty for an execution on a
    # definition before the registry, which then has no lease to take or give back.
    arn: str = ""


@dataclass
class Counts:
    """Failures so far by the categories the policy bounds, and the current run of API errors."""

    capacity: int = 0
    spot_interruption: int = 0
    internal: int = 0
    quota: int = 0
    throttling: int = 0
    api_error_streak: int = 0  # quota or throttling failures in a row
    interruption: int = 0  # stops nobody the launcher knows of asked for (jobs.retry.classify.Category.INTERRUPTION)

    def of(self, category: Category) -> int:
        return getattr(self, category.value, 0)

    def record(self, category: Category) -> None:
        if category.value in _COUNTED:
            setattr(self, category.value, self.of(category) + 1)
        api_error = category in (Category.QUOTA, Category.THROTTLING)
        self.api_error_streak = self.api_error_streak + 1 if api_error else 0


_COUNTED = tuple(f.name for f in dataclasses.fields(Counts) if f.name != "api_error_streak")


@dataclass
class Attempt:
    attempt: int
    job_name: str
    instance_type: str  # the type, or "2xml.p4d.24xlarge,1xml.c5.4xlarge" for instance groups
    instance_count: int
    spot: bool
    status: str = "InProgress"  # TrainingJobStatus, or NotCreated when CreateTrainingJob failed
    secondary_status: str = ""
    category: str = ""  # a Category's value once the attempt failed
    reason: str = ""
    started_at: str = ""
    ended_at: str = ""
    # As it was launched (from its CreateTrainingJob request): its own time limit (MaxWaitTimeInSeconds with
    # Spot, else MaxRuntimeInSeconds), the training plan it ran on, and whether SageMaker checked its instances.
    limit_seconds: int = 0
    training_plan: str = ""
    infra_check: bool = False
    training_seconds: int | None = None
    billable_seconds: int | None = None
    # Work lost when the attempt ended unfinished: its newest checkpoint's age then (jobs.outcome.run_record), or,
    # when the job did not say (lost_is_upper_bound), its whole training time.
    lost_seconds: int = 0
    # While the job runs with no `.sync` task waiting on it (the launch task failed but the job exists),
    # Decide looks it up again and again: how often, and how many look-ups in a row found no answer.
    looks: int = 0
    lookup_errors: int = 0
    stopped_by_launcher: bool = False  # the run ended while the job ran: the launcher stopped it
    lost_is_upper_bound: bool = False
    # Where its time went (job_figures; None: the job did not say) and the step it reached.
    queued_seconds: int | None = None
    startup_seconds: int | None = None
    train_seconds: int | None = None
    checkpoint_seconds: int | None = None
    eval_seconds: int | None = None
    step: int | None = None
    checkpoint_saves: int | None = None  # saves on the cadence, whose stall checkpoint_seconds includes


@dataclass
class RunState:
    run_id: str
    name: str  # the request's
    execution: Execution
    started_at: str
    started_epoch: float
    attempt: int = 0
    job_name: str = ""  # of the current attempt
    instance_type: str = ""  # of the current attempt
    spot: bool = False  # of the current attempt
    checkpoint_s3_uri: str = ""
    # Where SageMaker syncs the run's TensorBoard event files (empty when the request turned tensorboard off).
    tensorboard_s3_uri: str = ""
    # The MLflow tracking server and experiment the run logs to (empty without a server in the platform settings).
    mlflow_tracking_uri: str = ""
    mlflow_experiment: str = ""
    counts: Counts = field(default_factory=Counts)
    waited_seconds: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    # A resumed run (request.resume_run): the last attempt number of its earlier executions. Its attempts are
    # numbered on from there, while retry.max_attempts counts this execution's only (a new budget).
    resumed_after: int = 0
    # Training plans an attempt of this run was stopped on (a plan's end stops its jobs): never targeted again.
    plans_ended: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        """The state as an earlier handler wrote it (trusted: only the launcher writes it), also in the shape
        before `name` replaced the whole `request` (executions started on an earlier definition)."""
        fields = {**data, "execution": Execution(**data["execution"]), "counts": Counts(**data["counts"]),
                  "attempts": [Attempt(**a) for a in data["attempts"]]}
        if "request" in fields:
            fields["name"] = fields.pop("request")["name"]
        if not fields.get("job_name") and fields["attempts"]:
            fields["job_name"] = fields["attempts"][-1].job_name
        return cls(**fields)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> RunState:
        return cls.from_dict(json.loads(text))

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    @property
    def attempts_used(self) -> int:
        """Attempts of this execution, which retry.max_attempts bounds."""
        return self.attempt - self.resumed_after

    @property
    def mlflow_run(self) -> str:
        """Where the run's MLflow run is, in words a person can search by; "" when it logs to no server."""
        if not self.mlflow_tracking_uri:
            return ""
        return mlflow_place(self.mlflow_tracking_uri, self.mlflow_experiment, self.run_id)


# The output field of an execution that handed its run over near the history limit (the launcher's ContinuedIn state):
# the ARN of the execution the run went on in.
CONTINUED_IN = "continued_in"

# TrainingJobStatus values of a job that still runs (or is on its way to Stopped); jobs.retry.classify.ENDED those of
# one that has ended.
RUNNING = ("InProgress", "Stopping")
# Statuses of attempts whose job may still run: never seen ended (Unknown: a create whose answer said nothing sure).
MAY_RUN = (*RUNNING, "Unknown")


def is_ours(run: RunState, job: dict[str, Any], role_arn: str) -> bool:
    """Whether a job found under one of the run's attempt names is the run's own: its Environment carries the
    run's id (contract.container.ENV_RUN_ID), which the launcher renders into every attempt and a request may
    not set, and it runs as the platform's execution role `role_arn`. Neither the name, the checkpoint prefix nor
    the run id proves it: they are public (the execution's history shows them, the next attempt's name before its
    wait), and anyone allowed to create training jobs under the name prefix can pick them. The role can only be
    passed by whom IAM lets pass it (the launcher: platform_constructs.launch_task), so a job carrying it was
    created by the launcher (or an account administrator). A job that is not the run's is never waited on, adopted
    or stopped.
    """
    if job.get("RoleArn") != role_arn:
        return False
    marker = (job.get("Environment") or {}).get(ENV_RUN_ID)
    if marker is None and LEGACY_RUN_ID.fullmatch(run.run_id):
        # A run started before jobs carried the marker: its jobs have none, and waiting on them (the old rule:
        # the checkpoint prefix) beats starting a second job on the same checkpoints. New run ids never match.
        return (job.get("CheckpointConfig") or {}).get("S3Uri") in (None, run.checkpoint_s3_uri)
    return marker == run.run_id


def job_figures(job: Mapping[str, Any]) -> dict[str, Any]:
    """The attempt's figures a job description holds (Attempt's fields of the same names); None
    for each one the job does not tell."""
    created, started = to_epoch(job.get("CreationTime")), to_epoch(job.get("TrainingStartTime"))
    ended = to_epoch(job.get("TrainingEndTime")) or to_epoch(job.get("LastModifiedTime"))
    metrics = {m.get("MetricName"): m.get("Value") for m in job.get("FinalMetricDataList") or []}
    queued = started - created if created and started else (ended - created if created and ended else None)
    startup = None
    if metrics.get(STARTUP_S) is not None:
        startup = metrics[STARTUP_S] + _phase_start(job, "Training", after=started)
    return {
        "queued_seconds": _whole(queued),
        "startup_seconds": _whole(startup),
        "train_seconds": _whole(metrics.get(TRAIN_S)),
        "checkpoint_seconds": _whole(metrics.get(CHECKPOINT_S)),
        "eval_seconds": _whole(metrics.get(EVAL_S)),
        "checkpoint_age_seconds": _whole(metrics.get(CHECKPOINT_AGE_S)),
        "step": _whole(metrics.get(STEP)),
        "checkpoint_saves": _whole(metrics.get(CHECKPOINT_SAVES)),
    }


def _phase_start(job: Mapping[str, Any], status: str, after: float | None) -> float:
    """Seconds from `after` (the billing start) to the first `status` secondary-status transition; 0 when
    either is unknown."""
    for transition in job.get("SecondaryStatusTransitions") or []:
        if transition.get("Status") == status:
            begun = to_epoch(transition.get("StartTime"))
            return max(begun - after, 0.0) if begun and after else 0.0
    return 0.0


def _whole(value: float | None) -> int | None:
    return None if value is None else max(int(round(value)), 0)


def observe(run: RunState, job: dict[str, Any]) -> Attempt:
    """Record what a look-up of the current attempt's job saw, without ending the attempt."""
    current = run.current
    current.status = job.get("TrainingJobStatus", current.status)
    current.secondary_status = job.get("SecondaryStatus", current.secondary_status)
    return current


def note_lookup(run: RunState, error: str) -> Attempt:
    """Count a look-up of the current attempt's job: one more look, or one more failed look in a row."""
    current = run.current
    if error:
        current.lookup_errors += 1
    else:
        current.lookup_errors = 0
        current.looks += 1
    return current


def new_run(request: JobRequest, *, run_id: str, execution: dict[str, Any], now: float) -> RunState:
    started = to_epoch(execution.get("start_time")) or now
    return RunState(
        run_id=run_id,
        name=request.name,
        execution=Execution(name=execution.get("name", ""), start_time=execution.get("start_time") or iso(started),
                            arn=execution.get("id", "")),
        started_at=iso(started),
        started_epoch=started,
        instance_type=request.training_instance_type,
        spot=request.spot,
    )


def start_attempt(run: RunState, create: dict[str, Any], *, attempt: int, now: float) -> None:
    resources = create["ResourceConfig"]
    groups = resources.get("InstanceGroups", [])
    run.attempt = attempt
    run.job_name = create["TrainingJobName"]
    run.checkpoint_s3_uri = create["CheckpointConfig"]["S3Uri"]
    run.tensorboard_s3_uri = create["TensorBoardOutputConfig"]["S3OutputPath"] \
        if ENV_TENSORBOARD_DIR in create["Environment"] else ""
    run.mlflow_tracking_uri = create["Environment"].get(ENV_MLFLOW_TRACKING_URI, "")
    run.mlflow_experiment = create["Environment"].get(ENV_MLFLOW_EXPERIMENT, "")
    run.instance_type = resources.get("InstanceType") or run.instance_type
    run.spot = create["EnableManagedSpotTraining"]
    run.attempts.append(Attempt(
        attempt=attempt,
        job_name=create["TrainingJobName"],
        instance_type=resources.get("InstanceType")
        or ",".join(f"{g['InstanceCount']}x{g['InstanceType']}" for g in groups),
        instance_count=resources.get("InstanceCount") or sum(g["InstanceCount"] for g in groups),
        spot=create["EnableManagedSpotTraining"],
        started_at=iso(now),
        **launched_as(create),
    ))


def launched_as(create: dict[str, Any]) -> dict[str, Any]:
    """What an attempt's later decisions need of its CreateTrainingJob request (Attempt's fields), so that the
    request need not travel on once the job is launched."""
    stopping = create["StoppingCondition"]
    return {"limit_seconds": stopping.get("MaxWaitTimeInSeconds") or stopping["MaxRuntimeInSeconds"],
            "training_plan": create["ResourceConfig"].get("TrainingPlanArn", ""),
            "infra_check": bool(create.get("InfraCheckConfig", {}).get("EnableInfraCheck"))}


def finish_attempt(run: RunState, *, now: float, job: dict[str, Any] | None,
                   failure: Failure | None = None) -> Attempt:
    """Record the outcome of the current attempt; on failure count it by category."""
    current = run.current
    started = to_epoch(current.started_at) or now
    age = None
    if job:
        current.status = job.get("TrainingJobStatus", current.status)
        current.secondary_status = job.get("SecondaryStatus", "")
        current.training_seconds = job.get("TrainingTimeInSeconds")
        current.billable_seconds = job.get("BillableTimeInSeconds")
        figures = job_figures(job)
        age = figures.pop("checkpoint_age_seconds")
        for name, value in figures.items():
            setattr(current, name, value)
        started = to_epoch(job.get("CreationTime")) or started
        ended = to_epoch(job.get("TrainingEndTime")) or to_epoch(job.get("LastModifiedTime")) or now
    else:
        ended = now
    current.ended_at = iso(ended)
    if failure is None:
        current.category = ""
        return current
    if not job:
        current.status = "NotCreated" if not failure.job_started else "Failed"
    current.category = failure.category.value
    current.reason = failure.reason
    # Work since the last checkpoint is lost: its age at the end when the job printed it; else the attempt's
    # training time (or, lacking it, its wall-clock time), an upper bound.
    if failure.job_started:
        current.lost_is_upper_bound = age is None
        current.lost_seconds = age if age is not None else int(
            current.training_seconds if current.training_seconds is not None else max(ended - started, 0))
    run.counts.record(failure.category)
    return current
