"""The training network: a VPC that EFA traffic can cross, endpoints, flow logs, the training security group."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import aws_cdk as cdk
import jsii
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from platform_constructs.nag import acknowledge

# What a training job and the launcher call when there is no NAT: SageMaker's API, image pulls,
# logs and metrics, STS for role credentials, Step Functions and Secrets Manager. S3 goes through the gateway
# endpoint.
INTERFACE_ENDPOINTS = {
    "SageMakerApi": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_API,
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "StepFunctions": ec2.InterfaceVpcEndpointAwsService.STEP_FUNCTIONS,
    # A request's `secrets` are read in the container at start (jobs.render.container_entry).
    "SecretsManager": ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER,
}
TRAINING_SUBNETS = "training"
EGRESS_MODES = ("internet", "endpoints")
PUBLIC_SUBNET_MASK = 26  # a public subnet holds only a NAT gateway
# Private IPs one EFA-enabled training instance may take (a p5.48xlarge has 32 EFA network cards).
# AWS does not publish SageMaker's exact per-instance use: this is an upper bound, not a measurement.
IPS_PER_EFA_INSTANCE = 32
AWS_RESERVED_IPS_PER_SUBNET = 5
# Training subnets in at least two AZs; at most six.
MIN_AZ_COUNT, MAX_AZ_COUNT = 2, 6


def addresses_needed(az_count: int, training_subnet_mask: int) -> int:
    """The VPC addresses the subnets take: each AZ has a training subnet of that mask and a small public one."""
    return az_count * (2 ** (32 - training_subnet_mask) + 2 ** (32 - PUBLIC_SUBNET_MASK))


def training_subnet_mask(largest_cluster_instances: int) -> int:
    """The largest prefix length (smallest subnet) that fits the largest cluster's EFA interfaces."""
    needed = largest_cluster_instances * IPS_PER_EFA_INSTANCE + AWS_RESERVED_IPS_PER_SUBNET
    mask = 28
    while mask > 16 and 2 ** (32 - mask) < needed:
        mask -= 1
    return mask


@dataclass(frozen=True, kw_only=True)
class TrainingNetworkProps:
    """The network's shape has no defaults here: its defaults are the platform config's (vpc_cidr, az_count, ...)."""

    cidr: str
    """The VPC's IPv4 block: large enough for az_count training subnets of the mask the largest cluster needs."""
    az_count: int
    """How many AZs get a training subnet: MIN_AZ_COUNT to MAX_AZ_COUNT."""
    availability_zones: Sequence[str]
    """Which AZs (exactly az_count of them), or empty to let the VPC pick az_count."""
    nat_gateways: int
    """NAT gateways, 0 to az_count; 0 makes the training subnets isolated (VPC endpoints only)."""
    largest_cluster_instances: int
    """The most EFA instances one job may use: sizes each training subnet (training_subnet_mask)."""
    flow_log_retention: logs.RetentionDays
    """How long the VPC flow logs are kept."""
    egress: str
    """One of EGRESS_MODES: `internet` (through NAT) or `endpoints` (no NAT: VPC endpoints only)."""
    encryption_key: kms.IKey | None = None
    """The key the flow log group is encrypted with. @default CloudWatch Logs' own encryption"""
    removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN
    """What deleting the stack does to the flow log group. @default RETAIN"""

    def __post_init__(self) -> None:
        if self.egress not in EGRESS_MODES:
            raise ValueError(f"egress={self.egress!r}: use one of {', '.join(EGRESS_MODES)}")
        if self.egress == "endpoints" and self.nat_gateways:
            raise ValueError(f"egress='endpoints' with nat_gateways={self.nat_gateways}: the training subnets get no "
                             "route to a NAT gateway; use nat_gateways=0")
        _validate(self.cidr, self.az_count, self.availability_zones, self.nat_gateways, self.training_subnet_mask)

    @property
    def training_subnet_mask(self) -> int:
        """The training subnets' prefix length (training_subnet_mask of largest_cluster_instances)."""
        return training_subnet_mask(self.largest_cluster_instances)

    @property
    def endpoints_only(self) -> bool:
        """With no NAT there is no other way out than the endpoints, whatever egress says."""
        return self.egress == "endpoints" or not self.nat_gateways


@jsii.implements(ec2.IConnectable)
class TrainingNetwork(Construct):
    """VPC with one training subnet per AZ sized for the largest EFA cluster, and the training security group.

    The training group allows all traffic in and out to itself: EFA's OS-bypass traffic is not covered by an
    egress rule to 0.0.0.0/0, and without the self rules EFA health checks fail or NCCL hangs. With no NAT
    gateway the training subnets are isolated and reach AWS through VPC endpoints. `connections` is the training
    security group (the training instances; a team's own comes from add_training_security_group): open what a job
    reaches to it, e.g. `file_system.connections.allow_from(network, port)`.
    """

    def __init__(self, scope: Construct, id: str, props: TrainingNetworkProps) -> None:
        super().__init__(scope, id)
        cidr, az_count, nat_gateways = props.cidr, props.az_count, props.nat_gateways
        availability_zones = props.availability_zones
        self.endpoints_only = props.endpoints_only
        self.training_subnet_mask = props.training_subnet_mask
        private_type = ec2.SubnetType.PRIVATE_WITH_EGRESS if nat_gateways else ec2.SubnetType.PRIVATE_ISOLATED
        subnets = [ec2.SubnetConfiguration(name=TRAINING_SUBNETS, subnet_type=private_type,
                                           cidr_mask=self.training_subnet_mask)]
        if nat_gateways:
            subnets.insert(0, ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC,
                                                      cidr_mask=PUBLIC_SUBNET_MASK, map_public_ip_on_launch=False))
        zones = {"availability_zones": list(availability_zones)} if availability_zones else {"max_azs": az_count}
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            nat_gateways=nat_gateways,
            subnet_configuration=subnets,
            restrict_default_security_group=True,
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
            **zones,
        )
        self.subnets = self.vpc.select_subnets(subnet_group_name=TRAINING_SUBNETS)
        for subnet in self.vpc.public_subnets:
            acknowledge(subnet, "NIST.800.53.R5-VPCNoUnrestrictedRouteToIGW",
                        "Public subnets hold only the NAT gateways (no instances, no public IPs on launch); their "
                        "default route to the internet gateway is what NAT needs.")
        self._add_flow_log(props.flow_log_retention, props.encryption_key, props.removal_policy)
        self.s3_endpoint: ec2.GatewayVpcEndpoint = self.vpc.node.find_child("S3")
        self.training_security_group = self.add_training_security_group("TrainingSecurityGroup")
        self._connections = ec2.Connections(security_groups=[self.training_security_group])
        if self.endpoints_only:
            self._add_interface_endpoints(cidr)

    def _add_flow_log(self, retention: logs.RetentionDays, key: kms.IKey | None,
                      removal_policy: cdk.RemovalPolicy) -> None:
        flow_log_group = logs.LogGroup(self, "FlowLogs", encryption_key=key, retention=retention,
                                       removal_policy=removal_policy)
        flow_log = self.vpc.add_flow_log(
            "FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL)
        acknowledge(flow_log, "NIST.800.53.R5-IAMNoInlinePolicy",
                    "The flow log role's policy is written by the CDK for this one role and scoped to its log "
                    "group; a managed policy could be attached elsewhere.")

    def add_training_security_group(self, id: str, whose: str = "SageMaker training instances") -> ec2.SecurityGroup:
        """A training security group: all traffic to and from itself (EFA, NCCL), HTTPS out. One per team keeps a
        team's running jobs from connecting to another team's (whose ports, e.g. torchrun's, take no credentials)."""
        sg = ec2.SecurityGroup(
            self, id, vpc=self.vpc, allow_all_outbound=False,
            description=f"{whose}: all traffic to and from itself (EFA, NCCL), HTTPS out")
        sg.add_ingress_rule(sg, ec2.Port.all_traffic(), "EFA and NCCL between training instances")
        self_ingress = [c for c in sg.node.children if c.node.id.endswith(":ALL TRAFFIC")
                        and isinstance(c, ec2.CfnSecurityGroupIngress)]
        for rule in self_ingress:
            acknowledge(rule, "NIST.800.53.R5-EC2RestrictedCommonPorts",
                        "This all-port ingress rule's source is the training security group itself: EFA needs "
                        "all traffic between the training instances; nothing outside the group reaches these ports.")
        sg.add_egress_rule(sg, ec2.Port.all_traffic(), "EFA and NCCL between training instances")
        # With NAT (egress: internet) this reaches ECR, S3 and package indexes; endpoints only, the training
        # subnets have no route out but the S3 gateway endpoint and the interface endpoints, whose policies say
        # what may pass.
        sg.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs, S3 and ECR")
        return sg

    @property
    def connections(self) -> ec2.Connections:
        """The training security group (the default team's; a team's own is add_training_security_group's)."""
        return self._connections

    def restrict_s3_endpoint(self, object_arns: list[str], bucket_arns: list[str]) -> None:
        """The S3 gateway endpoint admits only these objects and buckets (the platform's, the source bundle's, the
        ECR layer bucket): a job cannot copy data to a bucket of its own choosing through it."""
        self.s3_endpoint.add_to_policy(iam.PolicyStatement(
            sid="PlatformObjects", principals=[iam.StarPrincipal()],
            actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
            resources=object_arns))
        self.s3_endpoint.add_to_policy(iam.PolicyStatement(
            sid="PlatformBuckets", principals=[iam.StarPrincipal()],
            actions=["s3:ListBucket", "s3:GetBucketLocation"], resources=bucket_arns))

    def _add_interface_endpoints(self, cidr: str) -> None:
        endpoint_sg = ec2.SecurityGroup(self, "EndpointSecurityGroup", vpc=self.vpc, allow_all_outbound=False,
                                        description="Interface endpoints: HTTPS from inside the VPC")
        endpoint_sg.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "HTTPS from the VPC")
        for name, service in INTERFACE_ENDPOINTS.items():
            endpoint = self.vpc.add_interface_endpoint(
                name, service=service, subnets=ec2.SubnetSelection(subnet_group_name=TRAINING_SUBNETS),
                security_groups=[endpoint_sg], private_dns_enabled=True, open=False)
            # Only this account's principals: credentials of another account cannot carry data out through it.
            endpoint.add_to_policy(iam.PolicyStatement(
                sid="ThisAccountOnly", principals=[iam.StarPrincipal()], actions=["*"], resources=["*"],
                conditions={"StringEquals": {"aws:PrincipalAccount": cdk.Aws.ACCOUNT_ID}}))


def _validate(cidr: str, az_count: int, zones: Sequence[str], nat_gateways: int, mask: int) -> None:
    """What the VPC L2 would accept but a training network cannot use, each with what to change."""
    if not MIN_AZ_COUNT <= az_count <= MAX_AZ_COUNT:
        raise ValueError(f"az_count={az_count}: use {MIN_AZ_COUNT} to {MAX_AZ_COUNT} (training subnets in at least "
                         "two AZs)")
    if zones and len(zones) != az_count:
        raise ValueError(f"availability_zones lists {len(zones)} zones: list exactly az_count={az_count}")
    if not 0 <= nat_gateways <= az_count:
        raise ValueError(f"nat_gateways={nat_gateways}: use 0 (VPC endpoints only) to az_count={az_count}")
    if cdk.Token.is_unresolved(cidr):
        return
    needed = addresses_needed(az_count, mask)
    if needed > ipaddress.ip_network(cidr).num_addresses:
        raise ValueError(f"cidr {cidr} is too small: {az_count} AZs x a /{mask} training subnet need {needed} "
                         "addresses; use a larger block or a smaller largest_cluster_instances")
