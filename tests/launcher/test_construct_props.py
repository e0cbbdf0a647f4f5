"""JobLauncher and LauncherMonitoring on their own (in-process synth): the props the app does not vary."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Match, Template

from platform_config import PlatformConfig
from platform_constructs.launcher import JobLauncher, JobLauncherProps
from platform_constructs.monitoring import LauncherMonitoring, LauncherMonitoringProps
from platform_constructs.retention import retention
from tests.launcher.inputs import SETTINGS_FILE


def launcher_stack(**props) -> tuple[Stack, JobLauncher]:
    stack = Stack(App(), "Launcher")
    key = kms.Key(stack, "Key")
    role = iam.Role(stack, "ExecutionRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    settings = json.loads(SETTINGS_FILE.read_text())
    launcher = JobLauncher(stack, "JobLauncher", JobLauncherProps(
        key=key,
        execution_role=role,
        settings=settings,
        **{"name_prefix": "mltrain", "log_retention": retention(PlatformConfig().log_retention_days), **props},
    ))
    return stack, launcher


def test_email_subscription_and_reserved_concurrency():
    stack, _ = launcher_stack(notification_email="ml-team@example.com", lambda_reserved_concurrency=5)
    template = Template.from_stack(stack)
    template.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ml-team@example.com"}
    )
    template.resource_properties_count_is("AWS::Lambda::Function", {"ReservedConcurrentExecutions": 5}, 5)


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
        LauncherMonitoringProps(
            name_prefix="mltrain",
            state_machine=launcher.state_machine,
            topic=launcher.topic,
            low_gpu_utilization_percent=120,
        )
    LauncherMonitoring(stack, "M3", LauncherMonitoringProps(
        name_prefix="mltrain",
        state_machine=launcher.state_machine,
        topic=launcher.topic,
        low_gpu_utilization_percent=70,
        low_gpu_utilization_minutes=15,
    ))
    Template.from_stack(stack).has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "AlarmName": "mltrain-training-low-gpu-utilization",
            "Threshold": 70,  # a host's GPUs averaged by the job: the percentage itself, whatever the GPU count
            "EvaluationPeriods": 3,
            "DatapointsToAlarm": 3,
            "Metrics": Match.any_value(),
        },
    )


def _role_statements(stack: Stack, role: iam.Role) -> list[dict]:
    template = Template.from_stack(stack).to_json()
    role_ref = {"Ref": stack.get_logical_id(role.node.default_child)}
    return [
        s
        for p in template["Resources"].values()
        if p["Type"] == "AWS::IAM::Policy" and role_ref in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def _granted(stack: Stack, statements: list[dict]) -> set[tuple[str, str]]:
    """(action, resource) pairs, the resource resolved to a readable string."""
    machine = stack.resolve(stack.get_logical_id(
        next(c for c in stack.node.find_all() if c.node.path.endswith("JobLauncher/StateMachine/Resource"))))

    types = {lid: r["Type"] for lid, r in Template.from_stack(stack).to_json()["Resources"].items()}

    def readable(resource) -> str:
        if resource == {"Ref": machine}:
            return "state-machine"
        if "Fn::GetAtt" in resource:  # a resource of the stack, by its type: AWS::DynamoDB::Table
            return types[resource["Fn::GetAtt"][0]]
        parts = resource["Fn::Join"][1]
        return "".join(p if isinstance(p, str) else "<ref>" for p in parts).removeprefix("arn:<ref>:")

    pairs = set()
    for s in statements:
        acts = [s["Action"]] if isinstance(s["Action"], str) else s["Action"]
        res = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        pairs |= {(a, readable(r)) for a in acts for r in res}
    return pairs


def test_grant_submit_gives_exactly_submit_and_stop():
    stack, launcher = launcher_stack()
    role = iam.Role(stack, "Engineer", assumed_by=iam.AccountRootPrincipal())
    launcher.grant_submit(role)
    assert _granted(stack, _role_statements(stack, role)) == {
        ("states:StartExecution", "state-machine"),
        ("states:StopExecution", "states:<ref>:<ref>:execution:mltrain-job-launcher:*"),
        ("sagemaker:StopTrainingJob", "sagemaker:<ref>:<ref>:training-job/mltrain-*"),
        ("ssm:GetParameter", "ssm:<ref>:<ref>:parameter/mltrain/*"),
    }


def test_grant_observe_gives_exactly_status_list_and_logs():
    stack, launcher = launcher_stack()
    role = iam.Role(stack, "Engineer", assumed_by=iam.AccountRootPrincipal())
    launcher.grant_observe(role)
    executions = "states:<ref>:<ref>:execution:mltrain-job-launcher:*"
    logs = "logs:<ref>:<ref>:log-group:/aws/sagemaker/TrainingJobs:*"
    # GetLogEvents on the launcher's own jobs' streams; FilterLogEvents (a whole group) is not granted.
    streams = "logs:<ref>:<ref>:log-group:/aws/sagemaker/TrainingJobs:log-stream:mltrain-*"
    assert _granted(stack, _role_statements(stack, role)) == {
        ("states:ListExecutions", "state-machine"),
        ("states:DescribeExecution", executions),
        ("states:GetExecutionHistory", executions),
        ("sagemaker:DescribeTrainingJob", "sagemaker:<ref>:<ref>:training-job/mltrain-*"),
        ("logs:DescribeLogStreams", logs),
        ("logs:GetLogEvents", streams),
        ("ssm:GetParameter", "ssm:<ref>:<ref>:parameter/mltrain/*"),
        # The run registry (trainctl runs, show, resume), its key decrypting through DynamoDB only.
        ("dynamodb:GetItem", "AWS::DynamoDB::Table"),
        ("dynamodb:Scan", "AWS::DynamoDB::Table"),
        ("kms:Decrypt", "AWS::KMS::Key"),
        ("kms:DescribeKey", "AWS::KMS::Key"),
    }
    (decrypt,) = [s for s in _role_statements(stack, role) if "kms:Decrypt" in s["Action"]]
    assert list(decrypt["Condition"]["StringEquals"]) == ["kms:ViaService"]


def test_engineers_policy_is_both_grants():
    stack, launcher = launcher_stack()
    policy = launcher.add_engineers_policy()
    role = iam.Role(stack, "Engineer", assumed_by=iam.AccountRootPrincipal())
    launcher.grant_submit(role)
    launcher.grant_observe(role)
    template = Template.from_stack(stack).to_json()
    document = template["Resources"][stack.get_logical_id(policy.node.default_child)]["Properties"]
    assert document["ManagedPolicyName"] == "mltrain-engineers"
    assert _granted(stack, document["PolicyDocument"]["Statement"]) == _granted(stack, _role_statements(stack, role))


def test_lambda_reserved_concurrency_is_checked():
    with pytest.raises(ValueError, match="lambda_reserved_concurrency"):
        launcher_stack(lambda_reserved_concurrency=0)





@pytest.mark.parametrize("notify", [False, True])
def test_a_refusal_reaches_the_topic_only_when_the_platform_asks(notify):
    # notify_refusals: a refused request (RequestInvalid) is published to the topic before the execution fails; by
    # default only whoever started it sees it. Run in moto on this construct's own definition.
    from tests.launcher.definition import launcher_definition
    from tests.launcher.harness import LauncherHarness
    from tests.launcher.inputs import job_request

    stack, _ = launcher_stack(notify_refusals=notify)
    template = Template.from_stack(stack).to_json()
    assert ("NotifyRefusal" in json.dumps(template)) is notify  # the state exists only when asked for
    with LauncherHarness(launcher_definition(template), json.loads(SETTINGS_FILE.read_text())) as world:
        result = world.run(job_request(instance={"type": "ml.p4d.24xlarge", "count": 0}), [], name="bad-count")
    assert result.status == "FAILED" and result.error == "RequestInvalid" and "instance.count" in result.cause
    if notify:
        ((subject, message),) = result.notifications
        assert subject == "Training request bad-count refused" and message == result.cause
    else:
        assert result.notifications == []
