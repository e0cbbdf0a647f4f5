"""AWS clients and the deployed platform's SSM parameters.

The CDK app publishes `/<prefix>/platform-settings` and `/<prefix>/state-machine-arn`; every
command that talks to the deployed platform finds it through them, so the only thing a user
needs to know is the prefix (default `mltrain`, or env TRAINCTL_PREFIX) and the region.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from cli.errors import UserError

DEFAULT_PREFIX = "mltrain"

# Adaptive retries ride out the throttling a polling CLI can meet; the calls are all idempotent reads
# except StartExecution (named executions are idempotent too) and the stops.
_CONFIG = Config(retries={"mode": "adaptive", "max_attempts": 8}, user_agent_extra="trainctl")


def resolve_region(option: str | None, platform_region: str | None = None) -> str | None:
    """The region every AWS command uses: --region, then the --platform file's (submit), then AWS_REGION.

    None leaves it to boto3, which reads AWS_DEFAULT_REGION, then the profile's config file. boto3 itself
    ignores AWS_REGION (only the AWS SDKs of other languages and the CLI v2 read it), yet it is what most
    people set, so trainctl reads it here. An empty value counts as unset, as the SDKs treat it.
    """
    return option or platform_region or os.environ.get("AWS_REGION") or None


@dataclass
class Aws:
    """One boto3 session and its clients, created on first use (no AWS call until a command needs one).

    `region` is the --region option (None when not given); `platform_region` is the region written in a
    --platform file, which `submit` starts the execution in unless --region says otherwise.
    """

    region: str | None = None
    prefix: str = DEFAULT_PREFIX
    platform_region: str | None = None
    _session: Any = None
    _clients: dict[str, Any] = field(default_factory=dict)

    @property
    def session(self) -> boto3.Session:
        if self._session is None:
            self._session = boto3.Session(region_name=resolve_region(self.region, self.platform_region))
        return self._session

    def use_platform_region(self, region: str, where: str) -> str | None:
        """Take the region of a platform-settings file; returns a note for the user when another source
        disagrees with it (--region wins over the file; the file wins over the environment)."""
        if self._session is not None:
            raise RuntimeError("use_platform_region must come before the first AWS client")
        if self.region:
            return (f"--region {self.region} differs from the region of {where} ({region}); using {self.region}"
                    if self.region != region else None)
        self.platform_region = region
        environment = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if environment and environment != region:
            return (f"using region {region} from {where}, not {environment} from the environment "
                    "(pass --region to choose another)")
        return None

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(service, config=_CONFIG)
        return self._clients[service]

    @property
    def region_name(self) -> str:
        return self.client("stepfunctions").meta.region_name

    def parameter(self, name: str) -> str:
        """An SSM parameter's value; a missing one means the platform is not deployed with this prefix/region."""
        full = f"/{self.prefix}/{name}"
        try:
            return self.client("ssm").get_parameter(Name=full)["Parameter"]["Value"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ParameterNotFound":
                raise UserError(
                    f"SSM parameter {full} not found in {self.client('ssm').meta.region_name}: "
                    "the platform is not deployed there",
                    "deploy the stack (cdk deploy), or pass --prefix / --region for the deployed one",
                ) from None
            raise

    def state_machine_arn(self, override: str | None = None) -> str:
        return override or self.parameter("state-machine-arn")

    def execution_arn(self, ref: str, state_machine: str | None = None) -> str:
        """An execution ARN from an ARN or a bare execution name (of the platform's state machine)."""
        if ref.startswith("arn:"):
            if ":execution:" not in ref:
                raise UserError(f"not a Step Functions execution ARN: {ref}")
            return ref
        machine = self.state_machine_arn(state_machine)
        return f"{machine.replace(':stateMachine:', ':execution:', 1)}:{ref}"


def console_url(execution_arn: str) -> str:
    """The Step Functions console page of an execution."""
    region = execution_arn.split(":")[3]
    return (f"https://{region}.console.aws.amazon.com/states/home?region={region}"
            f"#/v2/executions/details/{execution_arn}")
