"""The platform stack: network, key, buckets, dataset file system, execution role, capacity, published settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from jobs.images import PYTORCH_FRAMEWORK, SMP_FRAMEWORK
from jobs.platform import FsxSettings, PlatformSettings, TrainingPlan
from platform_constructs.buckets import AccessLogBucket, SecureBucket
from platform_constructs.dataset_fs import DatasetFileSystem
from platform_constructs.encryption import PlatformKey
from platform_constructs.images import ImageMapping, ImageTable
from platform_constructs.network import TrainingNetwork
from platform_constructs.roles import ExecutionRole
from platform_constructs.source_bundle import TrainingSourceBundle
from stacks.resources import PlatformResources


@dataclass(frozen=True)
class NetworkProps:
    cidr: str = "10.80.0.0/16"
    az_count: int = 2
    availability_zones: Sequence[str] = ()
    nat_gateways: int = 1
    largest_cluster_instances: int = 16
    flow_log_retention: logs.RetentionDays = logs.RetentionDays.THREE_MONTHS


@dataclass(frozen=True)
class FileSystemProps:
    storage_capacity_gib: int = 1200
    deployment_type: fsx.LustreDeploymentType = fsx.LustreDeploymentType.PERSISTENT_2
    throughput_per_tib: int = 250


@dataclass(frozen=True)
class JobDefaults:
    """What jobs may use and get by default: the platform settings' policy part."""
    allowed_instance_types: Sequence[str] = ("ml.p5.48xlarge",)
    training_plans: Sequence[TrainingPlan] = ()
    default_warm_pool_minutes: int = 0


class PlatformStack(cdk.Stack):
    """`file_system=None` builds no FSx; `dataset_bucket_name` imports a bucket instead of creating one;
    `kms_key_arn` imports a key instead of creating one."""

    def __init__(self, scope: Construct, id: str, *, name_prefix: str, images: ImageTable,
                 network: NetworkProps = NetworkProps(), file_system: FileSystemProps | None = FileSystemProps(),
                 jobs: JobDefaults = JobDefaults(), dataset_prefix: str = "datasets/",
                 dataset_bucket_name: str | None = None, kms_key_arn: str | None = None,
                 removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN, **kwargs) -> None:
        super().__init__(scope, id, description=f"{name_prefix} training platform: network, storage, "
                                                f"roles, capacity", **kwargs)
        self.name_prefix = name_prefix
        self.dataset_prefix = dataset_prefix
        key = PlatformKey(self, "Key", name_prefix=name_prefix, imported_key_arn=kms_key_arn,
                          removal_policy=removal_policy).key
        net = TrainingNetwork(
            self, "Network", cidr=network.cidr, az_count=network.az_count,
            availability_zones=network.availability_zones, nat_gateways=network.nat_gateways,
            largest_cluster_instances=network.largest_cluster_instances,
            flow_log_retention=network.flow_log_retention, encryption_key=key, removal_policy=removal_policy)
        access_logs = AccessLogBucket(self, "AccessLogs", removal_policy=removal_policy).bucket

        def bucket(name: str) -> s3.IBucket:
            return SecureBucket(self, name, encryption_key=key, access_logs=access_logs,
                                access_logs_prefix=name.lower(), removal_policy=removal_policy).bucket

        checkpoints, outputs = bucket("Checkpoints"), bucket("Outputs")
        datasets = (s3.Bucket.from_bucket_name(self, "Datasets", dataset_bucket_name) if dataset_bucket_name
                    else bucket("Datasets"))
        image_mapping = images.to_mapping(self, "Images")
        subnets = net.subnets.subnets
        role = ExecutionRole(
            self, "Execution", name_prefix=name_prefix, key=key, dataset_bucket=datasets,
            dataset_prefix=dataset_prefix, checkpoint_bucket=checkpoints, output_bucket=outputs,
            image_accounts={fw: image_mapping.account(fw) for fw in (PYTORCH_FRAMEWORK, SMP_FRAMEWORK)},
            vpc=net.vpc, subnets=subnets, security_groups=[net.training_security_group]).role
        source = TrainingSourceBundle(self, "TrainingSource", readers=[role])
        fsx_settings = None
        if file_system is not None:
            dataset_fs = DatasetFileSystem(
                self, "DatasetFileSystem", vpc=net.vpc, subnet=subnets[0],
                training_security_group=net.training_security_group, dataset_bucket=datasets,
                dataset_prefix=dataset_prefix, storage_capacity_gib=file_system.storage_capacity_gib,
                deployment_type=file_system.deployment_type, throughput_per_tib=file_system.throughput_per_tib,
                encryption_key=key, removal_policy=removal_policy)
            fsx_settings = FsxSettings(file_system_id=dataset_fs.file_system.file_system_id,
                                       mount_name=dataset_fs.file_system.mount_name,
                                       linked_path=dataset_fs.linked_path)
        settings = self._settings(role=role, subnets=subnets, net=net, key=key, buckets=(checkpoints, outputs, datasets),
                                  source=source, images=images, image_mapping=image_mapping, fsx_settings=fsx_settings,
                                  jobs=jobs)
        self.resources = PlatformResources(
            key=key, checkpoint_bucket=checkpoints, output_bucket=outputs, dataset_bucket=datasets,
            execution_role=role, settings=settings)
        self._publish(settings)

    def _settings(self, *, role: iam.IRole, subnets: list[ec2.ISubnet], net: TrainingNetwork, key: kms.IKey,
                  buckets: tuple[s3.IBucket, s3.IBucket, s3.IBucket], source: TrainingSourceBundle,
                  images: ImageTable, image_mapping: ImageMapping, fsx_settings: FsxSettings | None,
                  jobs: JobDefaults) -> PlatformSettings:
        """The platform settings document: values are tokens the deploy resolves."""
        checkpoints, outputs, datasets = buckets
        return PlatformSettings(
            name_prefix=self.name_prefix,
            region=cdk.Aws.REGION,
            execution_role_arn=role.role_arn,
            subnet_ids=[s.subnet_id for s in subnets],
            security_group_ids=[net.training_security_group.security_group_id],
            kms_key_arn=key.key_arn,
            checkpoint_bucket=checkpoints.bucket_name,
            output_bucket=outputs.bucket_name,
            dataset_bucket=datasets.bucket_name,
            dataset_prefix=self.dataset_prefix,
            source_dir_s3_uri=source.s3_uri,
            images=image_mapping.settings(),
            default_framework_version=images.versions[PYTORCH_FRAMEWORK][0],
            default_smp_version=images.versions[SMP_FRAMEWORK][0],
            allowed_instance_types=list(jobs.allowed_instance_types),
            fsx=fsx_settings,
            training_plans={plan.name: plan for plan in jobs.training_plans},
            default_warm_pool_minutes=jobs.default_warm_pool_minutes,
        )

    def _publish(self, settings: PlatformSettings) -> None:
        """Stack outputs for people, SSM parameters under /<prefix>/ for trainctl and the launcher."""
        values = {
            "SubnetIds": cdk.Fn.join(",", settings.subnet_ids),
            "TrainingSecurityGroupId": settings.security_group_ids[0],
            "KmsKeyArn": settings.kms_key_arn,
            "CheckpointBucket": settings.checkpoint_bucket,
            "OutputBucket": settings.output_bucket,
            "DatasetBucket": settings.dataset_bucket,
            "ExecutionRoleArn": settings.execution_role_arn,
            "TrainingSourceUri": settings.source_dir_s3_uri,
            **({"FsxFileSystemId": settings.fsx.file_system_id, "FsxMountName": settings.fsx.mount_name}
               if settings.fsx else {}),
        }
        for name, value in values.items():
            cdk.CfnOutput(self, name, value=value)
            ssm.StringParameter(self, f"{name}Parameter", parameter_name=f"/{self.name_prefix}/{_kebab(name)}",
                                string_value=value)
        document = self.to_json_string(settings.to_dict())
        cdk.CfnOutput(self, "PlatformSettings", value=document,
                      description="The platform settings document (trainctl render --platform FILE)")
        ssm.StringParameter(self, "PlatformSettingsParameter", string_value=document,
                            parameter_name=f"/{self.name_prefix}/platform-settings",
                            description="Platform settings for the job launcher and trainctl (JSON)")
        cdk.CfnOutput(self, "TrainingPlans", value=self.to_json_string(_plans(settings.training_plans)),
                      description="Registered SageMaker training plans (capacity reservations)")


def _plans(plans: Mapping[str, TrainingPlan]) -> dict[str, dict]:
    """Each plan by name: its ARN and capacity (the name is the key)."""
    return {name: {"arn": p.arn, "instance_type": p.instance_type, "instance_count": p.instance_count}
            for name, p in plans.items()}


def _kebab(name: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))
