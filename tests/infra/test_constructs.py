"""The platform constructs on their own (in-process): typed props, safe defaults, errors that say what to change."""

from __future__ import annotations

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template

from platform_constructs.buckets import SecureBucket
from platform_constructs.encryption import PlatformKey
from platform_constructs.network import TrainingNetwork, training_subnet_mask
from platform_constructs.retention import retention


def test_network_defaults_build_two_training_subnets_sized_for_efa():
    stack = Stack(App(), "Net")
    network = TrainingNetwork(stack, "Network")
    assert len(network.subnets.subnets) == 2
    assert network.training_subnet_mask == training_subnet_mask(16) == 22
    Template.from_stack(stack).resource_count_is("AWS::EC2::NatGateway", 1)


@pytest.mark.parametrize(("props", "names"), [
    ({"az_count": 1}, "az_count=1"),
    ({"nat_gateways": 3}, "nat_gateways=3"),
    ({"availability_zones": ["us-east-1a"]}, "availability_zones"),
    ({"cidr": "10.0.0.0/22"}, "is too small"),
])
def test_network_says_which_prop_to_change(props, names):
    with pytest.raises(ValueError, match=names):
        TrainingNetwork(Stack(App(), "Net"), "Network", **props)


def test_secure_bucket_checks_its_log_prefix():
    stack = Stack(App(), "Buckets")
    key = PlatformKey(stack, "Key", name_prefix="mltrain").key
    logs = s3.Bucket(stack, "Logs")
    with pytest.raises(ValueError, match="access_logs_prefix"):
        SecureBucket(stack, "Bad", encryption_key=key, access_logs=logs, access_logs_prefix="outputs/")


def test_imported_key_creates_nothing():
    stack = Stack(App(), "Keys")
    key = PlatformKey(stack, "Key", name_prefix="mltrain",
                      imported_key_arn="arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555")
    assert not key.created
    Template.from_stack(stack).resource_count_is("AWS::KMS::Key", 0)


def test_retention_names_the_allowed_periods():
    with pytest.raises(ValueError, match="365"):
        retention(10)


def test_allowed_image_sources_become_ecr_repository_arns():
    from platform_constructs.roles import ecr_repository_arns
    stack = Stack(App(), "Arns")
    registry = "111122223333.dkr.ecr.us-east-1.amazonaws.com"
    arns = [stack.resolve(a) for a in ecr_repository_arns(f"{registry}/team-a/trainer")]
    assert [a["Fn::Join"][1][-1] for a in arns] == [":ecr:us-east-1:111122223333:repository/team-a/trainer",
                                                     ":ecr:us-east-1:111122223333:repository/team-a/trainer/*"]
    [every] = [stack.resolve(a) for a in ecr_repository_arns(f"{registry}/")]
    assert every["Fn::Join"][1][-1] == ":ecr:us-east-1:111122223333:repository/*"
    assert ecr_repository_arns("registry.example.com/team/trainer") == []  # outside ECR: no IAM to grant


def test_endpoints_egress_needs_no_nat():
    with pytest.raises(ValueError, match="egress='endpoints' with nat_gateways=1"):
        TrainingNetwork(Stack(App(), "Net"), "Network", egress="endpoints")
