"""One run, one writer: several actors on one run, through the synthesized state machine in moto with the run
registry (a real DynamoDB table in moto, created as the template declares it) and the execution-status rule.

Interleavings are forced, not timed: an execution is held inside a state (a Wait state, a function, or a look at its
running job) while the test starts, runs or stops others from there (tests/launcher/harness.py). Throughout, the
emulated SageMaker records every create made while another job on the same checkpoint prefix still ran
(`world.overlaps`): it must stay empty.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import boto3
import pytest
from moto.sagemaker.models import sagemaker_backends

from contract.container import ENV_EPOCH, ENV_RUN_ID, FENCE_KEY
from jobs import handler
from jobs.registry import ENDED, Registry, table_name
from tests.launcher import sagemaker_sync as sm
from tests.launcher.definition import ACCOUNT, REGION
from tests.launcher.inputs import job_request

EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:mltrain-job-launcher:"
pytestmark = pytest.mark.usefixtures("no_hooks")


def registry(harness) -> Registry:
    return Registry(boto3.client("dynamodb", region_name=REGION), table_name(harness.settings["name_prefix"]))


def ended_run(harness, name: str) -> str:
    """A run whose first execution ended resumable (its attempt reached max_runtime_hours); its id."""
    first = harness.run(job_request(), [sm.max_runtime_reached()], name=name)
    assert first.status == "FAILED", (first.error, first.cause)
    return first.create_calls[0]["Environment"][ENV_RUN_ID]


def training(outcome: sm.Outcome | None = None, looks: int = 6) -> sm.Outcome:
    """A job that trains for `looks` look-ups, then ends as `outcome` does (completed by default)."""
    import dataclasses

    then = outcome or sm.completed()
    return dataclasses.replace(then, secondary=("Starting", "Downloading", *["Training"] * looks, *then.secondary[-2:]))


def drive(harness, request: dict, outcomes: list[sm.Outcome], name: str, *, where: str | None = None,
          action: Callable[[str], None] | None = None) -> str:
    """Start `request` in a new world playing `outcomes`; the ARN (also in `current`). With `where`, run
    `action(its ARN)` once while it is held there: "Launch" (at a look of the .sync task at its training job),
    "WaitForJob" or "Backoff" (inside the Wait state), or a function ("Prepare", "Decide", "Summarize": before it
    runs)."""
    harness.new_world(outcomes)
    current[0] = arn = EXECUTION + name
    done: list[str] = []

    def once() -> None:
        if not done:
            done.append(arn)
            action(arn)

    handler = {"Prepare": "jobs.handler.prepare", "Decide": "jobs.handler.decide",
               "Summarize": "jobs.handler.summarize"}.get(where or "")
    if where == "Launch":
        harness.world.on_look = lambda job, status: once() if status == "Training" else None
    elif handler:
        harness.lambdas.before = lambda h, event: once() if h == handler else None
    elif where:
        harness.on_wait = lambda execution, state, seconds: once() if state == where and execution == arn else None
    assert harness.start(request, name=name) == arn
    return arn


current: list[str] = [""]  # the ARN of the execution the test drives


# What holds the first execution where the second arrives, and the outcomes that take it there.
HELD = {
    "Launch": [training()],
    "WaitForJob": [sm.throttled_while_training(training(), describes=1)],
    "Backoff": [sm.capacity_error(), sm.completed()],
    "Decide": [sm.capacity_error(), sm.completed()],
    "Summarize": [sm.completed()],
}


@pytest.mark.parametrize("where", list(HELD))
def test_a_second_resume_of_a_run_that_is_driven_is_refused_naming_the_driver(harness, where):
    """Two resumes of one run: the second (a `trainctl resume` or a direct StartExecution with resume_run, both a
    StartExecution) arrives while the first is in each state; it is refused before anything is launched, naming the
    execution or the job that holds the run, and the first goes on to its end."""
    run_id = ended_run(harness, f"one-writer-first-{where}")
    answers = []

    def second_resume(held_arn: str) -> None:
        arn = harness.start(job_request(resume_run=run_id), name=f"one-writer-second-{where}")
        answers.append(harness.wait(arn))

    first = drive(harness, job_request(resume_run=run_id), HELD[where], f"one-writer-driver-{where}", where=where,
                  action=second_resume)
    result = harness.wait(first)
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    (second,) = answers
    assert second.status == "FAILED" and second.error == "RequestInvalid", (second.error, second.cause)
    assert "resume_run:" in second.cause
    assert first in second.cause or any(name in second.cause for name in result.job_names), second.cause
    assert second.states_entered == ["Prepare", "ParseRequestError", "RequestInvalid"]
    assert harness.world.overlaps == []
    assert len(result.create_calls) == len(HELD[where])  # the refused execution created nothing
    record = registry(harness).read(run_id)
    assert record.owner == first and record.status == ENDED and record.outcome == "succeeded"
    assert record.record == result.output["record"]  # the run's record, as the summary counted it


def test_an_execution_that_lost_its_run_during_the_backoff_launches_nothing(harness):
    """The next attempt's name and epoch come from the registry after the wait (NextAttempt): an execution whose run
    another execution holds by then (its lease lost under it, here written into the table) creates no job and ends
    `superseded`, naming the holder; the job it had before ended before the wait."""
    other = EXECUTION + "the-new-holder"

    def lose_the_run(held_arn: str) -> None:
        (record,) = [r for r in registry(harness).scan() if r.owner == held_arn]
        boto3.client("dynamodb", region_name=REGION).update_item(
            TableName=registry(harness).table, Key={"run_id": {"S": record.run_id}},
            UpdateExpression="SET #owner = :other", ExpressionAttributeNames={"#owner": "owner"},
            ExpressionAttributeValues={":other": {"S": other}})

    result = harness.wait(drive(harness, job_request(), [sm.capacity_error(), sm.completed()], "lease-lost",
                                where="Backoff", action=lose_the_run))
    assert result.status == "FAILED" and result.error == "superseded", (result.error, result.cause)
    assert f"held by execution {other}" in result.cause
    assert len(result.create_calls) == 1 and result.states_entered[-6:-4] == ["NextAttempt", "Launching"]


def test_concurrent_resumes_and_direct_starts_leave_one_driver(harness):
    """Three more StartExecutions of one run while its driver waits between attempts (no job runs, so no job
    check can see it): all refused, naming the driver; one job at a time on the prefix."""
    run_id = ended_run(harness, "many-first")
    answers = []

    def others(held_arn: str) -> None:
        arns = [harness.start(job_request(resume_run=run_id), name=f"many-other-{i}") for i in range(3)]
        answers.extend(harness.wait(arn) for arn in arns)

    result = harness.wait(drive(harness, job_request(resume_run=run_id), HELD["Backoff"], "many-driver",
                                where="Backoff", action=others))
    assert result.status == "SUCCEEDED"
    assert [a.error for a in answers] == ["RequestInvalid"] * 3
    assert all(f"held by execution {current[0]}" in a.cause and "still running" in a.cause for a in answers)
    assert harness.world.overlaps == []


def test_two_resumes_racing_for_an_ended_run_take_it_one_at_a_time(harness, monkeypatch):
    """Both read the run's owner (an ended execution) before either writes: the second write finds another owner,
    which is running, and the second resume is refused naming it. Forced: the first resume's Prepare is held
    between its read and its write while the second resume starts and reaches its running job."""
    run_id = ended_run(harness, "race-first")
    reached, release = threading.Event(), threading.Event()
    calls = {"acquiring": 0, "reads": 0}
    original_read, original_acquire = Registry.read, Registry.acquire

    def acquire(self, *args, **kwargs):
        calls["acquiring"] += 1
        return original_acquire(self, *args, **kwargs)

    def read(self, rid):
        record = original_read(self, rid)
        if calls["acquiring"] == 1:
            calls["reads"] += 1
            if calls["reads"] == 1:  # the first resume's Prepare, in acquire between its read and its write
                arns.append(harness.start(job_request(resume_run=run_id), name="race-second"))
                assert reached.wait(30), "the second resume never reached its job"
        return record

    arns: list[str] = []
    monkeypatch.setattr(Registry, "read", read)
    monkeypatch.setattr(Registry, "acquire", acquire)
    harness.new_world([training(looks=3)])
    harness.world.on_look = lambda name, status: (reached.set(), release.wait(30)) if status == "Training" else None
    first = harness.start(job_request(resume_run=run_id), name="race-first-resume")
    refused = harness.wait(first)
    release.set()
    winner = harness.wait(arns[0])
    assert refused.status == "FAILED" and refused.error == "RequestInvalid", (refused.error, refused.cause)
    assert f"held by execution {arns[0]}" in refused.cause
    assert winner.status == "SUCCEEDED", (winner.error, winner.cause)
    assert len(winner.create_calls) == 1 and harness.world.overlaps == []


def test_a_run_resumed_after_its_driver_ended_is_taken_over_with_a_newer_epoch(harness):
    """Sequential resumes are what resume is for: each takes the run from an ended owner, and each attempt's epoch
    is newer than every earlier one (the registry issues them, whatever execution launches)."""
    run_id = ended_run(harness, "epochs-first")
    epochs = []
    for i in range(2):
        result = harness.run(job_request(resume_run=run_id), [sm.capacity_error(), sm.max_runtime_reached()],
                             name=f"epochs-{i}")
        epochs += [int(c["Environment"][ENV_EPOCH]) for c in result.create_calls]
    assert epochs == sorted(set(epochs)) and len(epochs) == 4
    record = registry(harness).read(run_id)
    assert record.last_epoch == epochs[-1] and [a[FENCE_KEY] for a in record.attempts][-4:] == epochs


STOP_IN = {
    "Prepare": [sm.completed()],
    "Launch": [training()],
    "Decide": [sm.capacity_error(), sm.completed()],
    "WaitForJob": [sm.throttled_while_training(training(), describes=1)],
    "Backoff": [sm.capacity_error(), sm.completed()],
    "Summarize": [sm.completed()],
}


@pytest.mark.parametrize("where", list(STOP_IN))
def test_a_console_stop_in_any_state_leaves_no_job_running(harness, where):
    """StopExecution (the console's Stop, or code) while the execution is in each state: the execution ends ABORTED,
    the execution-status rule's reaper stops whatever job of the run still runs, and the run is let go, so that a
    resume may take it."""
    result = harness.wait(drive(harness, job_request(), STOP_IN[where], f"console-stop-{where}", where=where,
                                action=harness.stop))
    assert result.status == "ABORTED", (result.status, result.error, result.cause)
    assert not [name for name, status in result.jobs.items() if status == "InProgress"], result.jobs
    assert result.reaped is not None and result.reaped["execution"] == current[0]
    if result.create_calls:
        run_id = result.create_calls[0]["Environment"][ENV_RUN_ID]
        record = registry(harness).read(run_id)
        assert record.status == ENDED and record.owner == current[0]


def test_without_the_reaper_a_console_stop_leaves_the_job_billing(harness):
    """The failure the reaper answers, shown on the same path: StopExecution does not stop a job the execution
    only watches."""
    result = harness.wait(drive(harness, job_request(), [training()], "console-stop-unreaped", where="Launch",
                                action=harness.stop), deliver=False)
    assert result.status == "ABORTED"
    assert list(result.jobs.values()) == ["InProgress"]
    harness.deliver_end(current[0])
    assert list(harness.world.statuses().values()) in (["Stopping"], ["Stopped"])


@pytest.mark.parametrize("unseen", [1, 2])
def test_a_job_whose_create_answered_500_and_shows_up_late_is_waited_on_not_doubled(harness, unseen):
    """CreateTrainingJob answered 500 but created the job, which the first look-ups miss (SageMaker's reads are
    eventually consistent): Decide looks again (SETTLE_LOOKS times) before it starts another, finds the job, and
    waits on it; no second job on the prefix."""
    result = harness.run(job_request(), [sm.created_unseen(looks=unseen, then=training(looks=4))],
                         name=f"late-visible-{unseen}")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert len(result.create_calls) == 1 and harness.world.overlaps == []
    assert [state for name, state, _ in harness.waits if name == f"late-visible-{unseen}"].count("WaitForJob") >= unseen


def test_a_job_that_shows_up_after_its_attempt_was_given_up_is_stopped_when_the_run_ends(harness):
    """Missed by every settling look-up, the attempt counts as never created and the next one runs; when the run
    ends, every running job carrying the run's marker is stopped, recorded or not."""
    from jobs.retry.policy import SETTLE_LOOKS

    result = harness.run(job_request(), [sm.created_unseen(looks=SETTLE_LOOKS, then=training(looks=50)),
                                         sm.completed()], name="late-visible-given-up")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    late = result.job_names[0]
    assert result.jobs[late] in ("Stopping", "Stopped") and late in result.stop_calls
    assert late in result.output["stopped_jobs"]


def test_a_run_started_before_the_registry_is_still_resumed(harness):
    """A run whose executions ran before the registry existed has no item: its resume creates one (its jobs are found
    by their marker, as before) and trains on with an epoch above every earlier attempt's number."""
    run_id = ended_run(harness, "before-registry-first")
    boto3.client("dynamodb", region_name=REGION).delete_item(
        TableName=table_name(harness.settings["name_prefix"]), Key={"run_id": {"S": run_id}})
    result = harness.run(job_request(resume_run=run_id), [sm.completed()], name="before-registry-resume")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    (create,) = result.create_calls
    assert create["TrainingJobName"].endswith("-a2") and create["Environment"][ENV_EPOCH] == "2"
    record = registry(harness).read(run_id)
    assert record.owner.endswith(":before-registry-resume") and record.status == ENDED
    assert [a["job_name"] for a in record.attempts] == [create["TrainingJobName"]]


def test_a_job_squatting_on_the_next_attempts_name_with_the_runs_marker_is_never_adopted(harness, monkeypatch):
    """The next attempt's name is minted after the Backoff wait (NextAttempt): during the wait the history names no
    second attempt. Once NextAttempt has answered, its name and the run id are in the history: a job created under
    that name with the run's marker before the Launch state's create, by someone who cannot pass the platform's
    execution role, is left alone; the run goes on under a new name and reports its own job's result, never the
    squatter's."""
    squatted, seen_in_backoff = [], []
    relaunch = handler.relaunch

    def in_backoff(arn: str) -> None:
        events = harness.sfn.get_execution_history(executionArn=arn)["events"]
        seen_in_backoff.append("-a2" in json.dumps(events, default=str))

    def relaunch_then_squat(event, context=None):
        out = relaunch(event, context)
        if not squatted:
            create = out["launch"]["create"]
            foreign = {**create, "RoleArn": "arn:aws:iam::123456789012:role/someone-else"}
            boto3.client("sagemaker", region_name=REGION).create_training_job(**foreign)
            job = sagemaker_backends[ACCOUNT][REGION].training_jobs[create["TrainingJobName"]]
            job.environment, job.training_job_status = foreign["Environment"], "InProgress"  # moto keeps neither
            squatted.append(create["TrainingJobName"])
        return out

    monkeypatch.setattr("jobs.handler.relaunch", relaunch_then_squat)
    result = harness.wait(drive(harness, job_request(), [sm.capacity_error(), sm.completed(), sm.completed(
        train_loss=1.5)], "squatter", where="Backoff", action=in_backoff))
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert seen_in_backoff == [False]  # nothing to squat on while the run waits
    (name,) = squatted
    assert [c["TrainingJobName"] for c in result.create_calls][1] == name  # our create met the squatter's job
    attempts = result.output["attempts"]
    assert attempts[1]["status"] == "NotCreated" and "taken by a job this run did not create" in attempts[1]["reason"]
    assert attempts[-1]["job_name"] != name and attempts[-1]["status"] == "Completed"
    assert name not in result.stop_calls  # never stopped by this run either
