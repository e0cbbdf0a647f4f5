"""Resuming a run that ended: whether a new execution may continue it, and after which attempt.

A run is its id and its checkpoint prefix (jobs.render.training_job.checkpoint_s3_uri), so a request with `resume_run`
starts a new execution under the old id: its attempts train on the same checkpoints, numbered on from the
run's last. Prepare finds the run's earlier jobs (SageMaker ListTrainingJobs by the id's random part, each
kept only when jobs.retry.run_state.is_ours says it carries the run's marker) and hands their descriptions here; every
refusal is a RequestInvalid naming the field, the run and what to do instead.

Not seen from here: an earlier execution of the run that is between two attempts (waiting out a capacity
shortage) has no job running, so it is not "active" to this check.
"""

from __future__ import annotations

from typing import Any

from contract.errors import Problem, RequestInvalid
from contract.hyperparameters import decode_hyperparameters
from jobs.naming import attempt_of
from jobs.request.schema import JobRequest
from jobs.retry.run_state import RUNNING

FIELD = "resume_run"


def attempt_number(job: dict[str, Any]) -> int:
    """The attempt a job (DescribeTrainingJob) is, by its name's `-a<N>` (jobs.naming.attempt_of)."""
    return attempt_of(job.get("TrainingJobName", ""))


def resume_command(run_id: str) -> str:
    """What a user types to continue a run (one home for the text every message quotes)."""
    return f"trainctl resume {run_id}"


def resume_point(request: JobRequest, jobs: list[dict[str, Any]], checkpoint_uri: str) -> int:
    """The last attempt number of run `request.resume_run`, whose jobs (DescribeTrainingJob, the run's own
    only) are `jobs`; RequestInvalid when the run cannot be continued by this request."""
    run_id = request.resume_run
    if not jobs:
        _refuse(FIELD, f"no training job of run {run_id} was found; check the id (an execution's output and "
                       "`trainctl status EXECUTION` show its run_id)")
    active = [j for j in jobs if j.get("TrainingJobStatus") in RUNNING]
    if active:
        job = active[0]
        _refuse(FIELD, f"run {run_id} is still active: {job['TrainingJobName']} is {job['TrainingJobStatus']}; "
                       f"wait for it to end (or `trainctl stop` its execution), then {resume_command(run_id)}")
    last = max(jobs, key=attempt_number)
    if last.get("TrainingJobStatus") == "Completed":
        _refuse(FIELD, f"run {run_id} completed ({last['TrainingJobName']}): nothing to resume; to train further "
                       f"start a new run from its weights: init_from_run {run_id!r} instead of resume_run (its "
                       f"checkpoints: {checkpoint_uri})")
    _check_same_model(request, last, run_id, "resume with the run's {name}, or start a new run")
    return attempt_number(last)


def check_init_run(request: JobRequest, jobs: list[dict[str, Any]]) -> None:
    """RequestInvalid unless run `request.init_from_run` exists here (`jobs`: its own jobs) and trained this
    model: its checkpoints are loaded as weights of the same shape only."""
    run_id = request.init_from_run
    if not jobs:
        _refuse("init_from_run", f"no training job of run {run_id} was found on this platform; check the id "
                                 "(`trainctl runs` lists them)")
    _check_same_model(request, max(jobs, key=attempt_number), run_id, "start from a run of this {name}")


def _check_same_model(request: JobRequest, job: dict[str, Any], run_id: str, fix: str) -> None:
    trained = decode_hyperparameters(job.get("HyperParameters") or {})
    for name in ("model", "model_size"):
        if name in trained and trained[name] != getattr(request, name):
            _refuse(name, f"run {run_id} trained {name} {trained[name]!r}, and its checkpoint cannot take "
                          f"{getattr(request, name)!r}: {fix.format(name=name)} ({trained[name]!r})")


def _refuse(field: str, message: str) -> None:
    raise RequestInvalid([Problem(field, message)])
