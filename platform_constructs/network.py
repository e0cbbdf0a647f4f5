"""The training network: a VPC that EFA traffic can cross, endpoints, flow logs, the training security group."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from platform_constructs.config import PlatformConfig
from platform_constructs.nag import acknowledge
from platform_constructs.retention import retention

# What a training job and the launcher call when there is no NAT: SageMaker's API, image pulls,
# logs and metrics, STS for role credentials, and Step Functions. S3 goes through the gateway endpoint.
INTERFACE_ENDPOINTS = {
    "SageMakerApi": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_API,
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "StepFunctions": ec2.InterfaceVpcEndpointAwsService.STEP_FUNCTIONS,
}
TRAINING_SUBNETS = "training"


class TrainingNetwork(Construct):
    """VPC with one training subnet per AZ sized for the largest EFA cluster, and the training security group.

    The training group allows all traffic in and out to itself: EFA's OS-bypass traffic is not covered by an
    egress rule to 0.0.0.0/0, and without the self rules EFA health checks fail or NCCL hangs.
    """

    def __init__(self, scope: Construct, id: str, *, config: PlatformConfig, key: kms.IKey) -> None:
        super().__init__(scope, id)
        private_type = (ec2.SubnetType.PRIVATE_WITH_EGRESS if config.nat_gateways
                        else ec2.SubnetType.PRIVATE_ISOLATED)
        subnets = [ec2.SubnetConfiguration(name=TRAINING_SUBNETS, subnet_type=private_type,
                                           cidr_mask=config.private_subnet_mask)]
        if config.nat_gateways:
            subnets.insert(0, ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC,
                                                      cidr_mask=26, map_public_ip_on_launch=False))
        zones = {"availability_zones": list(config.availability_zones)} if config.availability_zones \
            else {"max_azs": config.az_count}
        self.vpc = ec2.Vpc(
            self, "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(config.vpc_cidr),
            nat_gateways=config.nat_gateways,
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

        flow_log_group = logs.LogGroup(
            self, "FlowLogs", encryption_key=key,
            retention=retention(config.flow_log_retention_days),
            removal_policy=cdk.RemovalPolicy.RETAIN if config.retain_data else cdk.RemovalPolicy.DESTROY)
        flow_log = self.vpc.add_flow_log(
            "FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL)
        acknowledge(flow_log, "NIST.800.53.R5-IAMNoInlinePolicy",
                    "The flow log role's policy is written by the CDK for this one role and scoped to its log "
                    "group; a managed policy could be attached elsewhere.")

        self.training_security_group = ec2.SecurityGroup(
            self, "TrainingSecurityGroup", vpc=self.vpc, allow_all_outbound=False,
            description="SageMaker training instances: all traffic to and from itself (EFA, NCCL), HTTPS out")
        sg = self.training_security_group
        sg.add_ingress_rule(sg, ec2.Port.all_traffic(), "EFA and NCCL between training instances")
        self_ingress = [c for c in sg.node.children if c.node.id.endswith(":ALL TRAFFIC")
                        and isinstance(c, ec2.CfnSecurityGroupIngress)]
        for rule in self_ingress:
            acknowledge(rule, "NIST.800.53.R5-EC2RestrictedCommonPorts",
                        "This all-port ingress rule's source is the training security group itself: EFA needs "
                        "all traffic between the training instances; nothing outside the group reaches these ports.")
        sg.add_egress_rule(sg, ec2.Port.all_traffic(), "EFA and NCCL between training instances")
        # With NAT this reaches ECR, S3 and package indexes; with no NAT the only routes out of the
        # training subnets are the S3 gateway endpoint and the interface endpoints below.
        sg.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs, S3 and ECR")

        if not config.nat_gateways:
            endpoint_sg = ec2.SecurityGroup(self, "EndpointSecurityGroup", vpc=self.vpc, allow_all_outbound=False,
                                            description="Interface endpoints: HTTPS from inside the VPC")
            endpoint_sg.add_ingress_rule(ec2.Peer.ipv4(config.vpc_cidr), ec2.Port.tcp(443),
                                         "HTTPS from the VPC")
            for name, service in INTERFACE_ENDPOINTS.items():
                self.vpc.add_interface_endpoint(name, service=service, subnets=ec2.SubnetSelection(
                    subnet_group_name=TRAINING_SUBNETS), security_groups=[endpoint_sg], private_dns_enabled=True, open=False)

