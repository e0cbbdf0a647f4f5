"""The launcher stack as synthesized by the real app: least privilege, logging, encryption, monitoring."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import ROOT

# Actions that support no resource-level permissions, so `"Resource": "*"` is the only form they take.
UNSCOPABLE = {
    "sagemaker:ListTrainingJobs",
    "pricing:GetProducts",  # summarize, prepare, relaunch: public prices, for the run's and the attempt's cost
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
    "logs:CreateLogDelivery",
    "logs:GetLogDelivery",
    "logs:UpdateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:DescribeResourcePolicies",
    "logs:DescribeLogGroups",
}
TRAINING_JOB_ARN = {
    "Fn::Join": [
        "",
        [
            "arn:",
            {"Ref": "AWS::Partition"},
            ":sagemaker:",
            {"Ref": "AWS::Region"},
            ":",
            {"Ref": "AWS::AccountId"},
            ":training-job/mltrain-*",
        ],
    ]
}


def resources(template: dict, kind: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == kind}


def only(template: dict, kind: str) -> dict:
    (found,) = resources(template, kind).values()
    return found


def policy_statements(template: dict, role_logical_id: str) -> list[dict]:
    statements = []
    for policy in resources(template, "AWS::IAM::Policy").values():
        if {"Ref": role_logical_id} in policy["Properties"]["Roles"]:
            statements += policy["Properties"]["PolicyDocument"]["Statement"]
    return statements


def actions(statement: dict) -> list[str]:
    value = statement["Action"]
    return [value] if isinstance(value, str) else value


def test_state_machine_is_standard_logged_and_traced(launcher_template):
    machine = only(launcher_template, "AWS::StepFunctions::StateMachine")["Properties"]
    assert machine["StateMachineType"] == "STANDARD"
    assert machine["StateMachineName"] == "mltrain-job-launcher"
    assert machine["TracingConfiguration"] == {"Enabled": True}
    logging = machine["LoggingConfiguration"]
    assert logging["Level"] == "ALL" and logging["IncludeExecutionData"] is True
    (destination,) = logging["Destinations"]
    log_group_id = destination["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    log_group = launcher_template["Resources"][log_group_id]["Properties"]
    assert log_group["LogGroupName"].startswith("/aws/vendedlogs/states/")
    assert "KmsKeyId" in log_group and log_group["RetentionInDays"] >= 365  # cdk.json: log_retention_days 365


def test_state_machine_role_is_least_privilege(launcher_template):
    machine = only(launcher_template, "AWS::StepFunctions::StateMachine")["Properties"]
    role_id = machine["RoleArn"]["Fn::GetAtt"][0]
    statements = policy_statements(launcher_template, role_id)
    by_sid = {s.get("Sid"): s for s in statements}

    # Create, describe and stop only the jobs that carry the launcher's run-id tag key (a platform named
    # mltrain-dev has jobs named mltrain-dev-..., matched by mltrain-*, but tags them mltrain-dev:run-id).
    create, follow, tag = by_sid["CreateOwnTaggedJobs"], by_sid["FollowOwnTaggedJobs"], by_sid["TagOwnJobs"]
    assert actions(create) == ["sagemaker:CreateTrainingJob"]
    # ... and only in the training subnets with the platform's security group (both required: a job without a
    # VpcConfig would run outside the VPC); the default platform has no cost tag to pin.
    assert create["Condition"]["Null"] == {"aws:RequestTag/mltrain:run-id": "false", "sagemaker:VpcSubnets": "false",
                                           "sagemaker:VpcSecurityGroupIds": "false"}
    pinned = create["Condition"]["ForAllValues:StringEquals"]
    assert sorted(pinned) == ["sagemaker:VpcSecurityGroupIds", "sagemaker:VpcSubnets"]
    assert "TrainingSecurityGroup" in json.dumps(pinned["sagemaker:VpcSecurityGroupIds"])
    assert sorted(create["Condition"]) == ["ForAllValues:StringEquals", "Null"]
    assert sorted(actions(follow)) == ["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"]
    assert follow["Condition"] == {"Null": {"aws:ResourceTag/mltrain:run-id": "false"}}
    assert sorted(actions(tag)) == ["sagemaker:AddTags", "sagemaker:ListTags"]
    assert create["Resource"] == follow["Resource"] == tag["Resource"] == TRAINING_JOB_ARN

    pass_role = by_sid["PassTheExecutionRoleToSageMaker"]
    assert actions(pass_role) == ["iam:PassRole"]
    assert pass_role["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}
    assert "ExecutionRole" in json.dumps(pass_role["Resource"])  # the platform's execution role, nothing else

    rule = by_sid["SyncIntegrationEventsRule"]
    assert sorted(actions(rule)) == ["events:DescribeRule", "events:PutRule", "events:PutTargets"]
    assert json.dumps(rule["Resource"]).endswith(
        ':rule/StepFunctionsGetEventsForSageMakerTrainingJobsRule"]]}'
    )

    invoke = [s for s in statements if actions(s) == ["lambda:InvokeFunction"]]
    assert invoke and all("Function" in json.dumps(s["Resource"]) for s in invoke)
    # Every version of each launcher function: executions started on an earlier deploy call theirs.
    invoked = json.dumps([s["Resource"] for s in invoke])
    functions = resources(launcher_template, "AWS::Lambda::Function")
    for logical_id in functions:
        granted_invoke = json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [logical_id, "Arn"]}, ":*"]]}) in invoked
        # The state machine's three functions, never the reaper (EventBridge invokes it, on an execution's end).
        assert granted_invoke == (functions[logical_id]["Properties"]["Handler"] != "jobs.handler.reap"), logical_id
    publish = [s for s in statements if actions(s) == ["sns:Publish"]]
    assert publish and all(
        s["Resource"] == {"Ref": next(iter(resources(launcher_template, "AWS::SNS::Topic")))} for s in publish
    )

    granted = {a for s in statements for a in actions(s)}
    assert not {a for a in granted if a.endswith(":*") or a == "*"}
    for statement in statements:
        if statement["Resource"] == "*":
            assert set(actions(statement)) <= UNSCOPABLE, statement
    assert "iam:PassRole" not in {
        a for s in statements if s.get("Sid") != "PassTheExecutionRoleToSageMaker" for a in actions(s)
    }


def test_lambdas_run_only_the_jobs_package(launcher_template, cdk_out: Path):
    functions = resources(launcher_template, "AWS::Lambda::Function")
    assert {f["Properties"]["Handler"] for f in functions.values()} == {
        "jobs.handler.prepare",
        "jobs.handler.decide",
        "jobs.handler.relaunch",
        "jobs.handler.summarize",
        "jobs.handler.reap",
    }
    for function in functions.values():
        props = function["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert "KmsKeyArn" in props
        assert "PLATFORM_SETTINGS" in props["Environment"]["Variables"]
        log_group = launcher_template["Resources"][props["LoggingConfig"]["LogGroup"]["Ref"]]["Properties"]
        assert "KmsKeyId" in log_group and "RetentionInDays" in log_group
        asset = cdk_out / f"asset.{props['Code']['S3Key'].removesuffix('.zip')}"
        shipped = sorted(str(p.relative_to(asset)) for p in asset.rglob("*") if p.is_file())
        # jobs/ and the shared facts it reads (contract/), nothing else: their modules and the planner's published
        # measurements (jobs/planning/*.json, which the candidates' error bands read).
        expected = sorted(
            str(p.relative_to(ROOT))
            for package in ("jobs", "contract")
            for p in [*(ROOT / package).rglob("*.py"), *(ROOT / package).rglob("*.json")]
            if "__pycache__" not in p.parts
        )
        assert shipped == expected


def test_settings_fit_in_the_lambda_environment(launcher_template):
    """Lambda caps a function's environment at 4 KB; estimate the deployed size with every token at 70 chars."""

    def deployed(value) -> str:
        if isinstance(value, str):
            return value
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(deployed(p) for p in parts)
        return "x" * 70  # a Ref, GetAtt, FindInMap or cross-stack output: an ARN, id or image URI

    function = next(iter(resources(launcher_template, "AWS::Lambda::Function").values()))
    document = deployed(function["Properties"]["Environment"]["Variables"]["PLATFORM_SETTINGS"])
    assert document.startswith('{"name_prefix":"mltrain"')
    assert 500 < len(document) < 3500, len(document)


LISTS = ("jobs.handler.prepare", "jobs.handler.summarize", "jobs.handler.reap")
# Who prices: the run's record at its end, each launch for its MLflow run's cost.
PRICES = ("jobs.handler.prepare", "jobs.handler.relaunch", "jobs.handler.summarize")


def test_decide_may_describe_only_the_platforms_jobs(launcher_template):
    # prepare describes a resumed run's earlier jobs; decide looks up a job a failed launch may have left running;
    # summarize stops it when the run ends, and the reaper when an execution ends any other way. Listing (prepare,
    # summarize and the reaper) cannot be scoped: checked apart.
    granted = {
        "jobs.handler.prepare": ["sagemaker:DescribeTrainingJob"],
        "jobs.handler.decide": ["sagemaker:DescribeTrainingJob"],
        "jobs.handler.relaunch": [],  # renders the next attempt's request: no SageMaker call
        "jobs.handler.summarize": ["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
        "jobs.handler.reap": ["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
    }
    functions = resources(launcher_template, "AWS::Lambda::Function")
    for function in functions.values():
        role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
        statements = policy_statements(launcher_template, role_id)
        handler = function["Properties"]["Handler"]
        listing = [a for s in statements if s["Resource"] == "*" for a in actions(s) if a.startswith("sagemaker:")]
        assert listing == (["sagemaker:ListTrainingJobs"] if handler in LISTS else [])
        pricing = [a for s in statements if s["Resource"] == "*" for a in actions(s) if a.startswith("pricing:")]
        assert pricing == (["pricing:GetProducts"] if handler in PRICES else [])
        sagemaker = [s for s in statements
                     if s["Resource"] != "*" and any(a.startswith("sagemaker:") for a in actions(s))]
        expected = granted[handler]
        assert sorted(a for s in sagemaker for a in actions(s)) == expected
        for statement in sagemaker:
            assert statement["Resource"] == TRAINING_JOB_ARN
        for statement in statements:
            if statement["Resource"] == "*":
                assert set(actions(statement)) <= UNSCOPABLE, statement
        # No AWSLambdaBasicExecutionRole: each role's permissions are written out.
        assert "ManagedPolicyArns" not in launcher_template["Resources"][role_id]["Properties"]


def test_notifications_are_encrypted_and_tls_only(launcher_template):
    topic = only(launcher_template, "AWS::SNS::Topic")["Properties"]
    assert "KmsMasterKeyId" in topic
    policy = only(launcher_template, "AWS::SNS::TopicPolicy")["Properties"]["PolicyDocument"]["Statement"]
    assert any(
        s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in policy
    )
    # cdk.json leaves notification_email null: no subscription until someone sets one.
    assert resources(launcher_template, "AWS::SNS::Subscription") == {}


def test_state_machine_arn_is_published(launcher_template):
    machine_id = next(iter(resources(launcher_template, "AWS::StepFunctions::StateMachine")))
    (parameter,) = resources(launcher_template, "AWS::SSM::Parameter").values()
    assert parameter["Properties"]["Name"] == "/mltrain/state-machine-arn"
    assert parameter["Properties"]["Value"] == {"Ref": machine_id}
    assert launcher_template["Outputs"]["StateMachineArn"]["Value"] == {"Ref": machine_id}


def test_alarms_notify_the_topic(launcher_template):
    topic_ref = {"Ref": next(iter(resources(launcher_template, "AWS::SNS::Topic")))}
    alarms = {
        a["Properties"]["AlarmName"]: a["Properties"]
        for a in resources(launcher_template, "AWS::CloudWatch::Alarm").values()
    }
    assert set(alarms) == {"mltrain-job-launcher-failed-executions", "mltrain-training-low-gpu-utilization",
                           "mltrain-training-checkpoint-overdue", "mltrain-job-launcher-reap-failed"}
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == [topic_ref] and alarm["OKActions"] == [topic_ref]
        assert alarm["TreatMissingData"] == "notBreaching"

    failed = alarms["mltrain-job-launcher-failed-executions"]
    assert failed["MetricName"] == "ExecutionsFailed" and failed["Namespace"] == "AWS/States"
    assert failed["Threshold"] == 1 and failed["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"

    gpu = alarms["mltrain-training-low-gpu-utilization"]
    (query,) = gpu["Metrics"]
    # The platform's own namespace, which only its job role writes; SageMaker's shared one is never read by an alarm.
    assert 'FROM SCHEMA("TrainingPlatform/mltrain", RunId, Host)' in query["Expression"]
    assert "AVG(gpu_utilization)" in query["Expression"] and "/aws/sagemaker" not in query["Expression"]
    # The job averages a host's GPUs: the threshold is the percentage itself, for hosts of any GPU count.
    assert gpu["Threshold"] == 80 and gpu["ComparisonOperator"] == "LessThanThreshold"
    assert gpu["EvaluationPeriods"] * query["Period"] == 30 * 60


def test_dashboard_shows_executions_and_gpu_utilization(launcher_template):
    [body] = [json.dumps(d["Properties"]["DashboardBody"])
              for d in resources(launcher_template, "AWS::CloudWatch::Dashboard").values()
              if d["Properties"]["DashboardName"] == "mltrain-training"]
    for expected in (
        "ExecutionsStarted",
        "ExecutionsSucceeded",
        "ExecutionsFailed",
        "gpu_utilization",
        "tokens_per_sec",
        "slowest_rank_ratio",  # stragglers (training.resilience.stragglers)
        "startup_s", "train_s", "checkpoint_s", "eval_s",  # where each attempt's time went (jobs.outcome.run_record)
    ):
        assert expected in body, expected


def test_every_acknowledgement_names_a_resource_and_a_reason(cdk_out: Path):
    """cdk-nag findings acknowledged in the launcher stack: on one construct each, with a reason.

    Read from the assembly's metadata (the validation report lists only the first stack's acknowledgements).
    """
    documents = [json.loads(f.read_text()) for f in cdk_out.glob("*.metadata.json")]
    (metadata,) = [m for m in documents if any("/JobLauncher/" in path for path in m)]
    acknowledged = {
        (path, rule): reason
        for path, entries in metadata.items()
        for e in entries
        if e["type"] == "aws:cdk:acknowledged-rules"
        for rule, reason in e["data"].items()
    }
    assert acknowledged
    job_prefix = "arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:training-job/mltrain-*"
    # The engineers' managed policy: the launcher's executions, the training log group, the platform's parameters.
    launcher_executions = "arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:mltrain-job-launcher:*"
    engineers = {
        job_prefix,
        launcher_executions,
        "arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:/aws/sagemaker/TrainingJobs:*",
        # GetLogEvents on the streams of the launcher's own jobs (<job name>/algo-N-...).
        "arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:log-group:/aws/sagemaker/TrainingJobs:log-stream:"
        "mltrain-*",
        "arn:<AWS::Partition>:ssm:<AWS::Region>:<AWS::AccountId>:parameter/mltrain/*",
    }
    for (path, rule), reason in acknowledged.items():
        assert "/JobLauncher/" in path, (path, rule)
        assert len(reason) >= 40, (rule, reason)
        if "IAM5" in rule:
            # One finding at a time; wildcard resources only for unscopable actions, the platform's job-name
            # prefix, and the versions (<arn>:*) of the launcher's own functions.
            finding = re.fullmatch(r".*AwsSolutions-IAM5\[(Action|Resource)::(.+)\]", rule)
            assert finding, rule
            kind, value = finding.groups()
            if kind == "Resource" and "/EngineersPolicy" in path:
                assert value in engineers, rule
            elif kind == "Resource" and path.endswith(("/PrepareRole", "/DecideRole", "/ReapRole")) and \
                    "execution:" in value:
                # Prepare (DescribeExecution: may the run be taken over?), Decide (GetExecutionHistory: does its
                # history near the limit?) and the reaper (which run did it drive?) read the launcher's own executions.
                assert value == launcher_executions, rule
            elif kind == "Resource":
                assert value in ("*", job_prefix) or re.fullmatch(
                    r"<JobLauncher\w+Function\w+\.Arn>:\*", value
                ), rule
            else:
                assert value == "kms:GenerateDataKey*", rule


def test_engineers_policy_is_published_and_holds_only_the_trainctl_actions(launcher_template):
    policies = resources(launcher_template, "AWS::IAM::ManagedPolicy")
    (policy_id,) = policies
    props = policies[policy_id]["Properties"]
    assert props["ManagedPolicyName"] == "mltrain-engineers"
    assert launcher_template["Outputs"]["EngineersPolicyArn"]["Value"] == {"Ref": policy_id}
    granted = {a for s in props["PolicyDocument"]["Statement"] for a in actions(s)}
    assert granted == {
        "states:StartExecution", "states:ListExecutions", "states:DescribeExecution",
        "states:GetExecutionHistory", "states:StopExecution", "sagemaker:DescribeTrainingJob",
        "sagemaker:StopTrainingJob", "logs:DescribeLogStreams", "logs:GetLogEvents", "ssm:GetParameter",
        "dynamodb:GetItem", "dynamodb:Scan", "kms:Decrypt", "kms:DescribeKey",
    }
    assert all(s["Resource"] != "*" for s in props["PolicyDocument"]["Statement"])


def test_an_ended_execution_reaches_the_reaper_and_a_reaper_that_gives_up_is_told(launcher_template):
    """The execution-status rule: every end of this state machine's executions, to the reaper function; the reaper's
    failed events kept in its encrypted dead-letter queue, whose first message raises an alarm on the team's
    topic."""
    from jobs.handler import ENDED_EXECUTION

    (rule,) = [r["Properties"] for r in resources(launcher_template, "AWS::Events::Rule").values()
               if r["Properties"]["EventPattern"].get("source") == ["aws.states"]]
    pattern = rule["EventPattern"]
    assert pattern["detail-type"] == ["Step Functions Execution Status Change"]
    assert sorted(pattern["detail"]["status"]) == sorted(ENDED_EXECUTION)
    (machine,) = resources(launcher_template, "AWS::StepFunctions::StateMachine")
    assert pattern["detail"]["stateMachineArn"] == [{"Ref": machine}]
    (target,) = rule["Targets"]
    functions = resources(launcher_template, "AWS::Lambda::Function")
    reaper = target["Arn"]["Fn::GetAtt"][0]
    assert functions[reaper]["Properties"]["Handler"] == "jobs.handler.reap"
    queue = functions[reaper]["Properties"]["DeadLetterConfig"]["TargetArn"]["Fn::GetAtt"][0]
    assert "KmsMasterKeyId" in launcher_template["Resources"][queue]["Properties"]
    (alarm,) = [a["Properties"] for a in resources(launcher_template, "AWS::CloudWatch::Alarm").values()
                if a["Properties"].get("AlarmName") == "mltrain-job-launcher-reap-failed"]
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible" and alarm["Threshold"] == 1
    assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue, "QueueName"]}}]
    (topic,) = resources(launcher_template, "AWS::SNS::Topic")
    assert alarm["AlarmActions"] == [{"Ref": topic}]
