"""FSx for Lustre linked to the dataset bucket, in the first training subnet's AZ."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from platform_constructs.config import PlatformConfig

# Lustre clients talk to the file servers on TCP 988 and 1018-1023 (FSx for Lustre user guide).
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))
LINKED_PATH = "datasets"


class DatasetFileSystem(Construct):
    """PERSISTENT_2 (or SCRATCH_2) Lustre with LZ4 compression. PERSISTENT_2 links to S3 through a data
    repository association with automatic import and export; SCRATCH_2 through its import/export path."""

    def __init__(self, scope: Construct, id: str, *, config: PlatformConfig, vpc: ec2.IVpc,
                 subnet: ec2.ISubnet, training_security_group: ec2.SecurityGroup, key: kms.IKey,
                 dataset_bucket: s3.IBucket) -> None:
        super().__init__(scope, id)
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="FSx for Lustre: Lustre ports from the training instances and between file servers")
        # LustreFileSystem itself opens 988-1023 from this group to itself (file server to file server).
        for port in LUSTRE_PORTS:
            self.security_group.add_ingress_rule(training_security_group, port, "Lustre from training instances")
            self.security_group.add_egress_rule(self.security_group, port, "Lustre between file servers")
            training_security_group.add_egress_rule(self.security_group, port, "Lustre to the dataset file system")

        persistent = config.fsx_deployment_type == "PERSISTENT_2"
        s3_path = f"s3://{dataset_bucket.bucket_name}/{config.dataset_prefix}"
        lustre = fsx.LustreConfiguration(
            deployment_type=getattr(fsx.LustreDeploymentType, config.fsx_deployment_type),
            data_compression_type=fsx.LustreDataCompressionType.LZ4,
            per_unit_storage_throughput=config.fsx_throughput_per_tib if persistent else None,
            # SCRATCH_2 has no association: the bucket prefix is its import and export path.
            import_path=None if persistent else s3_path,
            export_path=None if persistent else s3_path,
            auto_import_policy=None if persistent else fsx.LustreAutoImportPolicy.NEW_CHANGED_DELETED)
        self.file_system = fsx.LustreFileSystem(
            self, "FileSystem", vpc=vpc, vpc_subnet=subnet, storage_capacity_gib=config.fsx_storage_gib,
            lustre_configuration=lustre, security_group=self.security_group,
            # SCRATCH file systems are always encrypted with an FSx-managed key and take no KMS key.
            kms_key=key if persistent else None,
            removal_policy=cdk.RemovalPolicy.RETAIN if config.retain_data else cdk.RemovalPolicy.DESTROY)
        self.linked_path = LINKED_PATH
        if persistent:
            self.association = fsx.CfnDataRepositoryAssociation(
                self, "DatasetLink", file_system_id=self.file_system.file_system_id,
                file_system_path=f"/{LINKED_PATH}", data_repository_path=s3_path,
                batch_import_meta_data_on_create=True,
                s3=fsx.CfnDataRepositoryAssociation.S3Property(
                    auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                        events=["NEW", "CHANGED", "DELETED"]),
                    auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(
                        events=["NEW", "CHANGED", "DELETED"])))
