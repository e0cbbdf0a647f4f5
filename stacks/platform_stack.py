"""The platform stack: network, key, buckets, dataset file system, execution role, capacity, published settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from jobs.platform import FsxSettings, PlatformSettings, TrainingPlan
from jobs.render.images import PYTORCH_FRAMEWORK, SMP_FRAMEWORK
from platform_constructs.buckets import AccessLogBucket, AccessLogBucketProps, SecureBucket, SecureBucketProps
from platform_constructs.dataset_fs import DatasetFileSystem, DatasetFileSystemProps, LustreProps
from platform_constructs.encryption import PlatformKey, PlatformKeyProps, TeamKey, TeamKeyProps, key_user_path
from platform_constructs.images import ImageMapping, ImageTable
from platform_constructs.network import TrainingNetwork, TrainingNetworkProps
from platform_constructs.roles import ExecutionRole, ExecutionRoleProps
from platform_constructs.source_bundle import TrainingSourceBundle, TrainingSourceBundleProps
from platform_constructs.teams import TeamSpec
from stacks.resources import PlatformResources, TeamResources


# The props carry no defaults: each value's default is its platform_config field's, which app.py passes on (one home
# per default; tests/infra/test_one_home.py keeps it so).
@dataclass(frozen=True)
class JobDefaults:
    """What jobs may use and get by default: the platform settings' policy part (instance types are the teams')."""
    training_plans: Sequence[TrainingPlan]
    default_warm_pool_minutes: int
    # Names or PREFIX* patterns a request's environment may set on top of jobs.request.environment_rules' allow-list.
    environment_patterns: Sequence[str]
    # Where every run logs its MLflow run (None: nowhere); an ARN's server is the one the execution roles may log to.
    mlflow_tracking_server: str | None


class PlatformStack(cdk.Stack):
    """`network`: the training network's props, whose key and removal policy the stack sets (its own); `egress:
    endpoints` there (or no NAT) also limits the S3 gateway endpoint to the platform's buckets. `file_system=None`
    builds no FSx; `dataset_bucket_name` imports a bucket instead of creating one; `kms_key_arn` imports a key instead
    of creating one. `teams`: one execution role, settings document and set of SSM parameters per team (the default
    team alone, PlatformConfig.team_specs', has the names and ids the stack always had). Every prop is required: the
    defaults are the platform config's (app.py)."""

    def __init__(self, scope: Construct, id: str, *, name_prefix: str, images: ImageTable,
                 network: TrainingNetworkProps, file_system: LustreProps | None, jobs: JobDefaults,
                 dataset_prefix: str, dataset_bucket_name: str | None, kms_key_arn: str | None,
                 teams: Sequence[TeamSpec], removal_policy: cdk.RemovalPolicy, **kwargs) -> None:
        super().__init__(scope, id, description=f"{name_prefix} training platform: network, storage, "
                                                f"roles, capacity", **kwargs)
        self.name_prefix = name_prefix
        self.dataset_prefix = dataset_prefix
        teams = tuple(teams)
        if not teams:
            raise ValueError("teams is empty: give at least the default team (PlatformConfig.team_specs), whose names "
                             "are the platform's own (platform_constructs.teams)")
        role_path = key_user_path(name_prefix)
        key = PlatformKey(self, "Key", PlatformKeyProps(
            name_prefix=name_prefix, imported_key_arn=kms_key_arn, user_path=role_path,
            budgets=any(t.monthly_budget_usd for t in teams), removal_policy=removal_policy)).key
        net = TrainingNetwork(self, "Network", replace(network, encryption_key=key, removal_policy=removal_policy))
        access_logs = AccessLogBucket(self, "AccessLogs", AccessLogBucketProps(removal_policy=removal_policy)).bucket

        def bucket(name: str, encryption_key: kms.IKey = key) -> s3.IBucket:
            return SecureBucket(self, name, SecureBucketProps(
                encryption_key=encryption_key, access_logs=access_logs, access_logs_prefix=name.lower(),
                removal_policy=removal_policy)).bucket

        # A team with its own key (team_keys) gets its own checkpoint and output buckets encrypted with it (a bucket's
        # default encryption is what SageMaker's checkpoint sync writes with); the others share the platform's.
        data_keys = {team.name: TeamKey(self, f"{team.construct_id}DataKey", TeamKeyProps(
            name_prefix=team.name_prefix, user_path=role_path, team_tag=next(iter(team.job_tags.items())),
            removal_policy=removal_policy)).key for team in teams if team.own_key}
        shared = (bucket("Checkpoints"), bucket("Outputs")) if len(data_keys) < len(teams) else None
        team_buckets = {team.name: (bucket(f"{team.construct_id}Checkpoints", data_keys[team.name]),
                                    bucket(f"{team.construct_id}Outputs", data_keys[team.name]))
                        if team.own_key else shared for team in teams}
        datasets = (s3.Bucket.from_bucket_name(self, "Datasets", dataset_bucket_name) if dataset_bucket_name
                    else bucket("Datasets"))
        image_mapping = images.to_mapping(self, "Images")
        subnets = net.subnets.subnets
        # One training security group per team (the default team's is the network's own), so that a team's
        # running jobs cannot open connections to another team's.
        groups = [net.training_security_group if team.name is None else net.add_training_security_group(
            f"{team.construct_id}TrainingSecurityGroup", f"{team.name_prefix} training instances") for team in teams]
        # One execution role per team: its own checkpoint and output prefixes and its own datasets; tagged with the
        # team's cost tag, which its data key's policy asks of a role that uses it.
        roles = [self._execution_role(team, key, data_keys.get(team.name), datasets, team_buckets[team.name],
                                      image_mapping, net, subnets, group, role_path, jobs.mlflow_tracking_server)
                 for team, group in zip(teams, groups, strict=True)]
        source = TrainingSourceBundle(self, "TrainingSource", TrainingSourceBundleProps(readers=roles))
        if net.endpoints_only:
            platform_buckets = [*dict.fromkeys(b for pair in team_buckets.values() for b in pair), datasets]
            net.restrict_s3_endpoint(
                object_arns=[b.arn_for_objects("*") for b in platform_buckets]
                + [source.object_arn, ecr_layers_arn()],
                bucket_arns=[b.bucket_arn for b in platform_buckets] + [source.asset.bucket.bucket_arn])
        fsx_settings = None
        if file_system is not None:
            dataset_fs = DatasetFileSystem(self, "DatasetFileSystem", DatasetFileSystemProps(
                vpc=net.vpc, subnet=subnets[0], training_security_group=net.training_security_group,
                dataset_bucket=datasets, dataset_prefix=dataset_prefix, lustre=file_system, encryption_key=key,
                removal_policy=removal_policy))
            fsx_settings = FsxSettings(file_system_id=dataset_fs.file_system.file_system_id,
                                       mount_name=dataset_fs.file_system.mount_name,
                                       linked_path=dataset_fs.linked_path)
        team_resources = []
        for team, role, group in zip(teams, roles, groups, strict=True):
            settings = self._settings(team=team, role=role, subnets=subnets, group=group, key=key,
                                      data_key=data_keys.get(team.name),
                                      buckets=(*team_buckets[team.name], datasets), source=source, images=images,
                                      image_mapping=image_mapping, fsx_settings=fsx_settings, jobs=jobs)
            team_resources.append(TeamResources(spec=team, execution_role=role, settings=settings))
        self.resources = PlatformResources(key=key, dataset_bucket=datasets, teams=tuple(team_resources),
                                           role_path=role_path)
        for team in team_resources:
            self._publish(team)

    def _execution_role(self, team: TeamSpec, key: kms.IKey, data_key: kms.IKey | None, datasets: s3.IBucket,
                        buckets: tuple[s3.IBucket, s3.IBucket], image_mapping: ImageMapping, net: TrainingNetwork,
                        subnets: list[ec2.ISubnet], group: ec2.ISecurityGroup, role_path: str,
                        mlflow_tracking_server: str | None) -> iam.IRole:
        checkpoints, outputs = buckets
        role = ExecutionRole(self, f"{team.construct_id}Execution", ExecutionRoleProps(
            name_prefix=team.name_prefix, key=key, dataset_bucket=datasets, dataset_prefix=team.dataset_prefix,
            checkpoint_bucket=checkpoints, output_bucket=outputs, data_key=data_key,
            image_accounts={fw: image_mapping.account(fw) for fw in (PYTORCH_FRAMEWORK, SMP_FRAMEWORK)},
            vpc=net.vpc, subnets=subnets, security_groups=[group], role_path=role_path,
            image_repositories=team.image_repositories, mlflow_tracking_server=mlflow_tracking_server)).role
        for tag, value in team.job_tags.items():
            cdk.Tags.of(role).add(tag, value)
        return role

    def _settings(self, *, team: TeamSpec, role: iam.IRole, subnets: list[ec2.ISubnet], group: ec2.ISecurityGroup,
                  key: kms.IKey, data_key: kms.IKey | None, buckets: tuple[s3.IBucket, s3.IBucket, s3.IBucket], source: TrainingSourceBundle,
                  images: ImageTable, image_mapping: ImageMapping, fsx_settings: FsxSettings | None,
                  jobs: JobDefaults) -> PlatformSettings:
        """One team's platform settings document: values are tokens the deploy resolves. Its name_prefix is the
        team's, so jobs.render.training_job names its jobs, checkpoints and outputs under the team's prefix."""
        checkpoints, outputs, datasets = buckets
        return PlatformSettings(
            name_prefix=team.name_prefix,
            region=cdk.Aws.REGION,
            execution_role_arn=role.role_arn,
            subnet_ids=[s.subnet_id for s in subnets],
            security_group_ids=[group.security_group_id],
            kms_key_arn=key.key_arn,
            data_kms_key_arn=None if data_key is None else data_key.key_arn,
            checkpoint_bucket=checkpoints.bucket_name,
            output_bucket=outputs.bucket_name,
            dataset_bucket=datasets.bucket_name,
            dataset_prefix=team.dataset_prefix,
            source_dir_s3_uri=source.s3_uri,
            images=image_mapping.settings(),
            default_framework_version=images.versions[PYTORCH_FRAMEWORK][0],
            default_smp_version=images.versions[SMP_FRAMEWORK][0],
            allowed_instance_types=list(team.allowed_instance_types),
            fsx=fsx_settings,
            training_plans={plan.name: plan for plan in jobs.training_plans},
            default_warm_pool_minutes=jobs.default_warm_pool_minutes,
            environment_patterns=list(jobs.environment_patterns),
            mlflow_tracking_uri=jobs.mlflow_tracking_server,
            allowed_image_repositories=list(team.image_repositories),
            job_tags=dict(team.job_tags),
        )

    def _publish(self, team: TeamResources) -> None:
        """Stack outputs for people, SSM parameters under /<team prefix>/ for trainctl and the launcher (the
        default team's are /<name_prefix>/, where they always were). A team's construct ids start with its
        construct id, the default team's are the ones they had before teams existed."""
        settings, scope = team.settings, team.spec.construct_id
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
            cdk.CfnOutput(self, f"{scope}{name}", value=value)
            ssm.StringParameter(self, f"{scope}{name}Parameter", string_value=value,
                                parameter_name=f"/{settings.name_prefix}/{_kebab(name)}")
        document = self.to_json_string(settings.to_dict())
        cdk.CfnOutput(self, f"{scope}PlatformSettings", value=document,
                      description="The platform settings document (trainctl render --platform FILE)")
        ssm.StringParameter(self, f"{scope}PlatformSettingsParameter", string_value=document,
                            parameter_name=f"/{settings.name_prefix}/platform-settings",
                            description="Platform settings for the job launcher and trainctl (JSON)")
        cdk.CfnOutput(self, f"{scope}TrainingPlans", value=self.to_json_string(_plans(settings.training_plans)),
                      description="Registered SageMaker training plans (capacity reservations)")


def _plans(plans: Mapping[str, TrainingPlan]) -> dict[str, dict]:
    """Each plan by name: its ARN and capacity (the name is the key)."""
    return {name: {"arn": p.arn, "instance_type": p.instance_type, "instance_count": p.instance_count}
            for name, p in plans.items()}


def ecr_layers_arn() -> str:
    """ECR serves image layers from this AWS-owned bucket through the S3 gateway endpoint (ECR user guide,
    "Amazon ECR interface VPC endpoints": the minimum S3 endpoint policy)."""
    return f"arn:{cdk.Aws.PARTITION}:s3:::prod-{cdk.Aws.REGION}-starport-layer-bucket/*"


def _kebab(name: str) -> str:
    return "".join(f"-{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))
