"""Static gates on the real templates: cfn-lint clean, cdk-nag (AwsSolutions, NIST 800-53 rev 5) clean with
every acknowledgement named and explained, and the same for the configurations people switch to."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

import app as cdk_app
from tests.conftest import ROOT

PACKS = {"AwsSolutions", "NIST.800.53.R5"}


def test_cfn_lint_finds_nothing_in_any_template(cdk_out, templates):
    files = sorted(str(p) for p in cdk_out.glob("*.template.json"))
    assert len(files) == len(templates) >= 2
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), "--config-file", str(ROOT / ".cfnlintrc.yaml"),
                             "--", *files], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_cfn_lint_ignores_only_what_is_explained():
    text = (ROOT / ".cfnlintrc.yaml").read_text()
    ignored = [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("- W") or
               line.strip().startswith("- E")]
    assert ignored == ["W3005"]
    assert "DependsOn" in text  # the reason is written next to it


def test_cdk_nag_packs_ran_and_passed(cdk_out):
    report = json.loads((cdk_out / "validation-report.json").read_text())
    plugins = {p["pluginName"]: p for p in report["pluginReports"]}
    assert set(plugins) >= PACKS
    for name in PACKS:
        assert plugins[name]["conclusion"] == "success", plugins[name]["violations"]
        assert plugins[name]["violations"] == []


def test_every_acknowledgement_names_its_finding_resource_and_reason(cdk_out):
    report = json.loads((cdk_out / "validation-report.json").read_text())
    acknowledged = [v for p in report["pluginReports"] if p["pluginName"] in PACKS
                    for v in p.get("suppressedViolations", [])]
    assert acknowledged
    for finding in acknowledged:
        rule = finding["ruleName"]
        assert finding["acknowledgedId"].endswith(rule), finding["acknowledgedId"]
        if "IAM5" in rule:  # wildcard findings are acknowledged one action or resource at a time
            assert "[" in rule, rule
        # Acknowledged on a construct inside a stack, never on a whole stack or the app.
        assert finding["acknowledgedAt"].count("/") >= 1, (rule, finding["acknowledgedAt"])
        assert len(finding["reason"]) >= 40, (rule, finding["reason"])


def test_cdk_nag_fails_an_insecure_resource(tmp_path):
    """The gate itself works: the same plugins stop a synth that has an unencrypted, non-TLS bucket."""
    app = cdk.App(outdir=str(tmp_path))
    from aws_cdk import aws_s3 as s3
    from cdk_nag import AwsSolutionsChecks
    s3.Bucket(cdk.Stack(app, "Insecure"), "Plain")
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks())
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()


def synth_variant(tmp_path, **overrides) -> dict[str, dict]:
    """Synthesize the app in-process with cdk.json's context plus overrides; nag findings raise."""
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    app = cdk_app.build_app(cdk.App(context={**context, **overrides}, outdir=str(tmp_path)))
    assembly = app.synth()
    return {s.stack_name: s.template for s in assembly.stacks}


def test_no_nat_uses_endpoints_and_imported_bucket_and_key_with_scratch_fsx(tmp_path):
    key_arn = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
    templates = synth_variant(tmp_path, nat_gateways=0, fsx_deployment_type="SCRATCH_2",
                              dataset_bucket_name="team-datasets", kms_key_arn=key_arn)
    platform = Template.from_json(templates["mltrain-platform"])
    platform.resource_count_is("AWS::EC2::NatGateway", 0)
    platform.resource_count_is("AWS::EC2::InternetGateway", 0)
    endpoints = [r["Properties"] for r in templates["mltrain-platform"]["Resources"].values()
                 if r["Type"] == "AWS::EC2::VPCEndpoint"]
    names = ["".join(p for p in e["ServiceName"]["Fn::Join"][1] if isinstance(p, str)) for e in endpoints]
    for service in (".sagemaker.api", ".ecr.api", ".ecr.dkr", ".logs", ".monitoring", ".sts", ".states",
                    ".secretsmanager", ".s3"):
        assert sum(n.endswith(service) for n in names) == 1, (service, names)
    assert sum(e.get("VpcEndpointType") == "Interface" for e in endpoints) == 8
    # Only this account's principals through the interface endpoints; only the platform's buckets through S3's.
    assert all("aws:PrincipalAccount" in json.dumps(e["PolicyDocument"]) for e in endpoints
               if e.get("VpcEndpointType") == "Interface")
    [s3_endpoint] = [e for e in endpoints if e.get("VpcEndpointType") != "Interface"]
    assert "starport-layer-bucket" in json.dumps(s3_endpoint["PolicyDocument"])
    platform.resource_count_is("AWS::KMS::Key", 0)
    platform.resource_count_is("AWS::S3::Bucket", 3)  # access logs, checkpoints, outputs
    platform.resource_count_is("AWS::FSx::DataRepositoryAssociation", 0)
    [fs] = [r["Properties"] for r in templates["mltrain-platform"]["Resources"].values()
            if r["Type"] == "AWS::FSx::FileSystem"]
    assert "KmsKeyId" not in fs  # SCRATCH_2 is always encrypted with an FSx-managed key
    platform.has_resource_properties("AWS::FSx::FileSystem", {
        "LustreConfiguration": {"DeploymentType": "SCRATCH_2", "DataCompressionType": "LZ4",
                                "ImportPath": "s3://team-datasets/datasets/",
                                "ExportPath": "s3://team-datasets/datasets/",
                                "AutoImportPolicy": "NEW_CHANGED_DELETED"}})


def test_no_fsx_three_azs_and_a_training_plan(tmp_path):
    plan = {"name": "p5-week", "arn": "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p5-week",
            "instance_type": "ml.p5.48xlarge", "instance_count": 4}
    templates = synth_variant(tmp_path, fsx_enabled=False, region="us-west-2", az_count=3, nat_gateways=3,
                              availability_zones=["us-west-2a", "us-west-2b", "us-west-2c"],
                              training_plans=[plan])
    platform = Template.from_json(templates["mltrain-platform"])
    platform.resource_count_is("AWS::FSx::FileSystem", 0)
    platform.resource_count_is("AWS::EC2::NatGateway", 3)
    outputs = templates["mltrain-platform"]["Outputs"]
    assert "FsxFileSystemId" not in outputs
    assert json.loads(outputs["TrainingPlans"]["Value"]) == {
        "p5-week": {"arn": plan["arn"], "instance_type": "ml.p5.48xlarge", "instance_count": 4}}
    zones = sorted(r["Properties"]["AvailabilityZone"] for r in templates["mltrain-platform"]["Resources"].values()
                   if r["Type"] == "AWS::EC2::Subnet"
                   and {"Key": "aws-cdk:subnet-name", "Value": "training"} in r["Properties"]["Tags"])
    assert zones == ["us-west-2a", "us-west-2b", "us-west-2c"]
