"""One home per platform default: a PlatformConfig field. The stacks' and constructs' props that carry one have no
default of their own (a second copy drifts: the launcher's log retention once said ONE_YEAR in the stack and
ONE_MONTH in the construct), and app.py passes each field on."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import aws_cdk as cdk
import pytest

import app as cdk_app
import platform_constructs
import stacks
from platform_config import PlatformConfig, load_config
from platform_constructs.retention import retention
from tests.infra.helpers import cdk_json_context

# The prop name(s) each config field goes by in stacks/ and platform_constructs/ (a Props class's field or a stack's
# keyword argument).
CONFIG_PROPS = {
    "vpc_cidr": "cidr", "az_count": "az_count", "availability_zones": "availability_zones",
    "nat_gateways": "nat_gateways", "largest_cluster_instances": "largest_cluster_instances",
    "flow_log_retention_days": "flow_log_retention", "log_retention_days": "log_retention", "egress": "egress",
    "fsx_storage_gib": "storage_capacity_gib", "fsx_throughput_per_tib": "throughput_per_tib",
    "fsx_deployment_type": "deployment_type", "dataset_prefix": "dataset_prefix",
    "dataset_bucket_name": "dataset_bucket_name", "kms_key_arn": ("kms_key_arn", "imported_key_arn"),
    "training_plans": "training_plans",
    "default_warm_pool_minutes": "default_warm_pool_minutes", "environment_patterns": "environment_patterns",
    "notification_email": "notification_email", "allowed_instance_types": "allowed_instance_types", "teams": "teams",
    "notify_refusals": "notify_refusals", "team_keys": "own_key",
    "allowed_image_repositories": "image_repositories", "mlflow_tracking_server": "mlflow_tracking_server",
}
# removal_policy: the stacks take it from retain_data (required there, tested below); the constructs keep RETAIN, the
# safe default that aws-cdk-lib's own stateful L2s have, and the stacks always pass the config's.
# Defaults that are not copies of the config's, each with its reason.
NOT_COPIES = {
    # The config's own entry schema for `teams` (None: the platform's dataset_prefix + the team's name).
    ("Team", "dataset_prefix"), ("Team", "allowed_instance_types"),
    # None is the construct's "no subscription" (kept optional, like an L2's); the stack passes the config's.
    ("JobLauncherProps", "notification_email"),
    # None is the role's "no MLflow server" (kept optional for a role built alone); the stack passes the config's.
    ("ExecutionRoleProps", "mlflow_tracking_server"),
    # False is the constructs' "tell only whoever started it", which the stack replaces with the config's.
    ("JobLauncherProps", "notify_refusals"), ("LauncherDefinitionProps", "notify_refusals"),
    # The default team of a platform without teams has no key of its own; team_specs sets it for declared teams.
    ("TeamSpec", "own_key"),
}


def _defaults(cls: type) -> dict[str, object]:
    if dataclasses.is_dataclass(cls):
        return {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def _classes():
    for package in (stacks, platform_constructs):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            yield from (c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__)


def test_no_stack_or_construct_keeps_its_own_copy_of_a_config_default():
    props = {name for names in CONFIG_PROPS.values() for name in ([names] if isinstance(names, str) else names)}
    copies = [f"{cls.__module__}.{cls.__name__}({name}={default!r})" for cls in _classes()
              for name, default in _defaults(cls).items()
              if name in props and (cls.__name__, name) not in NOT_COPIES]
    assert not copies, f"defaults that belong to platform_config's fields (make the prop required): {copies}"


@pytest.mark.parametrize("stack", ["PlatformStack", "LauncherStack"])
def test_the_stacks_take_retain_data_from_the_config(stack):
    cls = next(c for c in _classes() if c.__name__ == stack)
    assert "removal_policy" not in _defaults(cls)


def test_the_app_passes_each_field_on():
    # Every value unlike its default, so a prop the app forgot (or defaulted) shows.
    config = load_config({**cdk_json_context(), "vpc_cidr": "10.9.0.0/16", "nat_gateways": 2, "region": "eu-west-1",
                          "az_count": 2, "availability_zones": ["eu-west-1a", "eu-west-1b"],
                          "largest_cluster_instances": 4, "flow_log_retention_days": 30, "fsx_storage_gib": 2400,
                          "fsx_throughput_per_tib": 500, "default_warm_pool_minutes": 5,
                          "environment_patterns": ["MYLIB_*"], "mlflow_tracking_server": "https://mlflow.example.com"})
    # The stack sets the network's key and removal policy (its own); the config sets the rest.
    assert vars(cdk_app.network_props(config)) == {
        "cidr": "10.9.0.0/16", "az_count": 2, "availability_zones": ("eu-west-1a", "eu-west-1b"), "nat_gateways": 2,
        "largest_cluster_instances": 4, "flow_log_retention": retention(30), "egress": config.egress,
        "encryption_key": None, "removal_policy": cdk.RemovalPolicy.RETAIN}
    fs = cdk_app.file_system_props(config)
    assert (fs.storage_capacity_gib, fs.throughput_per_tib, fs.deployment_type.name) == (2400, 500, "PERSISTENT_2")
    assert vars(cdk_app.job_defaults(config)) == {"training_plans": (), "default_warm_pool_minutes": 5,
                                                   "environment_patterns": ("MYLIB_*",),
                                                   "mlflow_tracking_server": "https://mlflow.example.com"}
    assert cdk_app.file_system_props(dataclasses.replace(config, fsx_enabled=False)) is None


def test_the_default_config_reaches_the_templates(templates):
    """The synthesized default platform carries PlatformConfig's defaults (not a stack's or a construct's)."""
    config = PlatformConfig()
    resources = {name: t["Resources"].values() for name, t in templates.items()}
    platform, launcher = (resources[f"{config.name_prefix}-{s}"] for s in ("platform", "launcher"))

    def props(where, kind):
        return [r["Properties"] for r in where if r["Type"] == kind]

    assert [p["CidrBlock"] for p in props(platform, "AWS::EC2::VPC")] == [config.vpc_cidr]
    [lustre] = props(platform, "AWS::FSx::FileSystem")
    assert (lustre["StorageCapacity"], lustre["LustreConfiguration"]["PerUnitStorageThroughput"],
            lustre["LustreConfiguration"]["DeploymentType"]) == (
        config.fsx_storage_gib, config.fsx_throughput_per_tib, config.fsx_deployment_type)
    assert {p["RetentionInDays"] for p in props(platform, "AWS::Logs::LogGroup")} == {config.flow_log_retention_days}
    launcher_logs = props(launcher, "AWS::Logs::LogGroup")
    assert len(launcher_logs) >= 4  # the state machine's and each function's
    assert {p["RetentionInDays"] for p in launcher_logs} == {config.log_retention_days}
