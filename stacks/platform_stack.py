"""The platform stack: network, key, buckets, dataset file system, execution role, capacity, published settings."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from platform_constructs.buckets import AccessLogBucket, SecureBucket
from platform_constructs.config import PlatformConfig
from platform_constructs.dataset_fs import DatasetFileSystem
from platform_constructs.encryption import PlatformKey
from platform_constructs.images import ImageTable
from platform_constructs.network import TrainingNetwork
from platform_constructs.roles import ExecutionRole
from platform_constructs.source_bundle import TrainingSourceBundle
from stacks.resources import PlatformResources


class PlatformStack(cdk.Stack):
    def __init__(self, scope: Construct, id: str, *, config: PlatformConfig, images: ImageTable,
                 **kwargs) -> None:
        super().__init__(scope, id, description=f"{config.name_prefix} training platform: network, storage, "
                                                f"roles, capacity", **kwargs)
        self.config = config
        key = PlatformKey(self, "Key", config=config).key
        network = TrainingNetwork(self, "Network", config=config, key=key)
        access_logs = AccessLogBucket(self, "AccessLogs", config=config).bucket
        checkpoints = SecureBucket(self, "Checkpoints", config=config, key=key, access_logs=access_logs,
                                   log_prefix="checkpoints").bucket
        outputs = SecureBucket(self, "Outputs", config=config, key=key, access_logs=access_logs,
                               log_prefix="outputs").bucket
        if config.dataset_bucket_name:
            datasets = s3.Bucket.from_bucket_name(self, "Datasets", config.dataset_bucket_name)
        else:
            datasets = SecureBucket(self, "Datasets", config=config, key=key, access_logs=access_logs,
                                    log_prefix="datasets").bucket
        image_mapping = images.to_mapping(self, "Images")
        subnets = network.subnets.subnets
        role = ExecutionRole(
            self, "Execution", name_prefix=config.name_prefix, key=key, dataset_bucket=datasets,
            dataset_prefix=config.dataset_prefix, checkpoint_bucket=checkpoints, output_bucket=outputs,
            image_accounts={fw: image_mapping.account(fw) for fw in ("pytorch", "pytorch-smp")},
            vpc=network.vpc, subnets=subnets, security_groups=[network.training_security_group]).role
        source = TrainingSourceBundle(self, "TrainingSource", readers=[role])

        fsx_settings = None
        if config.fsx_enabled:
            dataset_fs = DatasetFileSystem(
                self, "DatasetFileSystem", config=config, vpc=network.vpc, subnet=subnets[0],
                training_security_group=network.training_security_group, key=key, dataset_bucket=datasets)
            fsx_settings = {"file_system_id": dataset_fs.file_system.file_system_id,
                            "mount_name": dataset_fs.file_system.mount_name,
                            "linked_path": dataset_fs.linked_path}

        settings = {
            "name_prefix": config.name_prefix,
            "region": cdk.Aws.REGION,
            "execution_role_arn": role.role_arn,
            "subnet_ids": [s.subnet_id for s in subnets],
            "security_group_ids": [network.training_security_group.security_group_id],
            "kms_key_arn": key.key_arn,
            "checkpoint_bucket": checkpoints.bucket_name,
            "output_bucket": outputs.bucket_name,
            "dataset_bucket": datasets.bucket_name,
            "source_dir_s3_uri": source.s3_uri,
            "images": image_mapping.settings(),
            "default_framework_version": config.pytorch_versions[0],
            "default_smp_version": config.smp_versions[0],
            "allowed_instance_types": list(config.allowed_instance_types),
            "fsx": fsx_settings,
            "training_plans": {p.name: {"arn": p.arn, "instance_type": p.instance_type,
                                        "instance_count": p.instance_count} for p in config.training_plans},
            "default_warm_pool_minutes": config.default_warm_pool_minutes,
        }
        self.resources = PlatformResources(
            config=config, key=key, checkpoint_bucket=checkpoints, output_bucket=outputs, dataset_bucket=datasets,
            execution_role=role, settings=settings)
        self._publish(config, settings, {
            "SubnetIds": cdk.Fn.join(",", settings["subnet_ids"]),
            "TrainingSecurityGroupId": network.training_security_group.security_group_id,
            "KmsKeyArn": key.key_arn,
            "CheckpointBucket": checkpoints.bucket_name,
            "OutputBucket": outputs.bucket_name,
            "DatasetBucket": datasets.bucket_name,
            "ExecutionRoleArn": role.role_arn,
            "TrainingSourceUri": source.s3_uri,
            **({"FsxFileSystemId": fsx_settings["file_system_id"], "FsxMountName": fsx_settings["mount_name"]}
               if fsx_settings else {}),
        })

    def _publish(self, config: PlatformConfig, settings: dict, values: dict[str, str]) -> None:
        """Stack outputs for people, SSM parameters under /<prefix>/ for trainctl and the launcher."""
        for name, value in values.items():
            cdk.CfnOutput(self, name, value=value)
            ssm.StringParameter(self, f"{name}Parameter", parameter_name=f"/{config.name_prefix}/{_kebab(name)}",
                                string_value=value)
        document = self.to_json_string(settings)
        cdk.CfnOutput(self, "PlatformSettings", value=document,
                      description="The platform settings document (trainctl render --platform FILE)")
        ssm.StringParameter(self, "PlatformSettingsParameter", string_value=document,
                            parameter_name=f"/{config.name_prefix}/platform-settings",
                            description="Platform settings for the job launcher and trainctl (JSON)")
        cdk.CfnOutput(self, "TrainingPlans", value=self.to_json_string(settings["training_plans"]),
                      description="Registered SageMaker training plans (capacity reservations)")


def _kebab(name: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))
