"""The platform constructs on their own (in-process): typed props, safe defaults, errors that say what to change."""

from __future__ import annotations

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template

import app as cdk_app
from platform_config import PlatformConfig
from platform_constructs.buckets import SecureBucket
from platform_constructs.encryption import PlatformKey
from platform_constructs.network import TrainingNetwork, training_subnet_mask
from platform_constructs.retention import retention

# The constructs' props have no defaults: the platform config's defaults, as app.py passes them.
CONFIG = PlatformConfig()
NETWORK = {**vars(cdk_app.network_props(CONFIG)), "egress": CONFIG.egress}
FILE_SYSTEM = {**vars(cdk_app.file_system_props(CONFIG)), "dataset_prefix": CONFIG.dataset_prefix}


def test_network_defaults_build_two_training_subnets_sized_for_efa():
    stack = Stack(App(), "Net")
    network = TrainingNetwork(stack, "Network", **NETWORK)
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
        TrainingNetwork(Stack(App(), "Net"), "Network", **{**NETWORK, **props})


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
        TrainingNetwork(Stack(App(), "Net"), "Network", **{**NETWORK, "egress": "endpoints"})


def test_the_file_system_rules_are_the_lustre_l2s():
    """dataset_fs words the LustreFileSystem L2's storage and throughput rules (the config checks with them): the L2
    refuses exactly what they refuse. 0 GiB is left out: the L2 leaves it to CloudFormation, the rule refuses it."""
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_fsx as fsx

    from platform_constructs.dataset_fs import storage_problem, throughput_problem

    stack = Stack(App(), "Fsx")
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-1", availability_zones=["us-east-1a"])
    subnet = ec2.Subnet.from_subnet_id(stack, "Subnet", "subnet-1")

    def l2_refuses(gib: int, throughput: int) -> bool:
        try:
            fsx.LustreFileSystem(stack, f"Fs{len(stack.node.children)}", vpc=vpc, vpc_subnet=subnet, storage_capacity_gib=gib,
                                 lustre_configuration=fsx.LustreConfiguration(
                                     deployment_type=fsx.LustreDeploymentType.PERSISTENT_2,
                                     per_unit_storage_throughput=throughput))
        except RuntimeError as err:  # the L2's ValidationError, through jsii
            assert "storageCapacity" in str(err) or "perUnitStorageThroughput" in str(err), err
            return True
        return False

    for gib in (1200, 2400, 3600, 4800, 2000, 7200, 1199):
        assert l2_refuses(gib, 250) == (storage_problem(gib) is not None), gib
    for throughput in (125, 250, 500, 1000, 50, 200, 300):
        assert l2_refuses(1200, throughput) == (throughput_problem(throughput) is not None), throughput


@pytest.mark.parametrize(("props", "names"), [
    ({"storage_capacity_gib": 2000}, "storage_capacity_gib=2000: must be 1200 or a multiple of 2400"),
    ({"throughput_per_tib": 300}, "throughput_per_tib=300: must be 125, 250, 500 or 1000"),
])
def test_dataset_file_system_says_which_prop_to_change(props, names):
    from aws_cdk import aws_ec2 as ec2

    from platform_constructs.dataset_fs import DatasetFileSystem

    stack = Stack(App(), "Fsx")
    vpc = ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-1", availability_zones=["us-east-1a"])
    group = ec2.SecurityGroup.from_security_group_id(stack, "Training", "sg-1")
    with pytest.raises(ValueError, match=names):
        DatasetFileSystem(stack, "Fs", vpc=vpc, subnet=ec2.Subnet.from_subnet_id(stack, "Subnet", "subnet-1"),
                          training_security_group=group, dataset_bucket=s3.Bucket.from_bucket_name(stack, "B", "datasets"),
                          **{**FILE_SYSTEM, **props})
