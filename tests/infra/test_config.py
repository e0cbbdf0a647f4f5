"""The platform config: defaults are valid, every bad value is reported with its key and the fix."""

from __future__ import annotations

import pytest

from platform_config import PlatformConfig, load_config
from tests.conftest import ROOT, cdk_synth
from tests.infra.helpers import cdk_json_context, problems


def test_cdk_json_defaults_are_valid_and_match_the_dataclass():
    config = load_config(cdk_json_context())
    assert config == PlatformConfig(), "cdk.json's platform keys and PlatformConfig's defaults have drifted"


def test_cdk_feature_flags_are_not_checked_as_platform_keys():
    load_config({"@aws-cdk/aws-s3:createDefaultLoggingPolicy": True, "aws:cdk:version-reporting": False})


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"fsx_throughput_per_tib": 300}, "'fsx_throughput_per_tib' = 300: must be 125, 250, 500 or 1000"),
    ({"fsx_storage_gib": 2000}, "'fsx_storage_gib' = 2000: must be 1200 or a multiple of 2400"),
    ({"fsx_deployment_type": "PERSISTENT_1"}, "must be PERSISTENT_2 or SCRATCH_2"),
    ({"nat_gateways": 3}, "'nat_gateways' = 3: must be 0 (VPC endpoints only) to az_count=2"),
    ({"vpc_cidr": "10.0.0.0/8"}, "must be an IPv4 CIDR between /16 and /24"),
    ({"vpc_cidr": "banana"}, "'vpc_cidr' = 'banana': must be an IPv4 CIDR such as 10.80.0.0/16"),
    ({"vpc_cidr": "10.0.0.0/22"}, "is too small"),
    ({"az_count": 3}, "more than 2 AZs needs 'region' and 'availability_zones'"),
    ({"flow_log_retention_days": 10}, "'flow_log_retention_days' = 10: must be one of CloudWatch Logs' periods"),
    ({"name_prefix": "ML_Train"}, "'name_prefix' = 'ML_Train': must be 3-20 lowercase letters"),
    ({"kms_key_arn": "alias/mine"}, "'kms_key_arn' = 'alias/mine': must be a KMS key ARN"),
    ({"dataset_prefix": "/data"}, "must be an S3 key prefix ending in '/'"),
    ({"allowed_instance_types": ["p5.48xlarge"]}, "entry 'p5.48xlarge': must be a SageMaker instance type"),
    ({"default_warm_pool_minutes": 500}, "'default_warm_pool_minutes' = 500: must be 0 to 360"),
    ({"notification_email": "ops"}, "'notification_email' = 'ops': must be an e-mail address"),
    ({"mlflow_tracking_server": "my-mlflow"}, "'mlflow_tracking_server' = 'my-mlflow': must be http(s)://host:port or "
                                              "a SageMaker MLflow ARN"),
    ({"mlflow_tracking_server": "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/x y"},
     "must be http(s)://host:port or a SageMaker MLflow ARN"),
    ({"training_plans": [{"name": "p5-week", "arn": "arn:aws:ec2:us-east-1:123456789012:capacity-reservation/cr-1",
                          "instance_type": "ml.p5.48xlarge", "instance_count": 2}]},
     "is not a training plan ARN"),
    ({"training_plans": [{"name": "trn", "instance_count": 1, "instance_type": "ml.trn1.32xlarge",
                          "arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/trn"}]},
     "instance_type 'ml.trn1.32xlarge' is not in allowed_instance_types"),
    ({"training_plans": [{"name": "x"}]}, "must have exactly the keys"),
    ({"fsx_enabled": "maybe"}, "'fsx_enabled' = 'maybe': must be true or false"),
    ({"tags": "[1]"}, "must be a JSON object of string values"),
    ({"nat_gatways": 0}, "'nat_gatways': unknown key; did you mean 'nat_gateways'?"),
])
def test_each_bad_value_is_named_with_the_fix(overrides, expected):
    found = problems(**overrides)
    assert any(expected in p for p in found), found


def test_all_problems_are_reported_together():
    found = problems(fsx_throughput_per_tib=300, fsx_storage_gib=2000)
    assert len(found) == 2


def test_command_line_strings_are_parsed():
    # `cdk synth -c key=value` delivers strings.
    config = load_config({**cdk_json_context(), "nat_gateways": "0", "fsx_enabled": "false",
                          "allowed_instance_types": '["ml.p5.48xlarge"]', "dataset_bucket_name": "null"})
    assert (config.nat_gateways, config.fsx_enabled, config.allowed_instance_types) == (0, False,
                                                                                         ("ml.p5.48xlarge",))
    assert config.dataset_bucket_name is None


def test_training_subnets_fit_the_largest_cluster():
    assert 2 ** (32 - PlatformConfig(largest_cluster_instances=16).private_subnet_mask) >= 16 * 32 + 5
    assert PlatformConfig(largest_cluster_instances=64).private_subnet_mask < \
        PlatformConfig(largest_cluster_instances=4).private_subnet_mask


def test_a_valid_training_plan_is_accepted():
    plan = {"name": "p5-week", "arn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p5-week",
            "instance_type": "ml.p5.48xlarge", "instance_count": 4}
    config = load_config({**cdk_json_context(), "training_plans": [plan]})
    assert config.training_plans[0].instance_count == 4


def test_cdk_synth_stops_with_the_message_and_no_traceback(tmp_path):
    result = cdk_synth(tmp_path, "fsx_throughput_per_tib=300", "fsx_storage_gib=2000")
    assert result.returncode != 0
    assert "'fsx_throughput_per_tib' = 300: must be 125, 250, 500 or 1000" in result.stderr
    assert "'fsx_storage_gib' = 2000: must be 1200 or a multiple of 2400" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_readme_documents_every_config_key():
    readme = (ROOT / "README.md").read_text()
    from dataclasses import fields
    missing = [f.name for f in fields(PlatformConfig) if f"| `{f.name}` |" not in readme]
    assert not missing, f"README's configuration table lacks {missing}"


def test_one_problem_per_bad_key_even_for_several_bad_entries():
    found = problems(allowed_instance_types=["p5", "g5"], fsx_enabled="maybe")
    assert len(found) == 2, found


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"name_prefix": "ml--train"}, "'name_prefix' = 'ml--train': must not contain '--'"),
    ({"teams": [{"name": "a-b"}]}, "name: must be 1-12 lowercase letters or digits (no hyphen"),
    ({"teams": [{"name": "a"}]}, "so teams need 'fsx_enabled' false"),
    ({"fsx_enabled": False, "teams": [{"name": "a"}, {"name": "a"}]}, "team names must be unique"),
    ({"fsx_enabled": False, "name_prefix": "mltrainplatform", "teams": [{"name": "research"}]},
     "its prefix 'mltrainplatform--research' has 25 characters; the most is 20"),
    ({"fsx_enabled": False, "teams": [{"name": "a", "dataset_prefix": "data/"}, {"name": "b", "dataset_prefix":
                                                                                 "data/b/"}]},
     "dataset_prefix 'data/b/' lies inside team 'a''s 'data/'"),
    ({"fsx_enabled": False, "teams": [
        {"name": "a", "allowed_image_repositories": ["123456789012.dkr.ecr.us-east-1.amazonaws.com/"]},
        {"name": "b", "allowed_image_repositories": ["123456789012.dkr.ecr.us-east-1.amazonaws.com/b/train"]}]},
     "'teams' entry 'a': allowed_image_repositories entry '123456789012.dkr.ecr.us-east-1.amazonaws.com/' covers "
     "team 'b''s '123456789012.dkr.ecr.us-east-1.amazonaws.com/b/train'"),
    ({"fsx_enabled": False, "teams": [  # a repository path holds the repositories under it, as a request's image reads
        {"name": "a", "allowed_image_repositories": ["123456789012.dkr.ecr.us-east-1.amazonaws.com/b"]},
        {"name": "b", "allowed_image_repositories": ["123456789012.dkr.ecr.us-east-1.amazonaws.com/b/train"]}]},
     "'teams' entry 'a': allowed_image_repositories entry '123456789012.dkr.ecr.us-east-1.amazonaws.com/b' covers "
     "team 'b''s"),
    ({"fsx_enabled": False, "teams": [
        {"name": "a", "allowed_image_repositories": ["123456789012.dkr.ecr.us-east-1.amazonaws.com/shared"]},
        {"name": "b", "allowed_image_repositories": ["123456789012.dkr.ecr.us-east-1.amazonaws.com/shared"]}]},
     "'teams' entry 'b': allowed_image_repositories entry '123456789012.dkr.ecr.us-east-1.amazonaws.com/shared' "
     "covers team 'a''s"),
    ({"fsx_enabled": False, "teams": [{"name": "a", "allowed_instance_types": ["ml.p3.2xlarge"]}]},
     "allowed_instance_types ['ml.p3.2xlarge'] are not in the platform's"),
    ({"fsx_enabled": False, "teams": [{"name": "a", "engineer_roles": ["arn:aws:iam::123456789012:user/x"]}]},
     "must be an IAM role ARN"),
    ({"egress": "endpoints"}, "'egress' = 'endpoints': 'endpoints' leaves the training subnets no route to a NAT"),
    ({"egress": "none"}, "'egress' = 'none': must be internet or endpoints"),
])
def test_each_bad_team_or_egress_value_is_named_with_the_fix(overrides, expected):
    found = problems(**overrides)
    assert any(expected in p for p in found), found


def test_teams_with_repositories_of_their_own_are_accepted():
    """Neighbouring names are not covering: `team-a/train` and `team-a/train2`, `a/` and `ab/`."""
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    load_config({**cdk_json_context(), "fsx_enabled": False, "teams": [
        {"name": "a", "allowed_image_repositories": [f"{registry}/a/train", f"{registry}/x/"]},
        {"name": "b", "allowed_image_repositories": [f"{registry}/a/train2", f"{registry}/xy/"]}]})


def test_teams_get_their_own_prefix_datasets_and_types():
    config = load_config({**cdk_json_context(), "fsx_enabled": False, "teams": [
        {"name": "vision", "dataset_prefix": "teams/vision/", "allowed_instance_types": ["ml.g5.12xlarge"]},
        {"name": "nlp"}]})
    vision, nlp = config.team_specs
    assert (vision.name_prefix, vision.dataset_prefix, vision.allowed_instance_types) == (
        "mltrain--vision", "teams/vision/", ("ml.g5.12xlarge",))
    assert (nlp.name_prefix, nlp.dataset_prefix) == ("mltrain--nlp", "datasets/nlp/")
    assert nlp.allowed_instance_types == config.allowed_instance_types


def test_no_teams_is_one_default_team_with_the_platform_names():
    [default] = load_config(cdk_json_context()).team_specs
    assert (default.name, default.name_prefix, default.dataset_prefix) == (None, "mltrain", "datasets/")


def test_a_platform_may_be_named_local():
    # trainctl local's settings are marked by their type (jobs.platform.LocalPlatformSettings), not by this name:
    # a deployed platform named local keeps every request check (tests/jobs/request/test_batch_rules.py).
    assert load_config({**cdk_json_context(), "name_prefix": "local"}).name_prefix == "local"


@pytest.mark.parametrize("prefix", ["ab", "1ab", "ab-", "x" * 21, "Ml-train", "ml_train", "ml train"])
def test_name_prefix_rule_names_its_limits(prefix):
    assert any("must be 3-20 lowercase letters" in p for p in problems(name_prefix=prefix))


def test_readme_shows_each_default_as_the_config_has_it():
    """README's configuration table quotes the defaults (docs); PlatformConfig's fields are their home."""
    import json
    import re
    from dataclasses import asdict

    defaults = json.loads(json.dumps(asdict(PlatformConfig())))
    shown = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", (ROOT / "README.md").read_text(), re.M))
    checked = {key: value for key, value in shown.items() if key in defaults}
    assert len(checked) >= 25, checked

    def read(text: str):
        try:
            return json.loads(text)
        except ValueError:
            return text

    wrong = {key: (text, defaults[key]) for key, text in checked.items() if read(text) != defaults[key]}
    assert not wrong, f"README's defaults that are not PlatformConfig's: {wrong}"
