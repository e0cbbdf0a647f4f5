"""Teams are kept apart by IAM, proven on the synthesized policies with a real IAM evaluator (docs/SECURITY.md).

One in-process synth of a two-team config (teams a and b, egress through endpoints only) and the session's default
synth; every cell of who x action x resource goes through @cloud-copilot/iam-simulate in one node process.
"""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import app as cdk_app
from contract.container import MLFLOW_RUN_ACTIONS
from contract.errors import RequestInvalid
from jobs.naming import metrics_namespace
from jobs.platform import PlatformSettings
from jobs.registry import table_name
from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from jobs.request.platform_rules import validate_for_platform
from tests.conftest import ROOT
from tests.infra.iam_eval import ACCOUNT, REGION, Matrix, Templates

ENGINEER_A = f"arn:aws:iam::{ACCOUNT}:role/team-a-engineers"
TEAM_A_IMAGES = "111122223333.dkr.ecr.us-east-1.amazonaws.com/team-a"
TEAMS = [{"name": "a", "engineer_roles": [ENGINEER_A], "allowed_image_repositories": [f"{TEAM_A_IMAGES}/"],
          "monthly_budget_usd": 5000},
         {"name": "b", "dataset_prefix": "teams/b/"}]
PLATFORM, LAUNCHER = "mltrain-platform", "mltrain-launcher"
# A SageMaker managed MLflow server the teams' jobs log to, and another one in the account.
MLFLOW = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:mlflow-tracking-server/shared"
OTHER_MLFLOW = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:mlflow-tracking-server/finance"
SAGEMAKER = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}"
STATES = f"arn:aws:states:{REGION}:{ACCOUNT}"
LOGS = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs"
SSM = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter"
DENIED = "denied"


def synth_teams(tmp_path) -> dict[str, dict]:
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    context.update(fsx_enabled=False, nat_gateways=0, egress="endpoints", teams=TEAMS, mlflow_tracking_server=MLFLOW)
    assembly = cdk_app.build_app(cdk.App(context=context, outdir=str(tmp_path))).synth()
    return {s.stack_name: s.template for s in assembly.stacks}


class Team:
    """One team's principals and resources as the templates resolve them."""

    def __init__(self, t: Templates, construct: str, prefix: str, dataset_prefix: str) -> None:
        self.prefix, self.dataset_prefix, self.construct = prefix, dataset_prefix, construct
        self.execution_role = t.find(PLATFORM, "AWS::IAM::Role", f"{construct}ExecutionRole")
        self.execution_arn = t.role_arn(PLATFORM, self.execution_role)
        self.execution_policies = t.role_policies(PLATFORM, self.execution_role)
        machine_role = t.find(LAUNCHER, "AWS::IAM::Role", f"{construct}JobLauncherStateMachineRole")
        self.machine_arn = t.role_arn(LAUNCHER, machine_role)
        self.machine_policies = t.role_policies(LAUNCHER, machine_role)
        policy = t.find(LAUNCHER, "AWS::IAM::ManagedPolicy", f"{construct}JobLauncherEngineersPolicy")
        self.engineer_policies = [t.managed_policy(LAUNCHER, policy)]
        self.engineer_roles = t.templates[LAUNCHER]["Resources"][policy]["Properties"].get("Roles", [])
        self.state_machine = f"{STATES}:stateMachine:{prefix}-job-launcher"
        # The launcher's functions (Prepare, Decide, Summarize, the reaper): each writes the team's run registry.
        self.functions = {
            name: (t.role_arn(LAUNCHER, role), t.role_policies(LAUNCHER, role))
            for name in ("Prepare", "Decide", "Relaunch", "Summarize", "Reap")
            for role in [t.find(LAUNCHER, "AWS::IAM::Role", f"{construct}JobLauncher{name}Role")]}
        self.registry = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table_name(prefix)}"
        # The team's own checkpoint and output buckets (team_keys, on by default with teams) and the key that
        # encrypts them; the default team of a platform without teams shares the platform's.
        own = f"{construct}Checkpoints" if construct else "Checkpoints"
        self.checkpoints = bucket(t, own)
        self.outputs = bucket(t, own.replace("Checkpoints", "Outputs"))
        # The tags its execution role carries, as IAM sees them on its requests (aws:PrincipalTag/...).
        tags = t.templates[PLATFORM]["Resources"][self.execution_role]["Properties"].get("Tags", [])
        self.principal_tags = {f"aws:PrincipalTag/{tag['Key']}": tag["Value"] for tag in tags}

    def settings(self, t: Templates) -> dict:
        """The team's platform settings document, as the platform stack publishes it to its launcher."""
        return json.loads(t.resolve(t.templates[PLATFORM]["Outputs"][f"{self.construct}PlatformSettings"]["Value"],
                                    PLATFORM))

    def create_context(self, t: Templates, **changes) -> dict:
        """CreateTrainingJob's condition keys for a job the renderer makes for this team: its run-id tag, its
        subnets and security group, its cost tag; `changes` replace some."""
        settings = self.settings(t)
        context = {f"aws:RequestTag/{self.prefix}:run-id": "run-abc", "sagemaker:VpcSubnets": settings["subnet_ids"],
                   "sagemaker:VpcSecurityGroupIds": settings["security_group_ids"],
                   **{f"aws:RequestTag/{k}": v for k, v in settings.get("job_tags", {}).items()}}
        return {k: v for k, v in {**context, **changes}.items() if v is not None}

    def job(self, run: str = "run-abc") -> str:
        return f"{SAGEMAKER}:training-job/{self.prefix}-{run}-a1"

    def tag(self) -> dict[str, str]:
        return {f"aws:ResourceTag/{self.prefix}:run-id": "run-abc"}


def bucket(t: Templates, name: str) -> str:
    return t.resolve({"Ref": t.find(PLATFORM, "AWS::S3::Bucket", f"{name}Bucket")}, PLATFORM)


def add_cells(m: Matrix, t: Templates, own: Team, other: Team, who: str) -> None:
    """Team `own`'s engineer, execution role and state machine against `own`'s resources (allowed) and `other`'s
    (denied)."""
    datasets = bucket(t, "Datasets")
    for target, expect in ((own, "Allowed"), (other, DENIED)):
        checkpoints, outputs = target.checkpoints, target.outputs
        side = "own" if target is own else "other"
        engineer = dict(principal=f"arn:aws:iam::{ACCOUNT}:role/{who}-engineer", policies=own.engineer_policies)
        execution = f"{STATES}:execution:{target.prefix}-job-launcher:run-1"
        cells = [
            ("start", "states:StartExecution", target.state_machine, {}),
            ("describe-execution", "states:DescribeExecution", execution, {}),
            ("history", "states:GetExecutionHistory", execution, {}),
            ("stop-execution", "states:StopExecution", execution, {}),
            ("describe-job", "sagemaker:DescribeTrainingJob", target.job(), target.tag()),
            ("stop-job", "sagemaker:StopTrainingJob", target.job(), target.tag()),
            ("logs", "logs:GetLogEvents", f"{LOGS}:log-stream:{target.prefix}-run-abc-a1/algo-1", {}),
            ("settings", "ssm:GetParameter", f"{SSM}/{target.prefix}/platform-settings", {}),
            ("reads run registry", "dynamodb:GetItem", target.registry, {}),
            ("scans run registry", "dynamodb:Scan", target.registry, {}),
        ]
        for cell, action, resource, context in cells:
            m.add(f"{who} engineer {cell} {side}", **engineer, action=action, resource=resource, context=context,
                  expect=expect)
        role = dict(principal=own.execution_arn, policies=own.execution_policies)
        run = f"{target.prefix}/run-abc"
        for name, b in (("checkpoints", checkpoints), ("outputs", outputs)):
            for action in ("s3:GetObject", "s3:PutObject", "s3:DeleteObject"):
                m.add(f"{who} job {action} {name} {side}", **role, action=action,
                      resource=f"arn:aws:s3:::{b}/{run}/checkpoints/step-1/model.pt", expect=expect)
            m.add(f"{who} job list {name} {side}", **role, action="s3:ListBucket", resource=f"arn:aws:s3:::{b}",
                  context={"s3:prefix": f"{run}/"}, expect=expect)
        # A job writes only its own team's log streams: lines in a stream named like another team's job would be
        # read by that team's engineers, `trainctl logs` and the failure classifier.
        stream = f"{LOGS}:log-stream:{target.prefix}-run-abc-a1/algo-1-1764300000"
        for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
            m.add(f"{who} job {action} {side}", **role, action=action, resource=stream, expect=expect)
        # A job sends metrics only to its own team's namespace, the one its team's alarms and dashboard read.
        m.add(f"{who} job puts metrics in the {side} team's namespace", **role, action="cloudwatch:PutMetricData",
              resource="*", context={"cloudwatch:namespace": metrics_namespace(target.prefix)}, expect=expect)
        m.add(f"{who} job read dataset {side}", **role, action="s3:GetObject",
              resource=f"arn:aws:s3:::{datasets}/{target.dataset_prefix}train/part-0.parquet", expect=expect)
        m.add(f"{who} job list dataset {side}", **role, action="s3:ListBucket", resource=f"arn:aws:s3:::{datasets}",
              context={"s3:prefix": f"{target.dataset_prefix}train/"}, expect=expect)
        machine = dict(principal=own.machine_arn, policies=own.machine_policies)
        m.add(f"{who} launcher passes role {side}", **machine, action="iam:PassRole", resource=target.execution_arn,
              context={"iam:PassedToService": "sagemaker.amazonaws.com"}, expect=expect)
        m.add(f"{who} launcher creates job {side}", **machine, action="sagemaker:CreateTrainingJob",
              resource=target.job(), context=target.create_context(t), expect=expect)
        if target is other:  # its own job, but in another team's network or under another team's cost tag
            theirs = other.settings(t)
            for what, changes in (
                    ("with the other team's security group",
                     {"sagemaker:VpcSecurityGroupIds": theirs["security_group_ids"]}),
                    ("with no VpcConfig", {"sagemaker:VpcSubnets": None, "sagemaker:VpcSecurityGroupIds": None}),
                    ("in a subnet outside the training subnets", {"sagemaker:VpcSubnets": ["subnet-0elsewhere"]}),
                    ("under the other team's cost tag",
                     {f"aws:RequestTag/{k}": v for k, v in theirs["job_tags"].items()})):
                m.add(f"{who} launcher creates own job {what}", **machine, action="sagemaker:CreateTrainingJob",
                      resource=own.job(), context=own.create_context(t, **changes), expect=DENIED)
            for what, tags, result in (("the other team's cost tag", theirs["job_tags"], DENIED),
                                       ("its own cost tag", own.settings(t)["job_tags"], "Allowed"),
                                       ("a tag of the request's", {"project": "x"}, "Allowed")):
                m.add(f"{who} launcher tags own job with {what}", **machine, action="sagemaker:AddTags",
                      resource=own.job(), context={f"aws:RequestTag/{k}": v for k, v in tags.items()},
                      expect=result)
        m.add(f"{who} launcher describes job {side}", **machine, action="sagemaker:DescribeTrainingJob",
              resource=target.job(), context=target.tag(), expect=expect)
        # A run nearing the history limit goes on in a new execution of its own launcher, never another team's.
        m.add(f"{who} launcher continues a run in a new execution {side}", **machine, action="states:StartExecution",
              resource=target.state_machine, expect=expect)
        decide_arn, decide_policies = own.functions["Decide"]
        m.add(f"{who} Decide counts an execution's history {side}", principal=decide_arn, policies=decide_policies,
              action="states:GetExecutionHistory", resource=execution, expect=expect)
        for name, (arn, policies) in own.functions.items():
            for action in ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"):
                m.add(f"{who} {name} {action} run registry {side}", principal=arn, policies=policies, action=action,
                      resource=target.registry, expect=expect)
            m.add(f"{who} {name} deletes from run registry {side}", principal=arn, policies=policies,
                  action="dynamodb:DeleteItem", resource=target.registry, expect=DENIED)


def add_outside_cells(m: Matrix, t: Templates, own: Team, who: str) -> None:
    """What no team reaches: the whole log group, other CDK assets, a job named like its own without its tag, the
    jobs of another platform whose prefix starts the same, listing a bucket without a prefix."""
    engineer = dict(principal=f"arn:aws:iam::{ACCOUNT}:role/{who}-engineer", policies=own.engineer_policies)
    role = dict(principal=own.execution_arn, policies=own.execution_policies)
    machine = dict(principal=own.machine_arn, policies=own.machine_policies)
    assets = f"cdk-hnb659fds-assets-{ACCOUNT}-{REGION}"
    untagged = {"aws:ResourceTag/mltrain:run-id": "x"}
    m.add(f"{who} engineer filters the whole log group", **engineer, action="logs:FilterLogEvents",
          resource=f"{LOGS}:*", expect=DENIED)
    for action in ("dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"):  # only the launcher writes it
        m.add(f"{who} engineer {action} own run registry", **engineer, action=action, resource=own.registry,
              expect=DENIED)
    m.add(f"{who} engineer describes own-named job without its tag", **engineer,
          action="sagemaker:DescribeTrainingJob", resource=own.job(), context=untagged, expect=DENIED)
    forged = f"{SAGEMAKER}:training-job/mltrain--b-run-abc-a1"
    m.add(f"{who} engineer stops another team's job that carries its tag key", **engineer,
          action="sagemaker:StopTrainingJob", resource=forged, context=own.tag(), expect=DENIED)
    for other in ("mltrain-dev-run-abc-a1", "mltrain-run-abc-a1", "mltrain--ab-run-abc-a1"):
        prefix = other.rsplit("-run-abc-a1", 1)[0]
        tag = {f"aws:ResourceTag/{prefix}:run-id": "x"}
        m.add(f"{who} engineer stops {other}", **engineer, action="sagemaker:StopTrainingJob",
              resource=f"{SAGEMAKER}:training-job/{other}", context=tag, expect=DENIED)
        m.add(f"{who} launcher creates {other}", **machine, action="sagemaker:CreateTrainingJob",
              resource=f"{SAGEMAKER}:training-job/{other}", context={f"aws:RequestTag/{prefix}:run-id": "x"},
              expect=DENIED)
    for other in ("mltrain--ab-run-abc-a1", "mltrain-run-abc-a1", "mltrain-dev-run-abc-a1"):  # prefixes alike
        m.add(f"{who} job writes the log stream of {other}", **role, action="logs:PutLogEvents",
              resource=f"{LOGS}:log-stream:{other}/algo-1-1764300000", expect=DENIED)
    # Metrics: SageMaker's namespace (SageMaker publishes the job's metrics with its role: every team's, read by no
    # alarm), its own team's; never the platform's nor a team's whose prefix starts the same.
    for namespace, expect in (("/aws/sagemaker/TrainingJobs", "Allowed"), (metrics_namespace("mltrain"), DENIED),
                              (metrics_namespace("mltrain--ab"), DENIED), ("AWS/SageMaker", DENIED)):
        m.add(f"{who} job puts metrics in {namespace}", **role, action="cloudwatch:PutMetricData", resource="*",
              context={"cloudwatch:namespace": namespace}, expect=expect)
    # Network interfaces: only in the training subnets, and SageMaker's attach permission only.
    settings = own.settings(t)
    subnet = f"arn:aws:ec2:{REGION}:{ACCOUNT}:subnet/{settings['subnet_ids'][0]}"
    vpc = next(t.resolve(r["Properties"]["VpcId"], PLATFORM) for r in t.templates[PLATFORM]["Resources"].values()
               if r["Type"] == "AWS::EC2::Subnet")
    eni = f"arn:aws:ec2:{REGION}:{ACCOUNT}:network-interface/eni-0123456789abcdef0"
    where = {"ec2:Vpc": f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{vpc}", "ec2:Subnet": subnet}
    elsewhere = {**where, "ec2:Subnet": f"arn:aws:ec2:{REGION}:{ACCOUNT}:subnet/subnet-0elsewhere"}
    for what, action, context, expect in (
            ("deletes a training interface", "ec2:DeleteNetworkInterface", where, "Allowed"),
            ("deletes an interface outside the training subnets", "ec2:DeleteNetworkInterface", elsewhere, DENIED),
            ("lets SageMaker attach a training interface", "ec2:CreateNetworkInterfacePermission",
             {**where, "ec2:Permission": "INSTANCE-ATTACH"}, "Allowed"),
            ("lets another account associate an address", "ec2:CreateNetworkInterfacePermission",
             {**where, "ec2:Permission": "EIP-ASSOCIATE"}, DENIED)):
        m.add(f"{who} job {what}", **role, action=action, resource=eni, context=context, expect=expect)
    m.add(f"{who} job reads another CDK asset", **role, action="s3:GetObject",
          resource=f"arn:aws:s3:::{assets}/{'0' * 64}.zip", expect=DENIED)
    m.add(f"{who} job lists the CDK assets", **role, action="s3:ListBucket", resource=f"arn:aws:s3:::{assets}",
          expect=DENIED)
    m.add(f"{who} job lists checkpoints without a prefix", **role, action="s3:ListBucket",
          resource=f"arn:aws:s3:::{own.checkpoints}", expect=DENIED)


@pytest.fixture(scope="module")
def teams_synth(tmp_path_factory) -> Templates:
    return Templates(synth_teams(tmp_path_factory.mktemp("teams")))


@pytest.fixture(scope="module")
def matrix(teams_synth, templates) -> tuple[Matrix, dict[str, str]]:
    t = teams_synth
    a = Team(t, "Teama", "mltrain--a", "datasets/a/")
    b = Team(t, "Teamb", "mltrain--b", "teams/b/")
    m = Matrix()
    add_cells(m, t, a, b, "a")
    add_cells(m, t, b, a, "b")
    add_outside_cells(m, t, a, "a")
    add_key_cells(m, t, a)
    add_data_key_cells(m, t, a, b)
    add_endpoint_cells(m, t, a)
    # The source bundle: readable by every team's jobs, and nothing else of the assets bucket.
    source = t.resolve(t.templates[PLATFORM]["Outputs"]["TeamaTrainingSourceUri"]["Value"], PLATFORM)
    bucket_name, key = source.removeprefix("s3://").split("/", 1)
    for team in (a, b):
        m.add(f"{team.prefix} job reads the source bundle", principal=team.execution_arn,
              policies=team.execution_policies, action="s3:GetObject", resource=f"arn:aws:s3:::{bucket_name}/{key}",
              expect="Allowed")
    # Team a's own image repositories: its jobs pull them, team b's do not.
    images = "arn:aws:ecr:us-east-1:111122223333:repository/team-a/trainer"
    for team, expect in ((a, "Allowed"), (b, DENIED)):
        m.add(f"{team.prefix} job pulls team a's image", principal=team.execution_arn,
              policies=team.execution_policies, action="ecr:BatchGetImage", resource=images, expect=expect)
    # MLflow: every team's jobs log runs on the configured server (each action the package calls), never on another
    # server, and never delete or read models there; without a server configured, nothing of MLflow.
    for team in (a, b):
        for action in sorted(set(MLFLOW_RUN_ACTIONS.values())):
            m.add(f"{team.prefix} job {action} on the platform's MLflow", principal=team.execution_arn,
                  policies=team.execution_policies, action=action, resource=MLFLOW, expect="Allowed")
        for action, server in (("sagemaker-mlflow:LogBatch", OTHER_MLFLOW), ("sagemaker-mlflow:DeleteRun", MLFLOW),
                               ("sagemaker-mlflow:DeleteExperiment", MLFLOW), ("sagemaker-mlflow:GetModelVersion", MLFLOW)):
            m.add(f"{team.prefix} job {action} on {server.rsplit('/', 1)[1]}", principal=team.execution_arn,
                  policies=team.execution_policies, action=action, resource=server, expect=DENIED)
    # The default config (no teams): its own jobs by name and tag, never those of a platform named mltrain-dev.
    default = Templates(templates)
    d = Team(default, "", "mltrain", "datasets/")
    for target, tag_prefix, expect in (("mltrain-run-abc-a1", "mltrain", "Allowed"),
                                       ("mltrain-dev-run-abc-a1", "mltrain-dev", DENIED)):
        for action in ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"):
            m.add(f"default engineer {action} {target}", principal=f"arn:aws:iam::{ACCOUNT}:role/eng",
                  policies=d.engineer_policies, action=action, resource=f"{SAGEMAKER}:training-job/{target}",
                  context={f"aws:ResourceTag/{tag_prefix}:run-id": "x"}, expect=expect)
        m.add(f"default launcher describes {target}", principal=d.machine_arn, policies=d.machine_policies,
              action="sagemaker:DescribeTrainingJob", resource=f"{SAGEMAKER}:training-job/{target}",
              context={f"aws:ResourceTag/{tag_prefix}:run-id": "x"}, expect=expect)
    m.add("default job LogBatch without an MLflow server configured", principal=d.execution_arn,
          policies=d.execution_policies, action="sagemaker-mlflow:LogBatch", resource=MLFLOW, expect=DENIED)
    return m, m.evaluate()


def wrong_cells(matrix: tuple[Matrix, dict[str, str]], group: str) -> dict[str, str | None]:
    """The cells of `group` (a name prefix) whose result is not what they expect, or not a result at all."""
    m, results = matrix
    return {name: results.get(name) for name, expect in m.expected.items() if name.startswith(group)
            and ((results.get(name) == "Allowed") != (expect == "Allowed")
                 or not results.get(name, "").endswith(("Allowed", "Denied")))}


def test_every_cell_of_the_matrix_is_as_expected(matrix):
    assert not wrong_cells(matrix, ""), json.dumps(wrong_cells(matrix, ""), indent=1)
    m, _ = matrix
    assert sum(e == "Allowed" for e in m.expected.values()) >= 40
    assert sum(e == DENIED for e in m.expected.values()) >= 50


def test_each_teams_alarms_and_dashboard_read_only_its_own_namespace(teams_synth):
    # What a team's monitoring reads is what only its own job role may write (the matrix's metrics cells): no other
    # team's job can raise, mask or show up in it. The platform team's all-jobs dashboard alone reads SageMaker's.
    launcher = teams_synth.templates[LAUNCHER]["Resources"]
    namespaces = {"a": metrics_namespace("mltrain--a"), "b": metrics_namespace("mltrain--b")}
    read: dict[str, str] = {}
    for resource in launcher.values():
        props = resource["Properties"] if resource["Type"] in ("AWS::CloudWatch::Alarm",
                                                              "AWS::CloudWatch::Dashboard") else None
        name = props and (props.get("AlarmName") or props.get("DashboardName"))
        if name and "training" in name:
            read[name] = json.dumps(props)
    assert {n for n in read if "-training-all-jobs" in n} == {"mltrain-training-all-jobs"}
    for name, text in read.items():
        team = next((t for t in namespaces if name.startswith(f"mltrain--{t}-")), None)
        if team is None:
            assert not any(ns in text for ns in namespaces.values()) and "/aws/sagemaker/TrainingJobs" in text, name
            continue
        other = namespaces["b" if team == "a" else "a"]
        assert namespaces[team] in text and other not in text and "/aws/sagemaker" not in text, name
    assert {n for n in read if n.startswith("mltrain--a-")} == {
        "mltrain--a-training", "mltrain--a-training-low-gpu-utilization", "mltrain--a-training-checkpoint-overdue"}


def test_team_engineers_policy_is_attached_to_the_declared_roles(teams_synth):
    a = Team(teams_synth, "Teama", "mltrain--a", "datasets/a/")
    b = Team(teams_synth, "Teamb", "mltrain--b", "teams/b/")
    assert a.engineer_roles == [ENGINEER_A.rsplit("/", 1)[1]]
    assert b.engineer_roles == []  # the platform team attaches the published policy


def add_key_cells(m: Matrix, t: Templates, a: Team) -> None:
    """The key policy (a resource policy) with the caller's IAM policy: only the platform's roles use the key."""
    key = t.find(PLATFORM, "AWS::KMS::Key", "Key")
    policy = t.resource_policy(PLATFORM, key, "KeyPolicy")
    key_arn = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{key.lower()}"
    use = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*"}]}
    admin = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": "*"}]}
    for name, principal, policies, action, expect in (
            ("key: the execution role decrypts", a.execution_arn, [use], "kms:Decrypt", "Allowed"),
            ("key: a broad IAM grant elsewhere does not decrypt", f"arn:aws:iam::{ACCOUNT}:role/anything", [use],
             "kms:Decrypt", DENIED),
            ("key: an administrator still manages it", f"arn:aws:iam::{ACCOUNT}:role/admin", [admin],
             "kms:PutKeyPolicy", "Allowed"),
            ("key: an administrator cannot decrypt", f"arn:aws:iam::{ACCOUNT}:role/admin", [admin], "kms:Decrypt",
             DENIED)):
        m.add(name, principal=principal, policies=policies, action=action, resource=key_arn, resource_policy=policy,
              expect=expect)


def add_data_key_cells(m: Matrix, t: Templates, a: Team, b: Team) -> None:
    """Each team's own key (team_keys): its execution role uses it; another team's role, the platform's untagged
    roles and a broad IAM grant elsewhere do not, so another team's objects stay unreadable even where an S3
    permission mistake would let a role fetch them."""
    use = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": "*"}]}
    for owner in (a, b):
        key = t.find(PLATFORM, "AWS::KMS::Key", f"{owner.construct}DataKey")
        policy = t.resource_policy(PLATFORM, key, "KeyPolicy")
        key_arn = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{key.lower()}"
        other = b if owner is a else a
        prepare_arn, prepare_policies = owner.functions["Prepare"]
        for who, principal, policies, tags, expect in (
                ("its own execution role", owner.execution_arn, owner.execution_policies, owner.principal_tags,
                 "Allowed"),
                ("the other team's execution role", other.execution_arn, other.execution_policies,
                 other.principal_tags, DENIED),
                ("the other team's role granted kms:* by IAM", other.execution_arn, [use], other.principal_tags,
                 DENIED),
                ("its own launcher's Prepare (untagged)", prepare_arn, [use], {}, DENIED),
                ("a role elsewhere with its tag", f"arn:aws:iam::{ACCOUNT}:role/anything", [use],
                 owner.principal_tags, DENIED)):
            for action in ("kms:Decrypt", "kms:GenerateDataKey"):
                m.add(f"data key: {owner.prefix}'s, {who}, {action}", principal=principal, policies=policies,
                      action=action, resource=key_arn, resource_policy=policy, context=tags, expect=expect)


def add_endpoint_cells(m: Matrix, t: Templates, a: Team) -> None:
    """The S3 gateway endpoint's policy: the platform's buckets pass, any other bucket does not."""
    [s3] = [t.resolve(r["Properties"]["PolicyDocument"], PLATFORM) for r in t.templates[PLATFORM]["Resources"].values()
            if r["Type"] == "AWS::EC2::VPCEndpoint" and r["Properties"].get("VpcEndpointType") != "Interface"]
    anything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    for name, resource, expect in (
            ("endpoint: own bucket", f"arn:aws:s3:::{a.checkpoints}/mltrain--a/x", "Allowed"),
            ("endpoint: a bucket elsewhere", "arn:aws:s3:::attacker-bucket/x", DENIED)):
        m.add(name, principal=f"arn:aws:iam::{ACCOUNT}:role/job", policies=[anything], action="s3:PutObject",
              resource=resource, endpoint_policy=s3, expect=expect)


def test_the_key_lets_only_the_platform_roles_use_it(matrix):
    assert not wrong_cells(matrix, "key: ")
    assert any(name.startswith("key: ") for name in matrix[0].expected)


def test_each_teams_data_key_lets_only_its_own_jobs_decrypt(matrix, teams_synth):
    assert not wrong_cells(matrix, "data key: ")
    assert sum(name.startswith("data key: ") for name in matrix[0].expected) == 20
    # Its checkpoint and output buckets are encrypted with it by default (what SageMaker's checkpoint sync writes
    # with), and its jobs' outputs name it (OutputDataConfig.KmsKeyId, from the settings).
    resources = teams_synth.templates[PLATFORM]["Resources"]
    for team in ("Teama", "Teamb"):
        key = teams_synth.find(PLATFORM, "AWS::KMS::Key", f"{team}DataKey")
        for name in ("Checkpoints", "Outputs"):
            bucket_id = teams_synth.find(PLATFORM, "AWS::S3::Bucket", f"{team}{name}Bucket")
            [rule] = resources[bucket_id]["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"]
            assert rule["ServerSideEncryptionByDefault"]["KMSMasterKeyID"] == {"Fn::GetAtt": [key, "Arn"]}
        settings = json.dumps(teams_synth.templates[PLATFORM]["Outputs"][f"{team}PlatformSettings"]["Value"])
        assert key in settings.split("data_kms_key_arn", 1)[1][:200]
    # No shared checkpoint or output bucket is left when every team has its own.
    assert not [k for k, r in resources.items() if r["Type"] == "AWS::S3::Bucket"
                and k.startswith(("Checkpoints", "Outputs"))]


def test_endpoints_mode_limits_the_s3_gateway_endpoint_to_the_platform(matrix, teams_synth):
    assert not wrong_cells(matrix, "endpoint: ")
    interface = [r["Properties"] for r in teams_synth.templates[PLATFORM]["Resources"].values()
                 if r["Type"] == "AWS::EC2::VPCEndpoint" and r["Properties"].get("VpcEndpointType") == "Interface"]
    assert interface and all("aws:PrincipalAccount" in json.dumps(p["PolicyDocument"]) for p in interface)


def test_each_team_has_its_own_training_security_group(teams_synth):
    """A team's running jobs cannot open connections to another team's: each group admits only itself."""
    t = teams_synth
    resources = t.templates[PLATFORM]["Resources"]
    groups = {}
    for team in ("a", "b"):
        settings = json.loads(t.resolve(t.templates[PLATFORM]["Outputs"][f"Team{team}PlatformSettings"]["Value"],
                                        PLATFORM))
        [groups[team]] = settings["security_group_ids"]
        assert groups[team].startswith(f"NetworkTeam{team}TrainingSecurityGroup"), groups[team]
    assert groups["a"] != groups["b"]
    for key, r in resources.items():
        if r["Type"] == "AWS::EC2::SecurityGroupIngress":
            props = r["Properties"]
            target = t.resolve(props["GroupId"], PLATFORM)
            if target in groups.values():
                assert t.resolve(props["SourceSecurityGroupId"], PLATFORM) == target, key


# ---- a team's monthly budget: the cost allocation tag on its jobs, AWS Budgets on it, the topic told ----------

def of_type(template: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def test_only_the_team_with_a_budget_has_one_on_its_own_tag(teams_synth):
    templates = teams_synth.templates
    (budget,) = of_type(templates[LAUNCHER], "AWS::Budgets::Budget").values()
    data = budget["Properties"]["Budget"]
    assert data["BudgetLimit"] == {"Amount": 5000, "Unit": "USD"}
    assert (data["BudgetType"], data["TimeUnit"]) == ("COST", "MONTHLY")
    assert data["CostFilters"] == {"TagKeyValue": ["user:mltrain:team$a"]}
    topics = {k for k in of_type(templates[LAUNCHER], "AWS::SNS::Topic") if k.startswith("Teama")}
    (topic,) = topics
    notified = budget["Properties"]["NotificationsWithSubscribers"]
    assert [(n["Notification"]["NotificationType"], n["Notification"]["Threshold"]) for n in notified] == [
        ("ACTUAL", 80), ("FORECASTED", 100)]
    assert all(n["Subscribers"] == [{"SubscriptionType": "SNS", "Address": {"Ref": topic}}] for n in notified)
    # The tag the budget filters on is in team a's published settings (every job it renders carries it); b's has
    # its own value.
    params = {p["Properties"]["Name"]: json.dumps(p["Properties"]["Value"]).replace("\\", "")
              for p in of_type(templates[PLATFORM], "AWS::SSM::Parameter").values()}
    for team in ("a", "b"):
        assert f'"job_tags":{{"mltrain:team":"{team}"}}' in params[f"/mltrain--{team}/platform-settings"]


def test_the_team_topic_and_the_key_let_aws_budgets_publish_for_this_account_only(teams_synth):
    templates = teams_synth.templates
    policies = of_type(templates[LAUNCHER], "AWS::SNS::TopicPolicy").values()
    statements = [s for p in policies for s in p["Properties"]["PolicyDocument"]["Statement"]
                  if s.get("Principal") == {"Service": "budgets.amazonaws.com"}]
    (statement,) = statements
    assert statement["Action"] == "sns:Publish"
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    platform_key = teams_synth.find(PLATFORM, "AWS::KMS::Key", "Key")  # the teams' data keys serve no topic
    key = templates[PLATFORM]["Resources"][platform_key]
    (use,) = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if s.get("Sid") == "BudgetsPublish"]
    assert sorted(use["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey*"] and use["Condition"]


def test_without_a_budget_the_key_gives_aws_budgets_nothing(templates):
    """The default config (no teams, no budget): the session's CLI synth."""
    (platform,) = [t for name, t in templates.items() if name.endswith("platform")]
    (key,) = of_type(platform, "AWS::KMS::Key").values()
    assert "budgets.amazonaws.com" not in json.dumps(key["Properties"]["KeyPolicy"])


def test_every_job_of_the_team_carries_the_tag_and_no_request_can_take_it():
    doc = json.loads((ROOT / "examples" / "platform-settings.json").read_text())
    settings = PlatformSettings.from_dict({**doc, "name_prefix": "mltrain--a", "job_tags": {"mltrain:team": "a"}})
    request = parse_request({"name": "gpt", "dataset": f"s3://{settings.dataset_bucket}/{settings.dataset_prefix}x/",
                             "instance": {"type": settings.allowed_instance_types[0]}})
    create = render_create_training_job(request, settings, run_id="gpt-" + "a" * 16, attempt=1)
    assert {"Key": "mltrain:team", "Value": "a"} in create["Tags"]
    squatting = parse_request({**request.to_dict(), "tags": {"mltrain:team": "b"}})
    with pytest.raises(RequestInvalid) as refused:
        validate_for_platform(squatting, settings)
    assert any(p.path == "tags.mltrain:team" and "cost allocation" in p.message for p in refused.value.problems)
    # Any spelling a person would read as the platform's: case, full-width letters, a compatibility ligature. Each
    # is refused naming its field (one raised KeyError, retried as a transient fault, and no field named).
    for spelling in ("MLTRAIN:TEAM", "MlTrain:Team", "ｍltrain:team", "mltrain:TEAM"):
        with pytest.raises(RequestInvalid) as refused:
            validate_for_platform(parse_request({**request.to_dict(), "tags": {spelling: "b"}}), settings)
        assert [(p.path, "'mltrain:team'" in p.message) for p in refused.value.problems] == [
            (f"tags.{spelling}", True)], spelling
    for spelling in ("MLTRAIN--A:run-id", "ｍltrain--a:attempt", "mltrain--b:run-id", "MLTRAIN:cost-center"):
        with pytest.raises(RequestInvalid) as refused:
            validate_for_platform(parse_request({**request.to_dict(), "tags": {spelling: "b"}}), settings)
        assert [p.path for p in refused.value.problems] == [f"tags.{spelling}"], spelling


# ---- any request a team's launcher accepts, it may launch: the rendered CreateTrainingJob against its IAM --------

_TAG_TEXT = st.text(st.sampled_from("abcXYZ019 _.:/=+-@"), min_size=1, max_size=12)
_REQUESTS = st.fixed_dictionaries({
    "name": st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True),
    "tags": st.dictionaries(_TAG_TEXT, _TAG_TEXT, max_size=4),
    "spot": st.booleans(),
    "count": st.integers(1, 4),
    "type": st.sampled_from(["ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.g5.12xlarge", "ml.g6e.12xlarge"]),
})


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=st.lists(_REQUESTS, min_size=20, max_size=20))
def test_every_request_a_team_accepts_its_launcher_may_create_tag_and_pass_the_role_for(teams_synth, drawn):
    """Random requests on team a's platform: each one Prepare's rules refuse names a field; each one they accept,
    rendered, is a CreateTrainingJob (with its tags) and a PassRole that team a's state machine role may make, in
    the evaluator, with the condition keys the request carries (the run-id tag, the subnets, the security
    group, the cost tag, the request's own tags)."""
    t = teams_synth
    a = Team(t, "Teama", "mltrain--a", "datasets/a/")
    settings_a = PlatformSettings.from_dict(a.settings(t))
    machine = dict(principal=a.machine_arn, policies=a.machine_policies)
    m = Matrix()
    for i, fields in enumerate(drawn):
        document = {"name": fields["name"], "tags": fields["tags"], "spot": fields["spot"],
                    "dataset": f"s3://{settings_a.dataset_bucket}/{settings_a.dataset_prefix}c4/",
                    "instance": {"type": fields["type"], "count": fields["count"]}}
        try:
            request = parse_request(document)
            validate_for_platform(request, settings_a)
        except RequestInvalid as refused:
            assert refused.problems and all(p.path for p in refused.problems), (document, refused.problems)
            continue
        create = render_create_training_job(request, settings_a, run_id=f"{fields['name']}-{'0' * 16}", attempt=1)
        tags = {tag["Key"]: tag["Value"] for tag in create["Tags"]}
        context = {"sagemaker:VpcSubnets": create["VpcConfig"]["Subnets"],
                   "sagemaker:VpcSecurityGroupIds": create["VpcConfig"]["SecurityGroupIds"],
                   "aws:TagKeys": list(tags), **{f"aws:RequestTag/{k}": v for k, v in tags.items()}}
        job = f"{SAGEMAKER}:training-job/{create['TrainingJobName']}"
        for action in ("sagemaker:CreateTrainingJob", "sagemaker:AddTags"):
            m.add(f"{i} {action}", **machine, action=action, resource=job, context=context, expect="Allowed")
        m.add(f"{i} iam:PassRole", **machine, action="iam:PassRole", resource=create["RoleArn"],
              context={"iam:PassedToService": "sagemaker.amazonaws.com"}, expect="Allowed")
    assert m.requests, "every drawn request was refused: the generator no longer makes valid ones"
    results = m.evaluate()
    assert {name: results[name] for name in m.expected if results[name] != "Allowed"} == {}, drawn
