"""The synthesized definition: resolved honestly, shaped as the contracts say, and valid ASL."""

from __future__ import annotations

import copy
import importlib
import json

import pytest
from cfnlint.api import lint

from jobs.render.training_job import CREATE_REQUEST_KEYS
from tests.launcher.definition import (
    UnresolvedIntrinsic,
    contains_intrinsic,
    fake_names,
    launcher_definition,
    resolve,
)


@pytest.fixture(scope="module")
def resolved(launcher_template):
    return launcher_definition(launcher_template)


def test_resolver_leaves_no_intrinsic(launcher_template, resolved):
    (machine,) = [
        r for r in launcher_template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"
    ]
    assert contains_intrinsic(machine["Properties"]["DefinitionString"])  # there was something to resolve
    assert not contains_intrinsic(resolved.definition)
    text = json.dumps(resolved.definition)
    assert "Fn::" not in text and '"Ref"' not in text and "${Token[" not in text


def test_resolver_refuses_what_it_does_not_know(launcher_template):
    refs, attrs = fake_names(launcher_template)
    with pytest.raises(UnresolvedIntrinsic, match="Fn::Sub"):
        resolve({"Fn::Sub": "arn:${AWS::Partition}:x"}, refs, attrs)
    with pytest.raises(UnresolvedIntrinsic, match="NoSuchResource"):
        resolve({"Fn::Join": ["", [{"Ref": "NoSuchResource"}]]}, refs, attrs)


def test_launch_maps_every_create_request_key(resolved):
    launch = resolved.definition["States"]["Launch"]
    assert launch["Type"] == "Task"
    assert launch["Resource"] == "arn:aws:states:::sagemaker:createTrainingJob.sync"
    assert launch["Parameters"] == {f"{key}.$": f"$.launch.create.{key}" for key in CREATE_REQUEST_KEYS}
    # The job's description, or the failure, takes the create request's place: the state holds one of them.
    assert launch["ResultSelector"] == {"job.$": "$"} and launch["ResultPath"] == "$.launch"
    assert launch["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.launch", "Next": "FailureCause"}]
    assert "Retry" not in launch  # every retry decision is the decide function's


def test_states_and_transitions(resolved):
    states = resolved.definition["States"]
    assert resolved.definition["StartAt"] == "Prepare"
    # A refused request ends RequestInvalid; Prepare's own fault, past its retries, is told in words and notified.
    assert states["Prepare"]["Catch"] == [
        {"ErrorEquals": ["RequestInvalid"], "ResultPath": "$.error", "Next": "ParseRequestError"},
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.prepare_error", "Next": "PrepareFault"},
    ]
    assert states["RequestInvalid"] == {
        "Type": "Fail",
        "Error": "RequestInvalid",
        "CausePath": "$.error.errorMessage",
    }
    assert states["Backoff"] == {
        "Type": "Wait",
        "SecondsPath": "$.decision.wait_seconds",
        "Next": "NextAttempt",
    }
    # The next attempt's name is minted after the wait (jobs.handler.relaunch); an execution that lost the run
    # launches nothing and ends in Summarize.
    assert resolved.handlers[states["NextAttempt"]["Resource"]] == "jobs.handler.relaunch"
    assert states["NextAttempt"]["Parameters"] == {
        "request.$": "$$.Execution.Input", "run.$": "$.run", "decision.$": "$.decision"}
    assert states["NextAttempt"]["Next"] == "Launching"
    assert states["Launching"]["Choices"] == [{"Variable": "$.launch.create", "IsPresent": True, "Next": "Launch"}]
    assert states["Launching"]["Default"] == "Summarize"
    # A failed job's Cause is its description, as large as the request: left out before Decide, which gets the
    # request from the execution's input (never from the state) and looks the job up by name.
    assert states["FailureCause"]["Choices"] == [
        {"Variable": "$.launch.Cause", "IsPresent": True, "Next": "DescribedFailure"}]
    assert states["DescribedFailure"]["Choices"] == [
        {"Variable": "$.launch.Cause", "StringMatches": "{*", "Next": "DropDescription"}]
    assert states["FailureCause"]["Default"] == states["DescribedFailure"]["Default"] == "Decide"
    assert states["DropDescription"] == {"Type": "Pass", "Parameters": {
        "run.$": "$.run", "launch": {"Error.$": "$.launch.Error"}}, "Next": "Decide"}
    assert states["Decide"]["Parameters"] == {
        "request.$": "$$.Execution.Input", "run.$": "$.run", "failure.$": "$.launch"}
    assert states["Prepare"]["Parameters"]["request.$"] == "$$.Execution.Input"
    assert states["Decide"]["Catch"] == [
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.decide_error", "Next": "DecideFailed"}
    ]
    assert states["DecideFailed"]["Next"] == "Summarize"
    assert states["RetryOrFail"]["Choices"] == [
        {"Variable": "$.decision.action", "StringEquals": "retry", "Next": "Backoff"},
        # The attempt's job still runs after a launch error: wait and look again, never launch another.
        {"Variable": "$.decision.action", "StringEquals": "watch", "Next": "WaitForJob"},
        # The history nears its limit: the run goes on in a new execution of this state machine, by name.
        {"Variable": "$.decision.action", "StringEquals": "continue", "Next": "StartSuccessor"},
    ]
    assert states["RetryOrFail"]["Default"] == "Summarize"
    assert states["Prepare"]["Next"] == "TakenOver"
    assert states["TakenOver"]["Choices"] == [{"Variable": "$.decision", "IsPresent": True, "Next": "RetryOrFail"}]
    assert states["TakenOver"]["Default"] == "Launch"
    start = states["StartSuccessor"]
    assert start["Resource"] == "arn:aws:states:::states:startExecution"  # request-response: it does not wait
    assert start["Parameters"] == {
        "StateMachineArn": resolved.state_machine_arn, "Name.$": "$.handoff.name",
        "Input.$": "States.JsonMerge($$.Execution.Input, $.handoff.changes, false)"}
    assert start["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.handoff_error", "Next": "GoOnHere"}]
    assert states["GoOnHere"]["Choices"] == [
        {"Variable": "$.decision.then", "StringEquals": "retry", "Next": "Backoff"}]
    assert states["GoOnHere"]["Default"] == "WaitForJob"
    assert start["Next"] == "ContinuedIn" and states["ContinuedIn"]["Next"] == "Continued"
    assert states["Continued"] == {"Type": "Succeed"}
    assert states["WaitForJob"] == {"Type": "Wait", "SecondsPath": "$.decision.wait_seconds", "Next": "Decide"}
    # Summarize stops the jobs a run leaves running; when it fails itself, the state machine stops the job.
    assert states["Summarize"]["Catch"] == [
        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.summarize_error", "Next": "StopCurrentJob"}
    ]
    stop = states["StopCurrentJob"]
    assert stop["Resource"] == "arn:aws:states:::aws-sdk:sagemaker:stopTrainingJob"
    assert stop["Parameters"] == {"TrainingJobName.$": "$.run.job_name"}
    assert stop["Next"] == "SummarizeFault" and stop["Catch"][0]["Next"] == "SummarizeFault"
    # Its fault in words: the cause's errorMessage when it is a Lambda error's JSON, else the cause, else the name.
    assert {states[f"SummarizeFailed{s}"]["Next"] for s in ("", "Plainly", "Bare")} == {"Notify"}
    assert states["Notify"]["Resource"] == "arn:aws:states:::sns:publish"
    assert states["Notify"]["Parameters"]["TopicArn"] == resolved.topic_arn
    assert states["Summary"] == {"Type": "Pass", "InputPath": "$.result.summary", "Next": "Succeeded"}
    assert states["Succeeded"] == {"Type": "Succeed"}
    # Every state is reachable from StartAt, and every Next names a state.
    reachable, todo = set(), ["Prepare"]
    while todo:
        name = todo.pop()
        if name in reachable:
            continue
        reachable.add(name)
        state = states[name]
        nexts = [
            state.get("Next"),
            state.get("Default"),
            *(c["Next"] for c in state.get("Choices", [])),
            *(c["Next"] for c in state.get("Catch", [])),
        ]
        todo += [n for n in nexts if n]
    assert reachable == set(states)


def test_lambda_tasks_run_the_jobs_handlers(resolved):
    tasks = {
        name: s
        for name, s in resolved.definition["States"].items()
        if s.get("Resource", "") in resolved.handlers
    }
    assert {name: resolved.handlers[s["Resource"]] for name, s in tasks.items()} == {
        "Prepare": "jobs.handler.prepare",
        "Decide": "jobs.handler.decide",
        "NextAttempt": "jobs.handler.relaunch",
        "Summarize": "jobs.handler.summarize",
    }
    # Each invokes its function's version of the deploy, qualified: an execution keeps the code it started with.
    assert all(s["Resource"].endswith(":1") for s in tasks.values()), [s["Resource"] for s in tasks.values()]
    handler_module = importlib.import_module("jobs.handler")
    for handler in resolved.handlers.values():
        assert callable(getattr(handler_module, handler.rsplit(".", 1)[1]))
    # Lambda's service errors first; then a refused request, never retried; then the handlers' own errors and
    # timeouts, a few times (retriers match in order).
    from jobs.retry.policy import (
        FUNCTION_RETRIES,
        STOP_RETRIES,
        STOP_RETRY_MAX_SECONDS,
        STOP_RETRY_SECONDS,
    )

    for name, state in tasks.items():
        service, refused, *stops, own = state["Retry"]
        assert all(e.startswith("Lambda.") for e in service["ErrorEquals"])
        assert refused == {"ErrorEquals": ["RequestInvalid"], "MaxAttempts": 0}
        assert own["ErrorEquals"] == ["States.ALL"] and own["MaxAttempts"] == FUNCTION_RETRIES
        # Summarize, when a job of the run could not be stopped for a reason that passes, is run again for longer.
        assert stops == ([{"ErrorEquals": ["JobsStillRunning"], "IntervalSeconds": STOP_RETRY_SECONDS,
                           "BackoffRate": 2, "MaxDelaySeconds": STOP_RETRY_MAX_SECONDS,
                           "MaxAttempts": STOP_RETRIES}] if name == "Summarize" else [])


def test_cfn_lint_validates_the_resolved_definition(launcher_template, resolved, tmp_path, monkeypatch):
    """cfn-lint skips a definition built with Fn::Join; with it resolved, its ASL schema checks (E3601) run.

    W3005 is ignored for the reason .cfnlintrc.yaml gives (the CDK's DependsOn on the role's policy).
    """
    # cfn-lint's API reads the command line and a config file in the working directory: give it neither.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["cfn-lint"])
    template = copy.deepcopy(launcher_template)
    (machine,) = [
        r for r in template["Resources"].values() if r["Type"] == "AWS::StepFunctions::StateMachine"
    ]
    machine["Properties"]["DefinitionString"] = json.dumps(resolved.definition)
    matches = [m for m in lint(json.dumps(template), regions=["us-east-1"]) if m.rule.id != "W3005"]
    assert matches == [], "\n".join(str(m) for m in matches)

    # The check is live: the form the Summary Pass state replaced (a Succeed with an OutputPath) is reported.
    broken = copy.deepcopy(resolved.definition)
    broken["States"]["Succeeded"]["OutputPath"] = "$.result.summary"
    machine["Properties"]["DefinitionString"] = json.dumps(broken)
    assert any(m.rule.id == "E3601" for m in lint(json.dumps(template), regions=["us-east-1"]))
