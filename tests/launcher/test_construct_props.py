"""JobLauncher and LauncherMonitoring on their own (in-process synth): the props the app does not vary."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Match, Template

from platform_constructs.launcher import JobLauncher
from platform_constructs.monitoring import LauncherMonitoring
from tests.launcher.inputs import SETTINGS_FILE


def launcher_stack(**props) -> tuple[Stack, JobLauncher]:
    stack = Stack(App(), "Launcher")
    key = kms.Key(stack, "Key")
    role = iam.Role(stack, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    settings = json.loads(SETTINGS_FILE.read_text())
    launcher = JobLauncher(
        stack,
        "JobLauncher",
        key=key,
        execution_role=role,
        settings=settings,
        **{"name_prefix": "mltrain", **props},
    )
    return stack, launcher


def test_email_subscription_and_reserved_concurrency():
    stack, _ = launcher_stack(notification_email="ml-team@example.com", lambda_reserved_concurrency=5)
    template = Template.from_stack(stack)
    template.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ml-team@example.com"}
    )
    template.resource_properties_count_is("AWS::Lambda::Function", {"ReservedConcurrentExecutions": 5}, 3)


def test_settings_reach_every_function_as_json():
    stack, _ = launcher_stack()
    functions = Template.from_stack(stack).find_resources("AWS::Lambda::Function")
    expected = json.loads(SETTINGS_FILE.read_text())
    for function in functions.values():
        value = function["Properties"]["Environment"]["Variables"]["PLATFORM_SETTINGS"]
        assert json.loads(value) == expected  # no tokens here, so the document is plain JSON


@pytest.mark.parametrize("prefix", ["", "has space", "x" * 21, "under_score", "-lead", "trail-"])
def test_name_prefix_is_checked(prefix):
    with pytest.raises(ValueError, match="name_prefix"):
        launcher_stack(name_prefix=prefix)


def test_monitoring_checks_its_thresholds():
    stack, launcher = launcher_stack()
    with pytest.raises(ValueError, match="low_gpu_utilization_percent"):
        LauncherMonitoring(
            stack,
            "M1",
            name_prefix="mltrain",
            state_machine=launcher.state_machine,
            topic=launcher.topic,
            low_gpu_utilization_percent=120,
        )
    with pytest.raises(ValueError, match="gpus_per_host"):
        LauncherMonitoring(
            stack,
            "M2",
            name_prefix="mltrain",
            state_machine=launcher.state_machine,
            topic=launcher.topic,
            gpus_per_host=0,
        )
    LauncherMonitoring(
        stack,
        "M3",
        name_prefix="mltrain",
        state_machine=launcher.state_machine,
        topic=launcher.topic,
        gpus_per_host=8,
        low_gpu_utilization_minutes=15,
    )
    Template.from_stack(stack).has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "mltrain-training-low-gpu-utilization",
            "Threshold": 640,
            "EvaluationPeriods": 3,
            "DatapointsToAlarm": 3,
            "Metrics": Match.any_value(),
        },
    )
