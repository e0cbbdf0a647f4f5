"""Executions started before a deploy reach the functions deployed after it.

An execution keeps the definition it started with. Since the functions are versioned it calls the versions
deployed with it; an execution started before calls them unqualified, hence their newest code. The definition
of a3dcd76, the last before the request left the state and the functions were versioned (its `create`, `job` and `failure` keys, $.run.request.name), was synthesized then and kept here as
resolved JSON (earlier/definition-a3dcd76.json); it runs in moto against today's handlers
(jobs.handler._legacy_decide), through each of its paths: a retry, a watch on a job left running, a failure.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.launcher import sagemaker_sync as sm
from tests.launcher.definition import LauncherDefinition, launcher_definition
from tests.launcher.harness import LauncherHarness
from tests.launcher.inputs import job_request

EARLIER = Path(__file__).parent / "earlier" / "definition-a3dcd76.json"


@pytest.fixture(scope="module")
def earlier(launcher_template: dict, platform_settings: dict):
    # Today's deploy around it: its registry table, and its execution-status rule, which sees every execution of the
    # state machine, those started on an earlier definition too.
    today = launcher_definition(launcher_template)
    definition = LauncherDefinition(**json.loads(EARLIER.read_text()), table=today.table,
                                    execution_rules=today.execution_rules)
    with LauncherHarness(definition, platform_settings) as world:
        yield world


def test_a_spot_interruption_is_resumed_on_the_earlier_definition(earlier):
    result = earlier.run(job_request(spot=True), [sm.spot_interrupted(), sm.completed()], name="earlier-spot")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered == ["Prepare", "Launch", "Decide", "RetryOrFail", "Backoff", "NextAttempt", "Launch",
                                     "Summarize", "Notify", "Outcome", "Summary", "Succeeded"]
    assert len(set(result.job_names)) == 2
    assert [a["category"] for a in result.output["attempts"]] == ["spot_interruption", ""]
    ((subject, _),) = result.notifications
    assert subject == "Training run gpt-125m-fsdp succeeded (2 attempts)"


def test_a_job_left_running_is_watched_on_the_earlier_definition(earlier):
    result = earlier.run(job_request(), [sm.created_then_5xx(sm.completed(train_loss=1.9))], name="earlier-5xx")
    assert result.status == "SUCCEEDED", (result.error, result.cause)
    assert result.states_entered.count("Launch") == 1 and "WaitForJob" in result.states_entered
    assert result.output["final_metrics"]["train_loss"] == 1.9


def test_a_failure_ends_with_its_summary_on_the_earlier_definition(earlier):
    result = earlier.run(job_request(), [sm.algorithm_error()], name="earlier-user-error")
    assert result.status == "FAILED" and result.error == "user_error"
    ((subject, message),) = result.notifications
    assert subject == "Training run gpt-125m-fsdp failed: user_error" and "ValueError" in message


def test_a_fault_in_summarize_still_names_the_run_on_the_earlier_definition(earlier, monkeypatch):
    """The earlier SummarizeFailed state reads $.run.request.name and $.create.TrainingJobName: what Decide
    hands back to an earlier execution keeps both."""
    import jobs.handler

    def broken(event, context=None):
        raise RuntimeError("summarize broke")

    monkeypatch.setattr(jobs.handler, "summarize", broken)
    result = earlier.run(job_request(), [sm.algorithm_error()], name="earlier-summarize-fault", timeout=60)
    assert result.status == "FAILED" and result.error == "launcher_error"
    ((subject, message),) = result.notifications
    assert subject == "Training run gpt-125m-fsdp failed: launcher_error"
    assert result.job_names[0] in message
