"""The retry policy: given the run so far and a classified failure, retry (after how long, on what) or stop.

- capacity shortage: wait (doubling from retry.capacity_wait_seconds up to capacity_wait_max_seconds), then
  the next instance type in [instance.type, *instance.fallbacks], cycling (the same type when there are none);
- Spot interruption or MaxWaitTimeExceeded: new attempt after retry.interruption_wait_seconds; once
  retry.interruptions_before_on_demand interruptions have happened, the next attempts run on demand;
- a stop nobody the launcher knows of asked for (SageMaker, a training plan's end, the console): resumed the same
  way (a stop by `trainctl stop` or an abort ends the execution first); a plan an attempt was stopped on is not
  targeted again (the next attempt runs on demand on its type);
- hardware or network fault (unhealthy instance, ECC, NCCL/EFA): at most retry.hardware_max_retries new attempts,
  each with infra_check on, on the next instance type where there are fallbacks;
- a rule whose action is FAIL (an impossible quota, the training package's own verdict): no retry, and the
  reason says what to change;
- SageMaker internal error: retry after retry.internal_error_wait_seconds, at most internal_error_max_retries;
- quota (ResourceLimitExceeded) and throttling: wait (doubling from api_error_wait_seconds up to
  api_error_wait_max_seconds) and retry, at most api_error_max_retries in a row;
- the user's code or data, max_runtime reached, anything unrecognised: no retry;
- attempts (retry.max_attempts) or total time (retry.max_total_hours) exhausted: no retry.
Every retry is a new job with a new name that resumes from the run's checkpoint prefix. A run that ended
without completing can be continued by a new execution (`trainctl resume RUN`, request field `resume_run`):
the reasons say so.

Before any of that, a launch error whose job still runs (CreateTrainingJob answered 5xx after creating it, a
throttled poll, the attempt's own name in use) is no failure: `watch_again` waits on that job (never a second job
on the same checkpoints), looking again after a wait, and the attempt is decided once its job ends.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass

from jobs.request.schema import JobRequest
from jobs.retry.classify import Category, Failure, Response
from jobs.retry.resume import resume_command
from jobs.retry.run_state import RunState
from jobs.timestamps import duration, times, to_epoch

# The state machine's own retries (platform_constructs.launcher_definition writes them into its Retry fields;
# jobs.reference describes them). A launcher function's fault (an error it raises, a timeout) is run again
# FUNCTION_RETRIES times, FUNCTION_RETRY_SECONDS apart, doubling.
FUNCTION_RETRIES = 3
FUNCTION_RETRY_SECONDS = 1
# Summarize could not stop a job of the run for a reason that passes (StopTrainingJob throttled, a service fault):
# it is run again until the stop is taken, STOP_RETRY_SECONDS apart doubling up to STOP_RETRY_MAX_SECONDS, then
# its Catch stops the current job once more and notifies.
STOP_RETRIES = 12
STOP_RETRY_SECONDS = 10
STOP_RETRY_MAX_SECONDS = 300


def retry_waits(retries: int, first: float, most: float | None = None) -> list[float]:
    """The waits of a Retry of `retries` attempts starting at `first` seconds, doubling, capped at `most`."""
    return [min(first * 2 ** i, most or float("inf")) for i in range(retries)]


class Action(enum.StrEnum):
    RETRY = "retry"
    FAIL = "fail"
    WATCH = "watch"  # the attempt's job still runs: wait, then look it up again
    SUCCEED = "succeed"  # a job waited on that way completed
    # The execution's history nears its limit: the run goes on in a new execution (decision["then"]: what it does
    # first, "watch" or "retry"), which takes the run over with its job (jobs.registry.Registry.hand_over).
    CONTINUE = "continue"


# Longest wait between two looks at a job that no `.sync` task waits on. Each look adds about 9 events to
# the execution's history; 20 minutes keeps a 28-day job (SageMaker's longest) under the 25,000 allowed.
WATCH_MAX_SECONDS = 1200
# Shortest: the request's retry.api_error_wait_seconds may be 0 (the schema allows it, for quick retries of a
# throttled create), which would look again at once, 9 events a look, until the history's limit ended the execution
# with no summary. The waits start here and double (tests/launcher/test_history_bound.py counts the events).
WATCH_MIN_SECONDS = 30
# Events one Standard workflow execution may have (Step Functions' quotas); past it the execution fails with an error
# no Catch takes.
HISTORY_LIMIT = 25_000
# A run whose execution has this many events when it decides to watch or retry goes on in a new execution. What may
# follow the decision here: the hand-over (about 10 events), or, when the new execution cannot be started, the loop
# going on here, 9 events a look (about 100 looks more, each tried again to hand over).
CONTINUE_AT_EVENTS = HISTORY_LIMIT - 1_000
# How many look-ups must miss a job whose create answered a server error before its attempt counts as never created:
# SageMaker's reads may lag its writes, and such a job can show up after the first look.
SETTLE_LOOKS = 3


# The categories the policy never retries, and what the run's reason adds for each.
# `{resume}` is the command that continues the run on its checkpoints (jobs.retry.resume.resume_command).
_NO_RETRY_HINT = {
    Category.USER_ERROR: "fix the code or data, then `{resume}` with the fixed request to continue from the "
                         "checkpoints, or submit it as a new run",
    Category.MAX_RUNTIME: "checkpoints are kept: `{resume}` continues the run (raise max_runtime_hours in the "
                          "request to give each attempt longer)",
    Category.SUPERSEDED: "another execution holds the run now; `trainctl runs` shows which, and `{resume}` "
                         "continues it once that one has ended",
    Category.PLATFORM_CONFIG: "not the request's to fix: the platform team must give the launcher what it lacks "
                              "(redeploy the platform, or fix the role named above), then `{resume}` continues the "
                              "run from its checkpoints",
    Category.UNKNOWN: "not retried, to be safe; see the job's logs; `{resume}` continues it from its checkpoints",
}
NO_RETRY = tuple(_NO_RETRY_HINT)


@dataclass(frozen=True)
class Decision:
    action: Action
    wait_seconds: int
    category: Category | None  # None: no failure (a job waited on completed)
    reason: str
    instance_type: str | None = None  # of the next attempt
    spot: bool | None = None
    infra_check: bool | None = None  # of the next attempt (None: as the last one)

    def to_event(self) -> dict:
        """What the state machine reads: its Choice state matches `action` ("retry" or "fail"); a retry carries what
        the next attempt runs on (`next`), which NextAttempt renders after the wait (jobs.handler.relaunch)."""
        event = {"action": self.action.value, "wait_seconds": self.wait_seconds,
                 "category": self.category.value if self.category else "", "reason": self.reason}
        if self.action is Action.RETRY:
            event["next"] = {"instance_type": self.instance_type, "spot": self.spot, "infra_check": self.infra_check}
        return event


def backoff(base: int, cap: int, n: int) -> int:
    """base, 2 x base, 4 x base ... for the n-th occurrence (n >= 1), capped."""
    return int(min(cap, base * 2 ** max(n - 1, 0)))


def decide_next(request: JobRequest, run: RunState, failure: Failure, now: float) -> Decision:
    """`run` is the run state after the failed attempt was recorded (counts already include it)."""
    retry = request.retry
    counts = run.counts
    attempt = run.attempts_used
    resume = resume_command(run.run_id)
    fail = lambda reason: Decision(Action.FAIL, 0, failure.category, reason)  # noqa: E731

    if failure.action is Response.FAIL:
        return fail(failure.reason)
    if failure.category in NO_RETRY:
        return fail(f"{failure.reason} ({_NO_RETRY_HINT[failure.category].format(resume=resume)})")
    spent = lambda what: fail(budget_spent(what, run, failure.reason, resume))  # noqa: E731
    if attempt >= retry.max_attempts:
        return spent(f"attempts exhausted ({attempt} of {retry.max_attempts})")

    instance_type, spot, infra_check = run.instance_type, run.spot, None
    if failure.category == Category.HARDWARE:
        # Counted from the attempts, so the run state's shape (and its counts) stays as the state machine knows it.
        faults = sum(a.category == Category.HARDWARE.value for a in run.attempts)
        if faults > retry.hardware_max_retries:
            return spent(f"hardware faults persisted ({times(faults)}; retry.hardware_max_retries "
                         f"{retry.hardware_max_retries})")
        wait, infra_check = 0, True
        instance_type = _next_type(request, instance_type)
        what = f"then {instance_type} with infra_check on"
    elif failure.category == Category.CAPACITY:
        wait = backoff(retry.capacity_wait_seconds, retry.capacity_wait_max_seconds, counts.capacity)
        instance_type = _next_type(request, instance_type)
        what = f"then {instance_type}" if len(request.instance_types) > 1 else f"then {instance_type} again"
    elif failure.category in (Category.SPOT_INTERRUPTION, Category.INTERRUPTION):
        wait = retry.interruption_wait_seconds
        limit = retry.interruptions_before_on_demand
        if failure.category is Category.SPOT_INTERRUPTION and spot and limit is not None \
                and counts.spot_interruption >= limit:
            spot = False
            what = f"then on demand after {counts.spot_interruption} interruptions"
        else:
            what = "then resume" + (" on Spot" if spot else "")
    elif failure.category == Category.INTERNAL:
        if counts.internal > retry.internal_error_max_retries:
            return spent(f"SageMaker internal errors persisted ({times(counts.internal)}; "
                         f"retry.internal_error_max_retries {retry.internal_error_max_retries})")
        wait = retry.internal_error_wait_seconds
        what = "then retry"
    else:  # quota, throttling
        streak = counts.api_error_streak
        if streak > retry.api_error_max_retries:
            return spent(f"{failure.category} persisted ({times(streak)} in a row; retry.api_error_max_retries "
                         f"{retry.api_error_max_retries})")
        wait = backoff(retry.api_error_wait_seconds, retry.api_error_wait_max_seconds, streak)
        what = "then retry"

    deadline = run.started_epoch + request.effective_max_total_hours * 3600
    if now + wait >= deadline:
        return spent(f"time budget exhausted (retry.max_total_hours {request.effective_max_total_hours:g} h)")
    reason = f"{failure.reason}; waiting {wait} s, {what} (attempt {attempt + 1} of {retry.max_attempts})"
    return Decision(Action.RETRY, wait, failure.category, reason, instance_type, spot, infra_check)


def budget_spent(what: str, run: RunState, last_failure: str, resume: str) -> str:
    """The one wording of every retry budget's end: what ran out, what was tried (attempts, instance types, the
    waits), the last failure and the way back."""
    types = list(dict.fromkeys(a.instance_type for a in run.attempts if a.instance_type)) or [run.instance_type]
    waited = f", {duration(run.waited_seconds)} waiting between them" if run.waited_seconds else ""
    tried = f"{len(run.attempts)} attempt{'s' if len(run.attempts) != 1 else ''} on {', '.join(types)}{waited}"
    return (f"{what}: {tried}; last failure: {last_failure}; `{resume}` continues the run from its checkpoints "
            "with a new retry budget")


# What each launcher function was doing when it failed, for the words of its fault (launcher_fault).
FUNCTION_DOING = {
    "decide": "deciding what follows attempt {attempt} (job {job})",
    "relaunch": "starting the attempt after attempt {attempt} (job {job})",
}


def launcher_fault(step: str, error: str, cause: str, run: RunState) -> str:
    """A launcher function that kept failing, in words: which step, what it was doing, the tries made, the error
    (a Lambda error's type and message, never its JSON), and the way back."""
    doing = FUNCTION_DOING.get(step, "its work").format(attempt=run.attempt, job=run.job_name or "none yet")
    return (f"the {step} step failed {times(FUNCTION_RETRIES + 1)} while {doing}: {function_error(error, cause)}; "
            f"`{resume_command(run.run_id)}` continues the run from its checkpoints")


def function_error(error: str, cause: str, limit: int = 300) -> str:
    """A Lambda function's error as a person reads it: `errorType: errorMessage` out of its JSON cause (an error the
    function raised), else the cause itself (a timeout's "Task timed out after 60.00 seconds")."""
    try:
        parsed = json.loads(cause)
    except (TypeError, ValueError):
        parsed = None
    if isinstance(parsed, dict) and parsed.get("errorMessage"):
        text = f"{parsed.get('errorType') or error}: {parsed['errorMessage']}"
    else:
        text = f"{error}: {cause}" if cause else error
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _next_type(request: JobRequest, instance_type: str) -> str:
    """The next of [instance.type, *fallbacks] after `instance_type`, cycling; the same when there are none."""
    types = list(request.instance_types) or [instance_type]
    return types[(types.index(instance_type) + 1) % len(types)] if instance_type in types else types[0]


# How long past its own stopping condition a job may go unread before the run stops waiting on it: SageMaker
# stops a job at MaxRuntimeInSeconds (MaxWaitTimeInSeconds on Spot) and then uploads its model and output.
WATCH_MARGIN_SECONDS = 3600


def watch_again(request: JobRequest, run: RunState, failure: Failure, lookup_error: str = "", *, now: float,
          job_limit_seconds: int) -> Decision:
    """The launch failed but the attempt's job may still run: wait on it rather than start another.

    `run.current` has been looked up (jobs.retry.run_state.note_lookup): either its job runs, or the look-up itself
    failed (`lookup_error`, e.g. throttled) and nobody knows. Unknown is treated as running, looking again
    with backoff, for as long as the job itself can run: `job_limit_seconds` (its stopping condition) plus
    WATCH_MARGIN_SECONDS from the attempt's start. Only past that does the run give up (Summarize then looks
    once more and stops the job if it still runs); a throttled API never stops a healthy job.
    """
    current = run.current
    if lookup_error:
        n = current.lookup_errors
        started = to_epoch(current.started_at) or now
        if now - started > job_limit_seconds + WATCH_MARGIN_SECONDS:
            return Decision(Action.FAIL, 0, failure.category,
                            f"could not look up {current.job_name} for longer than it can run ({n} times in a row, "
                            f"last: {lookup_error}), so no new attempt was started while it might run; launch "
                            f"error: {failure.reason}; `{resume_command(run.run_id)}` continues the run")
        # WATCH_MAX_SECONDS, not api_error_wait_max_seconds, caps the wait: looking for 28 days must stay within
        # the execution's history.
        wait = watch_wait(request, n)
        what = f"could not look up {current.job_name} ({lookup_error}, {n} times in a row)"
    else:
        wait = watch_wait(request, current.looks)
        what = f"{current.job_name} still runs ({current.status}/{current.secondary_status}): waiting on it"
    return Decision(Action.WATCH, wait, failure.category,
                    f"launch error ({failure.reason}), but {what}; looking again in {wait} s")


# How a failure names a training plan when it does not name the run's own: SageMaker's words for the plan.
_A_PLAN = re.compile(r"training[ -]?plan", re.IGNORECASE)


def plan_ended(failure: Failure, name: str, arn: str) -> Failure | None:
    """The attempt ran on training plan `name` (`arn`) and its failure says the plan can no longer run it: a stop
    nobody asked for (a plan's end stops its jobs), a job that failed for capacity naming the plan, or a create the
    plan refused (its ARN is rejected once it expired). The failure to decide on then (capacity, so that the next
    attempt runs without the plan), or None when the plan is not in question."""
    if failure.category is Category.INTERRUPTION:
        return failure
    if failure.category not in (Category.CAPACITY, Category.USER_ERROR):
        return None
    if not (name in failure.reason or arn in failure.reason or _A_PLAN.search(failure.reason)):
        return None
    return Failure(Category.CAPACITY, f"training plan {name} can no longer run the job ({failure.reason}); the next "
                   "attempt runs without it", job_started=failure.job_started)


def watch_wait(request: JobRequest, n: int) -> int:
    """The wait before the n-th look at a job: the request's api_error_wait_seconds, never under WATCH_MIN_SECONDS,
    doubling up to WATCH_MAX_SECONDS."""
    return backoff(max(request.retry.api_error_wait_seconds, WATCH_MIN_SECONDS), WATCH_MAX_SECONDS, n)


def settle_unseen(request: JobRequest, run: RunState, failure: Failure) -> Decision | None:
    """The create answered a server error and the look-up found no job: SageMaker may have created it all the same
    and not show it yet. Look again (SETTLE_LOOKS look-ups in all, the waits of a watch) before the attempt counts as
    never created; None once they have all missed it."""
    current = run.current
    if current.looks >= SETTLE_LOOKS:
        return None
    wait = watch_wait(request, current.looks)
    return Decision(Action.WATCH, wait, failure.category,
                    f"launch error ({failure.reason}); {current.job_name} is not found yet, but a create that answered "
                    f"a server error may have made it (look-up {current.looks} of {SETTLE_LOOKS}); looking again in "
                    f"{wait} s before starting another")


def succeeded(run: RunState) -> Decision:
    return Decision(Action.SUCCEED, 0, None, f"{run.current.job_name} completed")
