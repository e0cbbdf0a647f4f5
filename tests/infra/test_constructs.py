"""The platform constructs on their own (in-process): typed props, safe defaults, errors that say what to change."""

from __future__ import annotations

import dataclasses
import re

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Template

import app as cdk_app
from platform_config import PlatformConfig
from platform_constructs.buckets import SecureBucket, SecureBucketProps
from platform_constructs.encryption import PlatformKey, PlatformKeyProps
from platform_constructs.network import TrainingNetwork, TrainingNetworkProps, training_subnet_mask
from platform_constructs.retention import retention

# The constructs' props have no defaults: the platform config's defaults, as app.py passes them.
CONFIG = PlatformConfig()
NETWORK = cdk_app.network_props(CONFIG)
LUSTRE = cdk_app.file_system_props(CONFIG)


def test_network_defaults_build_two_training_subnets_sized_for_efa():
    stack = Stack(App(), "Net")
    network = TrainingNetwork(stack, "Network", NETWORK)
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
        dataclasses.replace(NETWORK, **props)


def test_secure_bucket_checks_its_log_prefix():
    stack = Stack(App(), "Buckets")
    key = PlatformKey(stack, "Key", PlatformKeyProps(name_prefix="mltrain", imported_key_arn=None)).key
    logs = s3.Bucket(stack, "Logs")
    with pytest.raises(ValueError, match="access_logs_prefix"):
        SecureBucketProps(encryption_key=key, access_logs=logs, access_logs_prefix="outputs/")
    SecureBucket(stack, "Good", SecureBucketProps(encryption_key=key, access_logs=logs, access_logs_prefix="outputs"))


def test_imported_key_creates_nothing():
    stack = Stack(App(), "Keys")
    key = PlatformKey(stack, "Key", PlatformKeyProps(
        name_prefix="mltrain",
        imported_key_arn="arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"))
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
        TrainingNetworkProps(**{**vars(NETWORK), "egress": "endpoints"})


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
    with pytest.raises(ValueError, match=names):
        dataclasses.replace(LUSTRE, **props)


def test_the_file_system_and_the_network_are_connectable():
    """Each construct that owns a security group has `connections` (ec2.IConnectable), as aws-cdk-lib's own do: the
    file system's group opens to the training group on the Lustre ports, and another client is one allow_from."""
    from aws_cdk import aws_ec2 as ec2

    from platform_constructs.dataset_fs import LUSTRE_PORTS, DatasetFileSystem, DatasetFileSystemProps

    stack = Stack(App(), "Fsx")
    network = TrainingNetwork(stack, "Network", NETWORK)
    fs = DatasetFileSystem(stack, "Fs", DatasetFileSystemProps(
        vpc=network.vpc, subnet=network.subnets.subnets[0], training_security_group=network.training_security_group,
        dataset_bucket=s3.Bucket.from_bucket_name(stack, "B", "datasets"), dataset_prefix=CONFIG.dataset_prefix,
        lustre=LUSTRE))
    assert network.connections.security_groups == [network.training_security_group]
    assert fs.connections.security_groups == [fs.security_group]
    other = ec2.SecurityGroup(stack, "Other", vpc=network.vpc)
    other.connections.allow_to(fs, LUSTRE_PORTS[0], "another client")  # fs is an IConnectable
    template = Template.from_stack(stack)
    group = stack.resolve(fs.security_group.security_group_id)
    ingress = template.find_resources("AWS::EC2::SecurityGroupIngress", {"Properties": {"GroupId": group}})
    sources = {stack.resolve(r["Properties"]["SourceSecurityGroupId"])["Fn::GetAtt"][0] for r in ingress.values()}
    assert sources == {stack.get_logical_id(g.node.default_child)
                       for g in (network.training_security_group, other, fs.security_group)}


def _constructs():
    import importlib
    import inspect
    import pkgutil

    from constructs import Construct

    import platform_constructs
    for info in pkgutil.iter_modules(platform_constructs.__path__):
        module = importlib.import_module(f"platform_constructs.{info.name}")
        yield from (c for c in vars(module).values()
                    if inspect.isclass(c) and c.__module__ == module.__name__ and issubclass(c, Construct))


@pytest.mark.parametrize("construct", list(_constructs()), ids=lambda c: c.__name__)
def test_each_construct_takes_scope_id_and_one_frozen_props(construct):
    """aws-cdk-lib's shape: `Construct(scope, id, props)`, the props one frozen dataclass of typed fields (keyword-only,
    each with its docstring in the source), which checks itself (__post_init__) before any resource is made."""
    import inspect
    import typing

    params = list(inspect.signature(construct.__init__).parameters.values())
    assert [p.name for p in params] == ["self", "scope", "id", "props"], construct
    props = typing.get_type_hints(construct.__init__)["props"]
    props = next((a for a in typing.get_args(props) if a is not type(None)), props)  # `X | None`: all defaulted
    assert dataclasses.is_dataclass(props) and props.__dataclass_params__.frozen, props
    assert props.__name__ == f"{construct.__name__}Props"
    assert all(f.kw_only for f in dataclasses.fields(props)), props
    source = inspect.getsource(props)
    undocumented = [f.name for f in dataclasses.fields(props)
                    if not re.search(rf"^    {f.name}: .*\n    \"\"\"", source, re.MULTILINE)]
    assert not undocumented, f"{props.__name__}: give each field a docstring under it: {undocumented}"
