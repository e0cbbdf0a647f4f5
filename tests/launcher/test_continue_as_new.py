"""Continue-as-new: a run whose execution nears Step Functions' history limit goes on in a new execution of the same
run, which takes the run over (the registry's hand-over) with its job still running. Through the synthesized state
machine in moto: its StartSuccessor task starts the successor through moto's Step Functions.

The limit is lowered so that a few hours of a job cross it: `jobs.retry.policy.CONTINUE_AT_EVENTS`, where the real
history is counted; or one execution's history is said to be at the limit (`at_limit`), where a test forces which
decision hands over. Time is simulated as in test_history_bound.py: Wait states move a clock that the functions and
the emulated job read. Interleavings are forced as in test_one_writer.py.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from contract.container import ENV_EPOCH, ENV_RUN_ID
from jobs import handler
from jobs.registry import ENDED, Registry
from jobs.retry.policy import HISTORY_LIMIT
from jobs.retry.run_state import CONTINUED_IN
from tests.launcher import sagemaker_sync as sm
from tests.launcher.inputs import job_request
from tests.launcher.lambda_inprocess import FunctionTimedOut
from tests.launcher.test_one_writer import EXECUTION, registry

# The lowered limit of the long-watch test: an execution hands the run over at its first decision past this many
# events. A first decision comes at about 20 events, and each look adds 9.
CONTINUE_AT = 60
# The most an execution may hold: the decision that hands over comes within one look (9 events) past CONTINUE_AT,
# then the hand-over (the Choice, StartSuccessor, ContinuedIn, Continued, the end), or for the last execution the
# summary's states, add at most 16. Measured: 80, 74 and 81 events in the three executions of the long watch.
MOST_EVENTS = CONTINUE_AT + 9 + 16
HANDED_OVER = ["RetryOrFail", "StartSuccessor", "ContinuedIn", "Continued"]
pytestmark = pytest.mark.usefixtures("no_hooks")


def watched_job(hours: float) -> sm.Outcome:
    """A job whose `.sync` poll failed while it trains (the launcher watches it in WaitForJob -> Decide) and that
    completes after `hours` of the simulated clock."""
    return sm.throttled_while_training(dataclasses.replace(
        sm.completed(), secondary=("Starting", "Downloading", "Training", "Completed"),
        trains_for_seconds=hours * 3600), describes=1)


def chain(harness, arn: str, timeout: float = 60, delivered: set[str] | None = None) -> list:
    """The execution and every one it went on in, in order (each waited for, its end delivered to the reaper; the
    ARNs delivered so far in `delivered`)."""
    results = []
    while True:
        result = harness.wait(arn, timeout=timeout)
        results.append(result)
        if delivered is not None:
            delivered.add(arn)
        if result.status != "SUCCEEDED" or CONTINUED_IN not in (result.output or {}):
            return results
        arn = successor_of(result)


def wait_until(condition, what: str, timeout: float = 60) -> None:
    """Hold the calling execution's thread until `condition()` holds; a hang fails the test instead of the suite."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.01)


def at_limit(monkeypatch, name: str) -> None:
    """Execution `name`'s history is at the limit at each of its decisions; every other one's is short."""
    monkeypatch.setattr("jobs.handler.history_length",
                        lambda arn: HISTORY_LIMIT if arn == EXECUTION + name else 10)


def successor_of(result) -> str:
    return result.output[CONTINUED_IN]


def test_a_long_watch_goes_on_in_new_executions_with_its_one_job(harness, simulated_clock, monkeypatch):
    """A 4-hour job watched from its first minutes: every execution hands the run over near the (lowered) limit;
    the job is launched once, watched to its end, and summarized once, by the last execution."""
    monkeypatch.setattr("jobs.retry.policy.CONTINUE_AT_EVENTS", CONTINUE_AT)
    world = harness.new_world([watched_job(hours=4)])
    world.clock = simulated_clock
    delivered: set[str] = set()

    def after_the_predecessors_reaper(handler: str, event: dict) -> None:
        """A successor's Prepare waits until its predecessor has ended and the reaper has seen that end: the reaper
        meets the run handed over but not yet taken (it must leave the job alone)."""
        run_id = (event.get("request") or {}).get("resume_run")
        if handler == "jobs.handler.prepare" and run_id:
            predecessor = registry(harness).read(run_id).owner
            wait_until(lambda: predecessor in delivered, "the predecessor's end delivered")

    harness.lambdas.before = after_the_predecessors_reaper
    executions = chain(harness, harness.start(job_request(max_runtime_hours=24), name="long-watch"),
                       delivered=delivered)

    *continued, last = executions
    sizes = [len(r.history) for r in executions]
    assert len(continued) >= 2 and max(sizes) <= MOST_EVENTS, sizes
    run_id = world.create_calls[0]["Environment"][ENV_RUN_ID]
    for result in continued:
        assert result.status == "SUCCEEDED" and result.output == {"run_id": run_id, CONTINUED_IN: successor_of(result)}
        assert result.states_entered[-4:] == HANDED_OVER
        assert result.reaped["stopped"] == []  # the job went on in the successor
    assert len(world.create_calls) == 1 and world.overlaps == []
    assert last.status == "SUCCEEDED" and last.output["status"] == "Succeeded", (last.error, last.cause)
    assert [(a["job_name"], a["status"]) for a in last.output["attempts"]] == [
        (world.create_calls[0]["TrainingJobName"], "Completed")]
    assert last.output["execution"] == successor_of(continued[-1]).rsplit(":", 1)[-1]
    assert len(last.notifications) == 1
    record = registry(harness).read(run_id)
    assert (record.owner, record.status, record.outcome, record.successor) == (
        continued[-1].output["continued_in"], ENDED, "succeeded", "")


def test_a_hand_over_between_two_attempts_launches_the_next_in_the_successor(harness, monkeypatch):
    """The first attempt is interrupted (spot); the decision to retry is taken where the history is at the limit:
    the successor waits the backoff and launches the next attempt, under the epoch the first execution issued."""
    at_limit(monkeypatch, "handover-retry")
    world = harness.new_world([sm.spot_interrupted(), sm.completed()])
    first, second = chain(harness, harness.start(job_request(spot=True), name="handover-retry"))

    assert first.states_entered[-4:] == HANDED_OVER and "Backoff" not in first.states_entered
    successor = successor_of(first).rsplit(":", 1)[-1]
    assert [name for name, state, _ in harness.waits if state == "Backoff"] == [successor]
    assert second.status == "SUCCEEDED", (second.error, second.cause)
    assert [a["status"] for a in second.output["attempts"]] == ["Stopped", "Completed"]
    epochs = [int(c["Environment"][ENV_EPOCH]) for c in world.create_calls]
    assert len(epochs) == 2 and epochs[0] < epochs[1] and world.overlaps == []
    record = registry(harness).read(second.output["run_id"])
    assert [a["attempt_epoch"] for a in record.attempts] == epochs
    assert (record.owner, record.status) == (successor_of(first), ENDED)


def test_a_resume_while_the_run_is_handed_over_is_refused_naming_the_successor(harness, monkeypatch):
    """The run is handed over between two attempts (no job runs). Between the end of the execution that handed it
    over and its successor's Prepare, the run's owner has ended: a `trainctl resume` arriving then is refused all the
    same, naming the successor, which goes on."""
    at_limit(monkeypatch, "handover-race")
    world = harness.new_world([sm.spot_interrupted(), sm.completed()])
    first_arn = EXECUTION + "handover-race"
    refused, held = [], []

    def resume_first(handler: str, event: dict) -> None:
        execution = event.get("execution") or {}
        if handler != "jobs.handler.prepare" or held or execution.get("id") == first_arn:
            return
        held.append(execution["id"])  # the successor's Prepare, held here
        # The first execution ends right after starting this one.
        wait_until(lambda: harness.sfn.describe_execution(executionArn=first_arn)["status"] != "RUNNING",
                   "the first execution's end")
        run_id = event["request"]["resume_run"]
        refused.append(harness.wait(harness.start(job_request(resume_run=run_id), name="resume-in-handover")))

    harness.lambdas.before = resume_first
    first, second = chain(harness, harness.start(job_request(spot=True), name="handover-race"))

    (resume,) = refused
    assert resume.status == "FAILED" and resume.error == "RequestInvalid", (resume.status, resume.cause)
    assert f"held by execution {successor_of(first)}, which is still running" in resume.cause, resume.cause
    assert resume.reaped["stopped"] == []
    assert second.status == "SUCCEEDED", (second.error, second.cause)
    assert [a["status"] for a in second.output["attempts"]] == ["Stopped", "Completed"]
    assert len(world.create_calls) == 2 and world.overlaps == []


def test_a_console_stop_of_the_successor_stops_the_job_it_took_over(harness, simulated_clock, monkeypatch):
    """The job was launched by the first execution; the successor holds the run when the console stops it: the
    reaper stops the job all the same and lets the run go."""
    at_limit(monkeypatch, "handover-stop")
    world = harness.new_world([watched_job(hours=8)])
    world.clock = simulated_clock
    first_arn = EXECUTION + "handover-stop"
    harness.on_wait = lambda arn, state, seconds: harness.stop(arn) if arn != first_arn else None
    first, second = chain(harness, harness.start(job_request(), name="handover-stop"))

    (job,) = world.create_calls
    assert first.reaped["stopped"] == [] and second.status == "ABORTED"
    assert second.reaped["stopped"] == [job["TrainingJobName"]]
    assert "InProgress" not in world.statuses().values()
    record = registry(harness).read(job["Environment"][ENV_RUN_ID])
    assert (record.owner, record.status, record.outcome) == (successor_of(first), ENDED, "aborted")


def test_a_successor_that_never_takes_the_run_over_leaves_no_job_running(harness, simulated_clock, monkeypatch):
    """The successor's Prepare keeps timing out (past the state machine's retries), from after its predecessor's end
    was delivered, and it fails without taking the run over. The predecessor's reaper left the job to the successor
    (it still ran then); the successor's reaper, finding the run named in its input, stops the job on the
    predecessor's behalf."""
    at_limit(monkeypatch, "handover-lost")
    world = harness.new_world([watched_job(hours=8)])
    world.clock = simulated_clock
    first_arn, delivered = EXECUTION + "handover-lost", set()
    prepare = handler.prepare

    def prepare_timing_out(event, context=None):
        if (event.get("execution") or {}).get("id") == first_arn:
            return prepare(event, context)
        wait_until(lambda: first_arn in delivered, "the first execution's end delivered")
        raise FunctionTimedOut()

    monkeypatch.setattr("jobs.handler.prepare", prepare_timing_out)
    first, second = chain(harness, harness.start(job_request(), name="handover-lost"), delivered=delivered)

    (job,) = world.create_calls
    # Prepare's own fault is caught, told in words and notified (launcher_error), then the reaper does its part.
    assert second.status == "FAILED" and second.error == "launcher_error", (second.status, second.error)
    assert second.cause.startswith("the prepare step failed") and "Sandbox.Timedout" in second.cause
    assert (first.reaped["stopped"], second.reaped["stopped"]) == ([], [job["TrainingJobName"]])
    assert world.statuses()[job["TrainingJobName"]] != "InProgress"
    record = registry(harness).read(job["Environment"][ENV_RUN_ID])
    assert (record.owner, record.status) == (first_arn, ENDED)


def test_an_execution_started_under_the_successors_name_with_other_input_takes_nothing(harness, simulated_clock,
                                                                                     monkeypatch):
    """Between the registry naming the successor and StartSuccessor, an execution is started under that name (the
    name is in the history) with another request for the run: its Prepare refuses to take the run over (the input
    is not the one named), StartSuccessor then meets the name taken, and the run goes on watching here until its
    next decision hands it over for real."""
    at_limit(monkeypatch, "handover-squatted")
    world = harness.new_world([watched_job(hours=1)])
    world.clock = simulated_clock
    hand_over, squatters = Registry.hand_over, []

    def hand_over_then_squat(self, run_id: str, execution: str, **named) -> None:
        hand_over(self, run_id, execution, **named)
        if not squatters:
            squatter = named["successor"].rsplit(":", 1)[-1]
            squatters.append((squatter, harness.wait(harness.start(
                job_request(resume_run=run_id, max_runtime_hours=1), name=squatter))))

    monkeypatch.setattr(Registry, "hand_over", hand_over_then_squat)
    first, second = chain(harness, harness.start(job_request(), name="handover-squatted"))

    ((name, squatter),) = squatters
    assert squatter.status == "FAILED" and squatter.error == "RequestInvalid", (squatter.status, squatter.cause)
    assert "with another input than the one it was started with" in squatter.cause, squatter.cause
    assert squatter.reaped["stopped"] == [] and squatter.create_calls == world.create_calls
    # The start under the taken name failed (past its retries): the run went on here, then on in a new name.
    entered = first.states_entered
    assert entered.count("StartSuccessor") == 2 and "GoOnHere" in entered
    assert successor_of(first) != EXECUTION + name
    assert second.status == "SUCCEEDED" and len(world.create_calls) == 1 and world.overlaps == []
    record = registry(harness).read(world.create_calls[0]["Environment"][ENV_RUN_ID])
    assert (record.owner, record.status, record.successor) == (successor_of(first), ENDED, "")

