"""Pins for the moto internals the launcher harness reaches into. If one fails, it names what moved.

The harness replaces three moto functions/constants, renames the StartExecution task's names (two more
methods), pages GetExecutionHistory, subclasses one moto class and reads moto's SageMaker and SNS records. These
tests check each seam directly, so that a moto upgrade fails here, with a message, rather than as a confusing
scenario failure.
"""

from __future__ import annotations

import inspect
import json
import time
from importlib.metadata import version

import boto3
from moto import mock_aws
from moto.sagemaker.models import FakeTrainingJob
from moto.sns.models import Topic
from moto.stepfunctions.parser.asl.component.state.exec.state_task import (
    lambda_eval_utils,
    state_task_factory,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
    state_task_service_callback,
    state_task_service_factory,
)
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
    StateTaskServiceCallback,
)

from tests.launcher.harness import MOTO_CONFIG

PINNED = "5.2.5"


def test_moto_is_the_pinned_version():
    assert version("moto") == PINNED, (
        f"moto {version('moto')} is installed; the launcher harness was written against {PINNED}. "
        "Re-check every seam in this file, then update PINNED and requirements-dev.txt together."
    )


def test_state_task_factory_still_looks_up_the_service_factory_by_name():
    source = inspect.getsource(state_task_factory.state_task_for)
    assert "state_task_service_for(" in source, (
        "state_task_factory.state_task_for no longer calls state_task_service_for: the harness patches that "
        "name to install its SageMaker .sync integration"
    )
    assert "sagemaker" in state_task_service_factory._UNSUPPORTED_SERVICE_NAMES, (
        "moto now has its own SageMaker integration: compare it with tests/launcher/sagemaker_sync.py"
    )


def test_lambda_invoke_seam_is_unchanged():
    params = list(inspect.signature(lambda_eval_utils._invoke_lambda_function).parameters)
    assert params == ["parameters", "region", "state_credentials"], (
        f"lambda_eval_utils._invoke_lambda_function now takes {params}: update InProcessLambda.invoke"
    )
    assert "_invoke_lambda_function(" in inspect.getsource(
        lambda_eval_utils.execute_lambda_function_integration
    )


def test_sync_poll_interval_constant_is_still_read_at_run_time():
    assert hasattr(state_task_service_callback, "_DELAY_SECONDS_SYNC_CONDITION_CHECK"), (
        "moto renamed the .sync poll interval constant: update harness.POLL_SECONDS's patch target"
    )
    assert "_DELAY_SECONDS_SYNC_CONDITION_CHECK" in inspect.getsource(StateTaskServiceCallback._eval_sync)


def test_callback_base_hooks_the_integration_overrides():
    for name, expected in {
        "_build_sync_resolver": [
            "self",
            "env",
            "resource_runtime_part",
            "normalised_parameters",
            "state_credentials",
        ],
        "_eval_service_task": [
            "self",
            "env",
            "resource_runtime_part",
            "normalised_parameters",
            "state_credentials",
        ],
        "_from_error": ["self", "env", "ex"],
        "_get_supported_parameters": ["self"],
    }.items():
        found = list(inspect.signature(getattr(StateTaskServiceCallback, name)).parameters)
        assert found == expected, (
            f"StateTaskServiceCallback.{name} now takes {found}: update sagemaker_sync.py"
        )


def _run_pass_state(parameters: dict, data: dict) -> dict:
    with mock_aws(config=MOTO_CONFIG):
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        definition = {
            "StartAt": "P",
            "States": {"P": {"Type": "Pass", "Parameters": parameters, "End": True}},
        }
        arn = sfn.create_state_machine(
            name="pin", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/pin"
        )["stateMachineArn"]
        execution = sfn.start_execution(stateMachineArn=arn, input=json.dumps(data))["executionArn"]
        deadline = time.monotonic() + 10
        while (described := sfn.describe_execution(executionArn=execution))["status"] == "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return json.loads(described["output"])


def test_moto_still_misreads_the_role_arn_path_key():
    output = _run_pass_state({"RoleArn.$": "$.role", "Other.$": "$.role"}, {"role": "arn:aws:iam::1:role/x"})
    assert output["Other"] == "arn:aws:iam::1:role/x"
    assert output == {"RoleArn.$": "$.role", "Other": "arn:aws:iam::1:role/x"}, (
        f"moto now resolves the 'RoleArn.$' payload key ({output}): remove MOTO_KEYWORD_KEYS and its rename "
        "from tests/launcher/sagemaker_sync.py"
    )


def test_moto_records_the_fields_the_scripted_sagemaker_sets():
    source = inspect.getsource(FakeTrainingJob)
    for attribute in (
        "training_job_status",
        "secondary_status",
        "final_metric_data_list",
        "model_artifacts",
        "secondary_status_transitions",
    ):
        assert f"self.{attribute}" in source, f"moto's FakeTrainingJob no longer has {attribute}"
    assert "gen_response_object" in inspect.getsource(FakeTrainingJob.response_object.fget), (
        "FakeTrainingJob.response_object no longer derives the description from its attributes: the "
        "scripted failure reasons would not show in DescribeTrainingJob"
    )
    assert "self.sent_notifications.append(" in inspect.getsource(Topic.publish), (
        "moto's SNS Topic no longer records sent_notifications: the harness reads notifications there"
    )


def test_moto_still_hands_the_start_execution_task_its_names_as_written():
    """The harness renames the StartExecution task's parameters and answer (harness._sfn_parameters, _sfn_response):
    moto 5.2.5 passes `StateMachineArn` to boto3, which knows `stateMachineArn`, and the task fails. When this test
    fails, moto spells them itself: drop the two seams."""
    definition = {"StartAt": "Start", "States": {"Start": {
        "Type": "Task", "Resource": "arn:aws:states:::states:startExecution", "End": True,
        "Parameters": {"StateMachineArn": "arn:aws:states:us-east-1:123456789012:stateMachine:target",
                       "Name": "started", "Input": {}}}}}
    with mock_aws(config=MOTO_CONFIG):
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        role = "arn:aws:iam::123456789012:role/r"
        sfn.create_state_machine(name="target", roleArn=role, definition=json.dumps(
            {"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}))
        arn = sfn.create_state_machine(name="starter", definition=json.dumps(definition), roleArn=role)[
            "stateMachineArn"]
        execution, status = run_to_its_end(sfn, arn)
        events = sfn.get_execution_history(executionArn=execution)["events"]
    failed = [e["taskFailedEventDetails"] for e in events if e["type"] == "TaskFailed"]
    assert status == "FAILED" and failed == [{"error": "States.Runtime", "cause": "'StateMachineArn'"}], failed


def test_moto_still_answers_the_whole_history_whatever_is_asked():
    """The harness pages GetExecutionHistory (harness._history_page): moto 5.2.5 ignores reverseOrder and maxResults.
    When this test fails, moto pages it itself: drop the seam."""
    with mock_aws(config=MOTO_CONFIG):
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        arn = sfn.create_state_machine(name="passes", roleArn="arn:aws:iam::123456789012:role/r", definition=json.dumps(
            {"StartAt": "P", "States": {"P": {"Type": "Pass", "Next": "Q"}, "Q": {"Type": "Pass", "End": True}}}))[
            "stateMachineArn"]
        execution, _ = run_to_its_end(sfn, arn)
        events = sfn.get_execution_history(executionArn=execution, reverseOrder=True, maxResults=1)["events"]
    assert len(events) > 1 and events[0]["id"] == 1


def run_to_its_end(sfn, state_machine: str) -> tuple[str, str]:
    """Start an execution in moto's interpreter (it runs in a thread) and wait for its end; (its ARN, its status)."""
    execution = sfn.start_execution(stateMachineArn=state_machine)["executionArn"]
    deadline = time.monotonic() + 10
    while (status := sfn.describe_execution(executionArn=execution)["status"]) == "RUNNING":
        assert time.monotonic() < deadline, "moto's execution did not end within 10 s"
        time.sleep(0.01)
    return execution, status
