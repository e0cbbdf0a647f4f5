"""The Lambda handlers the launcher's state machine calls: prepare, decide, relaunch, summarize; and the reaper.

Each takes the state object and returns the next one; the platform's settings arrive as JSON in the
environment variable PLATFORM_SETTINGS. Standard library plus boto3 (the Python runtime's own, imported
only where the handlers call SageMaker), so the function's code is just the `jobs/` folder.

    prepare   {"state_shape", "request", "execution": {"name", "start_time"}} -> {"run", "launch": {"create"}}
              (a request with `resume_run` lists and describes the run's earlier jobs first: jobs.retry.resume)
    decide    {"request", "run", "failure": {"Error", "Cause"?}} -> {"run", "decision", "launch"?, "handoff"?}
              (watch: "launch": the failure again, to look again; succeed: "launch": {"job"}; retry: the decision
               alone, its `next` saying what the next attempt runs on; continue: "handoff")
    relaunch  {"request", "run", "decision"} -> {"run", "launch": {"create"}} (after the wait; or a superseded
              "decision")
    summarize {"run", "launch"?: {"job"}, "decision"?}          -> {"succeeded", "subject", "message", "summary"}

The request is the execution's input: Prepare and Decide get it from the state machine, it is not in the
state (jobs.request.state_size). An execution keeps the definition it started with; since the functions are versioned
(platform_constructs.launcher_functions) it also keeps their code, but executions started before that call the
functions unqualified, hence their newest code: the handlers also answer that definition (STATE_SHAPE 1:
run.request, "create", "job", "failure").
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from types import SimpleNamespace
from typing import Any

from contract.container import ENV_RUN_ID
from contract.errors import Problem, RequestInvalid
from jobs.naming import (
    EXECUTION_NAME_MAX,
    job_name,
    job_name_head,
    new_name_nonce,
    new_run_id,
    random_token,
    run_token,
)
from jobs.outcome.run_record import cluster_types, measured_save_seconds
from jobs.outcome.summary import describe_in_words, summary
from jobs.platform import PlatformSettings
from jobs.prices import API_REGION, SERVICE_CODE, instance_filters, products_to_prices
from jobs.registry import HandOverRefused, LeaseLost, Registry, RunHeld, request_digest, table_name
from jobs.render.training_job import checkpoint_s3_uri, render_create_training_job
from jobs.request.parse import parse_request
from jobs.request.platform_rules import validate_for_platform
from jobs.request.state_size import state_size_problem
from jobs.retry import policy
from jobs.retry import run_state as runs
from jobs.retry.classify import Category, Failure, classify_launch, ended_job_in, may_have_created
from jobs.retry.policy import (
    Action,
    Decision,
    decide_next,
    launcher_fault,
    plan_ended,
    settle_unseen,
    succeeded,
    watch_again,
)
from jobs.retry.resume import attempt_number, check_init_run, resume_command, resume_point
from jobs.retry.run_state import RunState, job_figures

log = logging.getLogger(__name__)
log.setLevel(logging.INFO)

# Tests replace the clock; the handlers never sleep (the state machine's Wait state does).
clock = time.time

# The state's shape the state machine's definition moves (its Prepare sends it as `state_shape`): 2, the request
# read from the execution's input and the attempt under `launch`; 1 (or none), the definition before, which
# carried the request in the run state and the attempt under `create`, `job` and `failure`. Remove 1 with
# jobs.retry.run_state._LEGACY_RUN_ID.
STATE_SHAPE = 2


def platform_settings() -> PlatformSettings:
    text = os.environ.get("PLATFORM_SETTINGS")
    if not text:
        raise RuntimeError("PLATFORM_SETTINGS is not set: the launcher stack passes the platform's settings "
                           "to this function as JSON")
    return PlatformSettings.from_json(text)


def prepare(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Validate and render the run's first attempt (for a resumed run, the one after its last). A bad request,
    or a run that cannot be resumed, raises RequestInvalid: nothing is launched."""
    document = event.get("request") if isinstance(event, dict) else None
    if document is None:
        raise RequestInvalid([Problem("request", "the execution input needs a `request` object (the job request)")])
    platform = platform_settings()
    request = parse_request(document)
    execution = event.get("execution") or {}
    if request.resume_run and execution.get("id") and event.get("state_shape", 1) >= STATE_SHAPE:
        # Before the platform's rules: a run handed over goes on with its job as it runs, whatever a deploy changed.
        registry = run_registry(platform)
        if (record := registry.read(request.resume_run)) is not None and record.successor == execution["id"]:
            return take_over(registry, record, document, execution)
    validate_for_platform(request, platform)
    now = clock()
    # Random, not derived from the execution: the execution's name is the caller's to choose (and its ARN is
    # the state machine's plus that name), so anything derived from them can be matched on purpose. Random is
    # safe here because Prepare has no side effect: a retried Prepare's first result never reaches the state
    # machine, so its id names no job and nothing is orphaned. From here on the id travels in the run state.
    # A resumed run keeps its id, hence its checkpoint prefix; its attempts number on from its last one.
    run_id = request.resume_run or new_run_id(request.name)
    run = runs.new_run(request, run_id=run_id, execution=execution, now=now)
    measured = _continue_run(run, request, platform) if request.resume_run else None
    if request.init_from_run:
        source = runs.new_run(request, run_id=request.init_from_run, execution={}, now=now)
        source.checkpoint_s3_uri = checkpoint_s3_uri(platform, request.init_from_run)
        check_init_run(request, jobs_of_run(source, platform))
    attempt = run.resumed_after + 1
    registry = run_registry(platform) if run.execution.arn else None
    if registry is not None:
        take_run(registry, run, request, document, now)
    try:
        nonce, epoch = launch_epoch(registry, run, platform, attempt, now)
        create = render_create_training_job(request, platform, run_id=run_id, attempt=attempt,
                                            measured_stall_s=measured, name_nonce=nonce, epoch=epoch,
                                            prices=attempt_prices(request, platform))
        runs.start_attempt(run, create, attempt=attempt, now=now)
        if problem := state_size_problem(document, run.to_dict(), create, request.retry.max_attempts):
            raise RequestInvalid([problem])
    except RequestInvalid:
        if registry is not None:  # refused after taking the run: nothing was launched, let it go
            registry.release(run_id, run.execution.arn, outcome="refused", now=runs.iso(now))
        raise
    log.info("run %s: attempt %s is %s on %s", run_id, attempt, create["TrainingJobName"], run.instance_type)
    if event.get("state_shape", 1) < STATE_SHAPE:
        return {"run": {**run.to_dict(), "request": request.to_dict()}, "create": create}
    return {"run": run.to_dict(), "launch": {"create": create}}


def take_over(registry: Registry, record, document: dict[str, Any], execution: dict[str, Any]) -> dict[str, Any]:
    """This execution is the one the run's owner named to go on in (continue_near_limit): take the run over and go on
    from the state it left (its job still running, or its next attempt due), as this execution."""
    try:
        state = registry.take_over(record, execution["id"], digest=request_digest(document), now=runs.iso(clock()))
    except (RunHeld, HandOverRefused) as refused:
        raise RequestInvalid([Problem("resume_run", f"{refused}; {resume_command(record.run_id)} once it has ended")]
                             ) from None
    run = RunState.from_dict(state["run"])
    run.execution = runs.Execution(name=execution.get("name", ""), arn=execution["id"],
                                   start_time=execution.get("start_time") or runs.iso(clock()))
    log.info("run %s: taken over from %s, going on with %s", run.run_id, record.owner, state["decision"]["action"])
    return {**state, "run": run.to_dict()}


def _continue_run(run: RunState, request, platform: PlatformSettings) -> float | None:
    """A resumed run: its checkpoint prefix and the attempt it ended on (RequestInvalid when it cannot be
    continued); returns the save stall its earlier jobs measured, for the next attempt's cadence."""
    run.checkpoint_s3_uri = checkpoint_s3_uri(platform, run.run_id)
    earlier = jobs_of_run(run, platform)
    run.resumed_after = resume_point(request, earlier, run.checkpoint_s3_uri)
    return measured_save_seconds(SimpleNamespace(**job_figures(j)) for j in sorted(earlier, key=attempt_number))


def run_registry(platform: PlatformSettings) -> Registry:
    """The launcher's run registry (jobs.registry), through the runtime's boto3."""
    import boto3
    from botocore.config import Config

    client = boto3.client("dynamodb", region_name=os.environ.get("AWS_REGION") or platform.region,
                          config=Config(retries={"mode": "standard", "total_max_attempts": 4}))
    return Registry(client, table_name(platform.name_prefix))


def take_run(registry: Registry, run: RunState, request, document: dict[str, Any], now: float) -> None:
    """Take the run's lease for this execution, or refuse the request naming the execution that holds it."""
    try:
        registry.acquire(run.run_id, run.execution.arn, name=request.name, digest=request_digest(document),
                         now=runs.iso(now), has_ended=execution_has_ended)
    except RunHeld as held:
        field = "resume_run" if request.resume_run else "name"
        raise RequestInvalid([Problem(field, (
            f"run {run.run_id} is held by execution {held.holder}, which is still running (its job may be between "
            f"two attempts); one execution drives a run at a time, so that one job writes its checkpoints: wait "
            f"for it to end, or `trainctl stop` it, then {resume_command(run.run_id)}"))]) from None


def launch_epoch(registry: Registry | None, run: RunState, platform: PlatformSettings, attempt: int,
                 now: float) -> tuple[str, int | None]:
    """The attempt's job name nonce and its epoch, issued by the registry as it records the job's name (None
    without a registry: an execution on a definition before it, whose epoch is the attempt number). LeaseLost
    when another execution holds the run."""
    nonce = new_name_nonce()
    if registry is None:
        return nonce, None
    name = job_name(platform.name_prefix, run.run_id, attempt, nonce)
    return nonce, registry.launch(run.run_id, run.execution.arn, attempt=attempt, job_name=name, now=runs.iso(now))


def execution_has_ended(arn: str) -> bool:
    """Whether a Step Functions execution is over (a run's holder that never let go may then be taken over)."""
    import boto3
    from botocore.exceptions import ClientError

    try:
        status = boto3.client("stepfunctions", region_name=os.environ.get("AWS_REGION")).describe_execution(
            executionArn=arn)["status"]
    except ClientError as exc:
        if exc.response["Error"].get("Code") == "ExecutionDoesNotExist":
            return True
        raise
    return status != "RUNNING"


def jobs_of_run(run: RunState, platform: PlatformSettings) -> list[dict[str, Any]]:
    """DescribeTrainingJob of every job of the run's earlier executions (_listed_jobs). A failed call raises: Prepare
    fails and nothing is launched."""
    # Prepare has no Wait state to retry a throttled call from.
    return _listed_jobs(_sagemaker(platform.region, attempts=4), run, platform)


def _listed_jobs(client, run: RunState, platform: PlatformSettings, *, status: str | None = None,
                 skip: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """DescribeTrainingJob of the run's jobs (`status` ones only, when given; none named in `skip`): those whose names
    carry the run id's random part (ListTrainingJobs NameContains, every page), start with this launcher's prefix,
    and are the run's own (jobs.retry.run_state.is_ours: a name proves nothing).

    The listing is the account's: another team's jobs of a run with that id are listed too, and this launcher may not
    describe them (AccessDenied, which Prepare would retry as a fault). They are not this team's run: left out, a
    resume of another team's run is refused as "not found here", naming the field."""
    found = []
    filters = {"StatusEquals": status} if status else {}
    own = job_name_head(platform.name_prefix)
    for page in client.get_paginator("list_training_jobs").paginate(NameContains=run_token(run.run_id), **filters):
        for listed in (j for j in page["TrainingJobSummaries"]
                       if j["TrainingJobName"] not in skip and j["TrainingJobName"].startswith(own)):
            job = runs.jsonable(client.describe_training_job(TrainingJobName=listed["TrainingJobName"]))
            if runs.is_ours(run, job, platform.execution_role_arn):
                found.append(job)
    return found


def decide(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """Decide what follows a failed Launch: wait on the attempt's job if it still runs, else classify the failed
    attempt and either render the next attempt or give up."""
    if "create" in event:
        return _legacy_decide(event)
    run = RunState.from_dict(event["run"])
    return continue_near_limit(event["request"], run, _decide(parse_request(event["request"]), run,
                                                              event.get("failure") or {}))


# What a successor's input changes in the run's first one: it resumes the run (and does not start one from another's
# weights: that was the first attempt's start). Merged by the state machine (States.JsonMerge, shallow).
def successor_changes(run_id: str) -> dict[str, Any]:
    return {"resume_run": run_id, "init_from_run": None}


def continue_near_limit(document: dict[str, Any], run: RunState, out: dict[str, Any]) -> dict[str, Any]:
    """`out` (Decide's answer for `run`, as it left it), or, when it watches or retries and the execution's history
    nears Step Functions' limit, the same as a hand-over: the registry names a new execution of the run and keeps the
    state it goes on from, and the state machine starts it (`handoff`: its name and what its input changes) and ends
    this one. Going on here (the answer as it was) when the registry refuses: the next launch learns why."""
    decision = out["decision"]
    if decision["action"] not in (Action.WATCH, Action.RETRY) or not run.execution.arn:
        return out
    events = history_length(run.execution.arn)
    if events is None or events < policy.CONTINUE_AT_EVENTS:
        return out
    name = successor_name(run.run_id)
    successor = f"{run.execution.arn.rsplit(':', 1)[0]}:{name}"
    changes = successor_changes(run.run_id)
    try:
        run_registry(platform_settings()).hand_over(
            run.run_id, run.execution.arn, successor=successor, digest=request_digest({**document, **changes}),
            state=out, now=runs.iso(clock()))
    except LeaseLost as lost:
        log.warning("run %s: no hand-over (%s)", run.run_id, lost)
        return out
    log.info("run %s: %s events in this execution's history; it goes on in %s", run.run_id, events, name)
    return {**out, "decision": {**decision, "action": Action.CONTINUE.value, "then": decision["action"]},
            "handoff": {"name": name, "changes": changes}}


def successor_name(run_id: str) -> str:
    """A new execution's name for the run: its id and fresh random characters (jobs.naming.EXECUTION_NAME_MAX at most)."""
    tail = f"-c{random_token(5)}"
    return run_id[:EXECUTION_NAME_MAX - len(tail)] + tail


def history_length(arn: str) -> int | None:
    """How many events the execution's history holds (its newest event's id); None when it cannot be read (the run
    goes on here, and the next decision asks again)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        page = boto3.client("stepfunctions", region_name=os.environ.get("AWS_REGION")).get_execution_history(
            executionArn=arn, reverseOrder=True, maxResults=1, includeExecutionData=False)
    except (BotoCoreError, ClientError) as exc:
        log.warning("the history of %s could not be read: %s", arn, exc)
        return None
    return max((event["id"] for event in page["events"]), default=0)


def _legacy_decide(event: dict[str, Any]) -> dict[str, Any]:
    """Decide for an execution on the definition of STATE_SHAPE 1: it sends {"run" (with "request"), "create",
    "failure"} and reads back {"run", "create", "decision", "failure"?, "job"?}, and its SummarizeFailed state
    reads $.run.request.name."""
    request_document, create = event["run"]["request"], event["create"]
    run = RunState.from_dict(event["run"])
    current = run.current
    for name, value in runs.launched_as(create).items():
        setattr(current, name, value)
    request = parse_request(request_document)
    out = _decide(request, run, event.get("failure") or {})
    if out["decision"]["action"] == Action.RETRY:  # its definition launches right after the wait: rendered here
        out["launch"] = {"create": next_attempt(request, run, out["decision"], platform_settings(),
                                                clock() + out["decision"]["wait_seconds"])}
        out["run"] = run.to_dict()
    launch = out.get("launch") or {}
    legacy = {"run": {**out["run"], "request": request_document}, "create": launch.get("create", create),
              "decision": out["decision"]}
    if "job" in launch:
        legacy["job"] = launch["job"]
    elif launch:
        legacy["failure"] = launch
    return legacy


def _decide(request, run: RunState, failure_event: dict[str, Any]) -> dict[str, Any]:
    """A launch error is not proof that no job runs: CreateTrainingJob can answer 5xx after creating the job, a
    throttled poll fails the `.sync` task while the job trains, and a resent create meets the attempt's own
    name in use (ResourceInUse). So unless the Cause is the description of an ended job, the job is looked up
    by its name first, and no new attempt starts while it runs (or while nobody can tell). The state machine
    leaves an ended job's description out of the Cause (it is as large as the request): it is looked up too.
    """
    platform = platform_settings()
    now = clock()
    current = run.current
    job = ended_job_in(failure_event)
    squatter = None  # a job under the attempt's name that is not the run's
    if job is None:
        job, error = look_up_training_job(current.job_name, platform.region)
        if job is not None and not runs.is_ours(run, job, platform.execution_role_arn):
            squatter, job = job, None
        runs.note_lookup(run, error)
        if job is not None:
            runs.observe(run, job)
        if error or job is not None and job.get("TrainingJobStatus") in runs.RUNNING:
            return _watch(request, run, failure_event, error)
        if job is not None and job.get("TrainingJobStatus") == "Completed":
            runs.finish_attempt(run, now=now, job=job)
            decision = succeeded(run)
            log.info("run %s attempt %s: %s", run.run_id, run.attempt, decision.reason)
            return {"run": run.to_dict(), "launch": {"job": job}, "decision": decision.to_event()}
        if job is None and squatter is None and may_have_created(failure_event) and (
                settle := settle_unseen(request, run, classify_launch(failure_event, None))):
            current.status = "Unknown"  # not seen, not ruled out: Summarize and the reaper look for it too
            run.waited_seconds += settle.wait_seconds
            log.info("run %s attempt %s: %s", run.run_id, run.attempt, settle.reason)
            return {"run": run.to_dict(), "launch": failure_event, "decision": settle.to_event()}
    failure = name_taken(run, squatter) if squatter is not None else classify_launch(failure_event, job)
    if current.training_plan and request.training_plan not in run.plans_ended and (
            ended := plan_ended(failure, request.training_plan, current.training_plan)):
        # Most likely the plan ended (SageMaker stops its jobs, fails them for capacity, then refuses its ARN): the
        # next attempts do not target it.
        run.plans_ended.append(request.training_plan)
        failure = ended
    runs.finish_attempt(run, now=now, job=job, failure=failure)
    decision = decide_next(request, run, failure, now)
    log.info("run %s attempt %s: %s -> %s", run.run_id, run.attempt, failure.category, decision.reason)
    if decision.action is Action.RETRY:
        run.waited_seconds += decision.wait_seconds
    return {"run": run.to_dict(), "decision": decision.to_event()}


def relaunch(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """NextAttempt, after the wait between two attempts: the next attempt's CreateTrainingJob, its job name minted and
    its epoch issued now, so that the name is public only as its job is created (Decide chose the instance type,
    Spot and the check before the wait). An execution that lost the run ends `superseded`, launching nothing."""
    run = RunState.from_dict(event["run"])
    decision = event["decision"]
    try:
        create = next_attempt(parse_request(event["request"]), run, decision, platform_settings(), clock())
    except LeaseLost as lost:
        fail = Decision(Action.FAIL, 0, Category.SUPERSEDED, f"{lost}: this execution launches nothing more "
                        f"({decision.get('reason', 'a retry')} was next)")
        return {"run": run.to_dict(), "decision": fail.to_event()}
    log.info("run %s: attempt %s is %s on %s", run.run_id, run.attempt, create["TrainingJobName"], run.instance_type)
    return {"run": run.to_dict(), "launch": {"create": create}}


def next_attempt(request, run: RunState, decision: dict[str, Any], platform: PlatformSettings,
                 now: float) -> dict[str, Any]:
    """The next attempt's CreateTrainingJob as `decision` (a retry's event: its `next`) chose it, recorded in the run
    state as started `now`; its epoch issued by the registry as it records the job's name. LeaseLost when another
    execution holds the run."""
    attempt = run.attempt + 1
    nonce, epoch = launch_epoch(run_registry(platform) if run.execution.arn else None, run, platform, attempt, now)
    chosen = decision.get("next") or {}
    infra_check = chosen.get("infra_check")
    create = render_create_training_job(request, platform, run_id=run.run_id, attempt=attempt,
                                        instance_type=chosen.get("instance_type"), spot=chosen.get("spot"),
                                        infra_check=run.current.infra_check if infra_check is None else infra_check,
                                        starts_at=now, measured_stall_s=measured_save_seconds(run.attempts),
                                        plans_ended=run.plans_ended, name_nonce=nonce, epoch=epoch,
                                        prices=attempt_prices(request, platform, chosen.get("instance_type")))
    runs.start_attempt(run, create, attempt=attempt, now=now)
    return create


def name_taken(run: RunState, squatter: dict[str, Any]) -> Failure:
    """The attempt's name is held by a job that is not the run's: no job of ours was created, and a new attempt
    under a new (unguessable) name can succeed. Counted as a service-side fault (retried after
    retry.internal_error_wait_seconds, at most internal_error_max_retries times): unlike the user's error it
    says nothing about the request, and the bound stops a run from chasing a squatter that reads its state."""
    name = squatter.get("TrainingJobName", run.current.job_name)
    return Failure(Category.INTERNAL, f"the name {name} is taken by a job this run did not create (its "
                   f"{ENV_RUN_ID} is not {run.run_id}); it was left alone", job_started=False)


def _watch(request, run: RunState, failure_event: dict[str, Any], error: str) -> dict[str, Any]:
    """The attempt's job runs (or cannot be looked up): wait and look again; the failure travels along."""
    failure = classify_launch(failure_event, None)
    decision = watch_again(request, run, failure, error, now=clock(), job_limit_seconds=run.current.limit_seconds)
    log.info("run %s attempt %s: %s", run.run_id, run.attempt, decision.reason)
    if decision.action is Action.FAIL:
        current = run.current
        current.category, current.reason = failure.category.value, decision.reason
        if error:
            current.status = "Unknown"  # Summarize looks once more, and stops it if it runs
        run.counts.record(failure.category)
        return {"run": run.to_dict(), "decision": decision.to_event()}
    run.waited_seconds += decision.wait_seconds
    return {"run": run.to_dict(), "launch": failure_event, "decision": decision.to_event()}


def summarize(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """The execution's output and the notification's text. A job of the run that still runs is stopped first:
    a run that ends (whatever the reason) leaves nothing training on its checkpoints."""
    run = RunState.from_dict(event["run"])
    job = (event.get("launch") or {}).get("job") or event.get("job")  # "job": the definition before
    # A retried run still carries the earlier "retry" decision when its last attempt succeeds: only a
    # "fail" decision means the run failed.
    decision = event.get("decision")
    if not (isinstance(decision, dict) and decision.get("action") == Action.FAIL):
        decision = None
    elif isinstance(decision.get("fault"), dict):  # a launcher function that kept failing: its words, not its JSON
        fault = decision.pop("fault")
        decision["reason"] = launcher_fault(str(fault.get("function", "")), str(fault.get("error", "")),
                                            str(fault.get("cause", "")), run)
    now = clock()
    if job and decision is None and run.attempts and run.current.status == "InProgress":
        job = runs.jsonable(job)
        runs.finish_attempt(run, now=now, job=job)
    stopped, left, transient = stop_jobs_left_running(run)
    if transient:
        # Nobody would stop these later: fail this invocation so that the state machine runs Summarize again (it
        # is safe to run twice); past its retries, StopCurrentJob tries the current attempt's job once more.
        raise JobsStillRunning(f"could not stop {', '.join(transient)}; trying again")
    types = {kind for a in run.attempts if a.training_seconds or a.billable_seconds
             for _, kind in cluster_types(a.instance_type, a.instance_count)}
    outcome = summary(run, job=job, decision=decision, now=now, stopped_jobs=stopped, jobs_left_running=left,
                      prices=training_prices(platform_region(), sorted(types)))
    subject, message = describe_in_words(outcome)
    if run.execution.arn:
        run_registry(platform_settings()).release(run.run_id, run.execution.arn, outcome=outcome["status"].lower(),
                                                  now=runs.iso(now), record=outcome.get("record") or {})
    # category and reason: what the Failed state shows as the execution's error and cause (a launcher fault in the
    # words written above, not the decision's placeholder).
    return {"succeeded": outcome["status"] == "Succeeded", "subject": subject, "message": message,
            "category": outcome["category"], "reason": outcome["reason"], "summary": outcome}


# The statuses an EventBridge "Step Functions Execution Status Change" event carries for an execution that ended.
ENDED_EXECUTION = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


def reap(event: dict[str, Any], context: Any = None) -> dict[str, Any]:
    """An execution of the launcher ended (the execution-status rule's event): whatever ended it (Summarize, a
    console stop, StopExecution from code, a failure no Catch took, a timeout), stop every job of the run it held
    that still runs, and let the run go. Safe to run again: a stop is asked only of a job that runs, the lease is
    given back only by its holder. A stop that may pass raises, so that Lambda runs the event again."""
    detail = event.get("detail") or {}
    arn, status = detail.get("executionArn", ""), detail.get("status", "")
    if not arn or status not in ENDED_EXECUTION:
        return {"execution": arn, "run_id": "", "stopped": [], "left": []}
    platform = platform_settings()
    # A successor refused in Prepare wrote no run state: its input names the run it was to take over.
    run_id = run_of_execution(arn) or _resumed_run(detail.get("input"))
    registry = run_registry(platform)
    record = registry.read(run_id) if run_id else None
    holder = _reaped_for(record, arn)
    if record is None or holder is None:
        # It never took a run (refused in Prepare), another execution holds the run now, or it handed the run over to
        # one that still runs: the run's jobs are that one's.
        return {"execution": arn, "run_id": run_id, "stopped": [], "left": []}
    run = runs.new_run(SimpleNamespace(name=record.name, training_instance_type="", spot=False), run_id=run_id,
                       execution={"id": holder}, now=clock())
    run.checkpoint_s3_uri = checkpoint_s3_uri(platform, run_id)
    # Every attempt the run recorded: the ones its earlier executions launched ended with them, or were handed over.
    run.attempts = [runs.Attempt(attempt=a["attempt"], job_name=a["job_name"], instance_type="", instance_count=0,
                                 spot=False) for a in record.attempts]
    stopped, left, transient = stop_jobs_left_running(run)
    if transient:
        raise JobsStillRunning(f"could not stop {', '.join(transient)}; trying again")
    registry.release(run_id, holder, outcome=status.lower(), now=runs.iso(clock()))
    log.info("execution %s ended %s: run %s let go; stopped %s", arn, status, run_id, stopped or "nothing")
    return {"execution": arn, "run_id": run_id, "stopped": stopped, "left": left}


def _reaped_for(record, arn: str) -> str | None:
    """The holder whose run the ended execution `arn` leaves behind (its ARN: the reaper stops the run's jobs and lets
    go for it), or None when the run is not left behind: held by another execution, or handed over by `arn` to a
    successor that still runs (it takes the run and its job over). A successor that ended without taking the run over
    leaves behind the run of its predecessor, once that one has ended too."""
    if record is None:
        return None
    if record.owner == arn:
        return None if record.successor and not execution_has_ended(record.successor) else arn
    if record.successor == arn and execution_has_ended(record.owner):
        return record.owner
    return None


def _resumed_run(text: Any) -> str:
    try:
        document = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return ""
    run_id = document.get("resume_run") if isinstance(document, dict) else None
    return run_id if isinstance(run_id, str) else ""


def run_of_execution(arn: str) -> str:
    """The run an execution drove: its run state's id, from the first state that left the state with one (Prepare);
    "" when none did (it ended in Prepare, which launches nothing)."""
    import boto3

    pages = boto3.client("stepfunctions", region_name=os.environ.get("AWS_REGION")).get_paginator(
        "get_execution_history").paginate(executionArn=arn, includeExecutionData=True)
    for page in pages:
        for event in page["events"]:
            output = (event.get("stateExitedEventDetails") or {}).get("output")
            try:
                run_id = (json.loads(output or "{}").get("run") or {}).get("run_id")
            except (ValueError, AttributeError):
                continue
            if isinstance(run_id, str) and run_id:
                return run_id
    return ""


def platform_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")


def attempt_prices(request, platform: PlatformSettings, instance_type: str | None = None) -> dict[str, float] | None:
    """The prices of the types an attempt launches (its instance groups', or `instance_type`, the request's unless
    a retry chose another), asked only where the job tags its MLflow run with its cost; None elsewhere. One quick try:
    a launch is never held up by a price (the run's record prices it again at the end)."""
    if not platform.mlflow_tracking_uri:
        return None
    types = sorted({g.type for g in request.instance_groups}) if request.instance_groups else \
        [instance_type or request.training_instance_type]
    return training_prices(platform_region(), types, tries=1, read_timeout=5)


def training_prices(region: str | None, instance_types: list[str], *, tries: int = 2,
                    read_timeout: int = 10) -> dict[str, float]:
    """On-demand USD per instance-hour of each type, from the AWS Price List API (jobs.prices reads the answer,
    as trainctl's does); {} when it cannot be asked: the record's cost is then "unknown", and the run's end is
    never held up by a price (short timeouts, two tries)."""
    if not region or not instance_types:
        return {}
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client("pricing", region_name=API_REGION, config=Config(
        connect_timeout=3, read_timeout=read_timeout, retries={"mode": "standard", "total_max_attempts": tries}))
    entries = []
    try:
        for kind in instance_types:
            for page in client.get_paginator("get_products").paginate(
                    ServiceCode=SERVICE_CODE, Filters=instance_filters(region, kind), FormatVersion="aws_v1"):
                entries += page.get("PriceList", [])
    except (BotoCoreError, ClientError) as exc:
        log.warning("no prices for the run's record (pricing:GetProducts): %s", exc)
        return {}
    return products_to_prices(entries, region)[0]


class JobsStillRunning(Exception):
    """Summarize could not stop a job of the run for a reason that may pass (throttled, a service fault, the
    network): the state machine retries the function (platform_constructs.launcher_definition)."""


# Errors of StopTrainingJob that another try may not meet; any other (the job ended meanwhile, access denied)
# is final and reported in the notification.
_PASSING_ERRORS = ("Throttling", "TooManyRequests", "RequestLimitExceeded", "InternalFailure", "InternalServerError",
                   "ServiceUnavailable", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                   "ConnectionClosedError")


def _may_pass(why: str) -> bool:
    """`why` is stop_training_job's answer: the error's code or class name, then its message."""
    return why.split(":", 1)[0].strip().startswith(_PASSING_ERRORS)


def _sagemaker(region: str | None = None, attempts: int = 1):
    import boto3  # the Lambda runtime provides it; imported here so the rest of jobs needs only the stdlib
    from botocore.config import Config

    # One try by default: a throttled look-up is retried by the state machine's Wait state (no sleeping here).
    return boto3.client("sagemaker", region_name=os.environ.get("AWS_REGION") or region,
                        config=Config(retries={"mode": "standard", "total_max_attempts": attempts}))


def look_up_training_job(job_name: str, region: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """(DescribeTrainingJob as JSON values, "") ; (None, "") when no such job exists; (None, why) when the
    look-up itself failed (throttled, denied, unreachable) and nobody knows whether it exists."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return runs.jsonable(_sagemaker(region).describe_training_job(TrainingJobName=job_name)), ""
    except ClientError as exc:
        code, message = exc.response["Error"].get("Code", ""), exc.response["Error"].get("Message", "")
        # SageMaker answers a name it does not know with ValidationException "Requested resource not found."
        if code in ("ValidationException", "ResourceNotFound") and re.search(r"not (?:be )?found|could not find",
                                                                            message, re.IGNORECASE):
            return None, ""
        log.warning("describe_training_job(%s) failed: %s", job_name, exc)
        return None, f"{code}: {message}"
    except BotoCoreError as exc:
        log.warning("describe_training_job(%s) failed: %s", job_name, exc)
        return None, f"{type(exc).__name__}: {exc}"


def describe_training_job(job_name: str, region: str) -> dict[str, Any] | None:
    """DescribeTrainingJob as JSON values, or None when the job does not exist or cannot be looked up."""
    return look_up_training_job(job_name, region)[0]


def stop_jobs_left_running(run: RunState) -> tuple[list[str], list[str], list[str]]:
    """Stop every job of the run that still runs; (names stopped, "name (why)" of those that could not be, and
    of those the ones whose refusal may pass: throttled, a service fault, the network).

    A job seen under an attempt's name that is not the run's is left alone. One that cannot be looked up is
    stopped all the same: the run ends, and its names cannot be guessed, so such a job is almost surely its own.
    """
    stopped, left, transient = [], [], []
    platform = platform_settings()
    # A job created although its create failed (a 5xx) may show up only after Decide looked for it: any running job
    # that carries the run's marker is the run's, recorded or not.
    recorded = {a.job_name: a for a in run.attempts}
    for job in running_jobs_of_run(run, {n for n, a in recorded.items() if a.status in runs.MAY_RUN}, platform):
        name = job["TrainingJobName"]
        if name in recorded:  # an attempt given up as never created, whose job showed up since
            recorded[name].status = "Unknown"
        else:
            run.attempts.append(runs.Attempt(attempt=attempt_number(job), job_name=name, instance_type="",
                                             instance_count=0, spot=False, status="Unknown",
                                             reason="found running with the run's marker; not recorded by this run"))
    for attempt in (a for a in run.attempts if a.status in runs.MAY_RUN):
        job, error = look_up_training_job(attempt.job_name)
        if job is None and not error:
            attempt.status = "NotCreated"
            continue
        if job is not None and not runs.is_ours(run, job, platform.execution_role_arn):
            attempt.status = "NotCreated"  # the name is another's job: never stopped by this run
            continue
        if job is not None:
            attempt.status = job.get("TrainingJobStatus", attempt.status)
            attempt.secondary_status = job.get("SecondaryStatus", attempt.secondary_status)
            if attempt.status != "InProgress":
                continue
        why = stop_training_job(attempt.job_name)
        if why and job is None and "not found" in why.lower():
            attempt.status = "NotCreated"
        elif why:
            left.append(f"{attempt.job_name} ({why})")
            if _may_pass(why):
                transient.append(left[-1])
        else:
            attempt.status, attempt.stopped_by_launcher = "Stopping", True
            stopped.append(attempt.job_name)
    return stopped, left, transient


def running_jobs_of_run(run: RunState, known: set[str], platform: PlatformSettings) -> list[dict[str, Any]]:
    """The run's jobs, other than `known` ones, that SageMaker lists as InProgress (by the run id's random part, each
    kept only when it carries the run's marker); [] when the listing fails (the recorded attempts are still looked up
    one by one)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        listed = _listed_jobs(_sagemaker(attempts=4), run, platform, status="InProgress", skip=known)
    except (BotoCoreError, ClientError) as exc:
        log.warning("listing the jobs of run %s failed: %s", run.run_id, exc)
        return []
    return [job for job in listed if job.get("TrainingJobStatus") in runs.RUNNING]  # not ended since it was listed


def stop_training_job(job_name: str) -> str:
    """StopTrainingJob; "" when SageMaker took the request, else why not."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        # The run ends here: let the SDK retry throttling a few times, there is no later chance.
        _sagemaker(attempts=4).stop_training_job(TrainingJobName=job_name)
        log.info("stopped %s", job_name)
        return ""
    except ClientError as exc:
        log.warning("stop_training_job(%s) failed: %s", job_name, exc)
        return f"{exc.response['Error'].get('Code', '')}: {exc.response['Error'].get('Message', '')}"
    except BotoCoreError as exc:
        log.warning("stop_training_job(%s) failed: %s", job_name, exc)
        return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":  # a quick manual check: PLATFORM_SETTINGS=... python -m jobs.handler REQUEST.json
    import sys
    from pathlib import Path

    print(json.dumps(prepare({"request": json.loads(Path(sys.argv[1]).read_text())}), indent=2))
