"""FSx for Lustre linked to the dataset bucket, in one training subnet's AZ."""

from __future__ import annotations

from dataclasses import dataclass

import aws_cdk as cdk
import jsii
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

# Lustre clients talk to the file servers on TCP 988 and 1018-1023 (FSx for Lustre user guide). The L2's
# default port is the whole 988-1023 range; clients need only these two.
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))
LINKED_PATH = "datasets"
_SYNC_EVENTS = ["NEW", "CHANGED", "DELETED"]
# The deployment types this construct links to S3 (PERSISTENT_2: a data repository association; SCRATCH_2: its
# import and export path).
DEPLOYMENT_TYPES = (fsx.LustreDeploymentType.PERSISTENT_2, fsx.LustreDeploymentType.SCRATCH_2)
# The LustreFileSystem L2's rules for those types (its validateStorageCapacity and validatePerUnitStorageThroughput;
# tests/infra/test_constructs.py checks that the L2 agrees): a capacity is the smallest one or whole steps, and
# PERSISTENT_2 offers these throughputs, MB/s per TiB. The platform config words them for its keys.
SMALLEST_STORAGE_GIB = 1200
STORAGE_STEP_GIB = 2400
PERSISTENT_2_THROUGHPUTS = (125, 250, 500, 1000)


def storage_problem(gib: int) -> str | None:
    """What a storage capacity (GiB) must be, or None when it is one the L2 and FSx take."""
    if gib == SMALLEST_STORAGE_GIB or (gib > 0 and gib % STORAGE_STEP_GIB == 0):
        return None
    return f"must be {SMALLEST_STORAGE_GIB} or a multiple of {STORAGE_STEP_GIB}"


def throughput_problem(mb_per_tib: int) -> str | None:
    """What a PERSISTENT_2 throughput must be, or None when it is one of PERSISTENT_2_THROUGHPUTS."""
    if mb_per_tib in PERSISTENT_2_THROUGHPUTS:
        return None
    *most, last = PERSISTENT_2_THROUGHPUTS
    return f"must be {', '.join(map(str, most))} or {last} (MB/s per TiB, PERSISTENT_2)"


@dataclass(frozen=True, kw_only=True)
class LustreProps:
    """The file system's size and kind: what a platform team sets (platform_config's `fsx_*`, no defaults here).
    Checked against the LustreFileSystem L2's rules (storage_problem, throughput_problem) before the L2 checks them
    again."""

    storage_capacity_gib: int
    """Storage capacity in GiB: SMALLEST_STORAGE_GIB or a multiple of STORAGE_STEP_GIB."""
    deployment_type: fsx.LustreDeploymentType
    """PERSISTENT_2 (linked through a data repository association) or SCRATCH_2 (through its import/export path)."""
    throughput_per_tib: int
    """PERSISTENT_2's throughput, MB/s per TiB of storage (one of PERSISTENT_2_THROUGHPUTS); SCRATCH_2 ignores it."""

    def __post_init__(self) -> None:
        if self.deployment_type not in DEPLOYMENT_TYPES:
            raise ValueError(f"deployment_type {self.deployment_type}: use PERSISTENT_2 or SCRATCH_2 (the two this "
                             "construct links to S3)")
        if problem := storage_problem(self.storage_capacity_gib):
            raise ValueError(f"storage_capacity_gib={self.storage_capacity_gib}: {problem}")
        if self.persistent and (problem := throughput_problem(self.throughput_per_tib)):
            raise ValueError(f"throughput_per_tib={self.throughput_per_tib}: {problem}")

    @property
    def persistent(self) -> bool:
        return self.deployment_type == fsx.LustreDeploymentType.PERSISTENT_2


@dataclass(frozen=True, kw_only=True)
class DatasetFileSystemProps:
    vpc: ec2.IVpc
    """The VPC of the file system's security group."""
    subnet: ec2.ISubnet
    """The one subnet (hence AZ) the file system lives in."""
    training_security_group: ec2.ISecurityGroup
    """The group of the training instances that mount it: opened to the file system on the Lustre ports."""
    dataset_bucket: s3.IBucket
    """The bucket whose `dataset_prefix` the file system links."""
    dataset_prefix: str
    """The key prefix of `dataset_bucket` linked at LINKED_PATH (e.g. 'datasets/')."""
    lustre: LustreProps
    """Storage, deployment type and throughput."""
    encryption_key: kms.IKey | None = None
    """The key a PERSISTENT_2 file system is encrypted with (SCRATCH_2 takes none). @default an FSx-managed key"""
    removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN
    """What deleting the stack does to the file system. @default RETAIN"""


@jsii.implements(ec2.IConnectable)
class DatasetFileSystem(Construct):
    """Lustre with LZ4 compression that the training security group can mount. PERSISTENT_2 links `dataset_prefix`
    of the bucket through a data repository association with automatic import and export, encrypted with
    `encryption_key`; SCRATCH_2 through its import/export path, with an FSx-managed key.

    `connections` is the file system's security group (no default port: Lustre clients need LUSTRE_PORTS): allow
    another client with `connections.allow_from(client, port)` for each of them.
    """

    def __init__(self, scope: Construct, id: str, props: DatasetFileSystemProps) -> None:
        super().__init__(scope, id)
        vpc, dataset_bucket, dataset_prefix = props.vpc, props.dataset_bucket, props.dataset_prefix
        deployment_type, persistent = props.lustre.deployment_type, props.lustre.persistent
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False,
            description="FSx for Lustre: Lustre ports from the training instances and between file servers")
        s3_path = f"s3://{dataset_bucket.bucket_name}/{dataset_prefix}"
        lustre = fsx.LustreConfiguration(
            deployment_type=deployment_type,
            data_compression_type=fsx.LustreDataCompressionType.LZ4,
            per_unit_storage_throughput=props.lustre.throughput_per_tib if persistent else None,
            # SCRATCH_2 has no association: the bucket prefix is its import and export path.
            import_path=None if persistent else s3_path,
            export_path=None if persistent else s3_path,
            auto_import_policy=None if persistent else fsx.LustreAutoImportPolicy.NEW_CHANGED_DELETED)
        self.file_system = fsx.LustreFileSystem(
            self, "FileSystem", vpc=vpc, vpc_subnet=props.subnet,
            storage_capacity_gib=props.lustre.storage_capacity_gib, lustre_configuration=lustre, security_group=self.security_group,
            # SCRATCH file systems are always encrypted with an FSx-managed key and take no KMS key.
            kms_key=props.encryption_key if persistent else None, removal_policy=props.removal_policy)
        self._connections = ec2.Connections(security_groups=[self.security_group])
        self._open_lustre_ports(props.training_security_group)
        self.linked_path = LINKED_PATH
        self.association = self._link(s3_path) if persistent else None

    def _open_lustre_ports(self, training_security_group: ec2.ISecurityGroup) -> None:
        for port in LUSTRE_PORTS:
            # Ingress on the file system's group from the training group, and the training group's egress to it.
            self.connections.allow_from(
                training_security_group, port, "Lustre: training instances to the dataset file system")
            # The L2 opens only ingress between its file servers; its group allows no outbound by default.
            self.security_group.add_egress_rule(self.security_group, port, "Lustre between file servers")

    @property
    def connections(self) -> ec2.Connections:
        """The file system's security group."""
        return self._connections

    def _link(self, s3_path: str) -> fsx.CfnDataRepositoryAssociation:
        return fsx.CfnDataRepositoryAssociation(
            self, "DatasetLink", file_system_id=self.file_system.file_system_id,
            file_system_path=f"/{LINKED_PATH}", data_repository_path=s3_path,
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(events=_SYNC_EVENTS),
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(events=_SYNC_EVENTS)))
