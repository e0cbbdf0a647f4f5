#!/usr/bin/env python3
"""CDK entry: reads the platform config from context, builds the stacks, adds the cdk-nag rule packs."""

from __future__ import annotations

import sys

# This project's own packages: a ModuleNotFoundError naming one of them is a bug, not a missing install.
OWN_PACKAGES = {"platform_config", "platform_constructs", "stacks", "jobs", "contract", "bundles", "training"}
SETUP_HINT = ("hint: run `make setup` (it makes .venv with the CDK app's packages), then `make synth`, or "
              "`source .venv/bin/activate` before `npx cdk synth`")

try:
    import aws_cdk as cdk
    from aws_cdk import aws_fsx as fsx
    from cdk_nag import AwsSolutionsChecks, NIST80053R5Checks

    from platform_config import PlatformConfig, PlatformConfigError, load_config
    from platform_constructs.dataset_fs import LustreProps
    from platform_constructs.images import ImageTable
    from platform_constructs.network import TrainingNetworkProps
    from platform_constructs.retention import retention
    from stacks.launcher_stack import LauncherStack
    from stacks.platform_stack import JobDefaults, PlatformStack
except ModuleNotFoundError as missing:
    # cdk.json runs `python3 app.py`: outside the venv that is a Python without aws-cdk-lib, and the CDK CLI shows
    # only the traceback's last line.
    if (missing.name or "").partition(".")[0] in OWN_PACKAGES:
        raise
    sys.exit(f"error: app.py needs the Python package {missing.name!r}, which this Python ({sys.executable}) "
             f"does not have\n{SETUP_HINT}")


def build_app(app: cdk.App) -> cdk.App:
    """Add the platform's stacks and checks to app, configured from its context (raises PlatformConfigError)."""
    config = load_config(app.node.get_all_context())
    images = ImageTable.resolve(config.pytorch_versions, config.smp_versions)
    env = cdk.Environment(region=config.region) if config.region else None
    removal = cdk.RemovalPolicy.RETAIN if config.retain_data else cdk.RemovalPolicy.DESTROY
    platform = PlatformStack(
        app, f"{config.name_prefix}-platform", name_prefix=config.name_prefix, images=images,
        network=network_props(config), file_system=file_system_props(config), jobs=job_defaults(config),
        dataset_prefix=config.dataset_prefix, dataset_bucket_name=config.dataset_bucket_name,
        kms_key_arn=config.kms_key_arn, teams=config.team_specs, removal_policy=removal,
        env=env)
    LauncherStack(app, f"{config.name_prefix}-launcher", resources=platform.resources,
                  notification_email=config.notification_email, notify_refusals=config.notify_refusals,
                  log_retention=retention(config.log_retention_days), removal_policy=removal, env=env)
    for key, value in config.tags.items():
        cdk.Tags.of(app).add(key, value)
    # Findings of either pack fail the synth; each acknowledgement names its resource and reason.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(verbose=True), NIST80053R5Checks(verbose=True))
    return app


# The stacks' and constructs' props have no defaults of their own: each default is a PlatformConfig field's.
def network_props(config: PlatformConfig) -> TrainingNetworkProps:
    """The training network's props (the stack adds its key and removal policy)."""
    return TrainingNetworkProps(cidr=config.vpc_cidr, az_count=config.az_count,
                                availability_zones=config.availability_zones, nat_gateways=config.nat_gateways,
                                largest_cluster_instances=config.largest_cluster_instances,
                                flow_log_retention=retention(config.flow_log_retention_days), egress=config.egress)


def file_system_props(config: PlatformConfig) -> LustreProps | None:
    if not config.fsx_enabled:
        return None
    return LustreProps(storage_capacity_gib=config.fsx_storage_gib,
                       deployment_type=getattr(fsx.LustreDeploymentType, config.fsx_deployment_type),
                       throughput_per_tib=config.fsx_throughput_per_tib)


def job_defaults(config: PlatformConfig) -> JobDefaults:
    return JobDefaults(training_plans=config.training_plans, default_warm_pool_minutes=config.default_warm_pool_minutes,
                       environment_patterns=config.environment_patterns,
                       mlflow_tracking_server=config.mlflow_tracking_server)


def main() -> None:
    try:
        app = build_app(cdk.App())
    except (PlatformConfigError, ValueError) as err:
        # A bad value is the user's to fix: one message, no traceback.
        print(f"\n{err}\n", file=sys.stderr)
        sys.exit(1)
    app.synth()


if __name__ == "__main__":
    main()
