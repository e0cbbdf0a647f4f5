"""The platform configuration: every value a platform team changes, read from CDK context.

Defaults live in cdk.json ("context"); `npx cdk synth -c key=value` overrides one. Values given
with -c arrive as strings, so each field parses its own text form (JSON for lists and maps).
All problems are collected and reported together before any construct is built.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# CloudWatch Logs accepts only these retention periods (days).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
                      2922, 3288, 3653)
FSX_DEPLOYMENT_TYPES = ("PERSISTENT_2", "SCRATCH_2")
FSX_THROUGHPUT_PER_TIB = (125, 250, 500, 1000)  # PERSISTENT_2, MB/s per TiB
TRAINING_PLAN_ARN = re.compile(
    r"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:training-plan/[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9-]+\.[0-9]*x?large$|^ml\.[a-z0-9-]+\.[0-9]+xlarge$")
NAME_PREFIX = re.compile(r"^[a-z][a-z0-9-]{1,18}[a-z0-9]$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
AZ_NAME = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# Private IPs one EFA-enabled training instance may take (a p5.48xlarge has 32 EFA network cards).
# AWS does not publish SageMaker's exact per-instance use: this is an upper bound, not a measurement.
IPS_PER_EFA_INSTANCE = 32
AWS_RESERVED_IPS_PER_SUBNET = 5


class ConfigError(Exception):
    """One or more bad configuration values; the message lists each with the key and the fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"Invalid platform configuration (cdk.json context or -c overrides):\n{lines}")


@dataclass(frozen=True)
class TrainingPlanConfig:
    name: str
    arn: str
    instance_type: str
    instance_count: int


@dataclass(frozen=True)
class PlatformConfig:
    name_prefix: str = "mltrain"
    region: str | None = None
    availability_zones: tuple[str, ...] = ()
    az_count: int = 2
    vpc_cidr: str = "10.80.0.0/16"
    nat_gateways: int = 1
    largest_cluster_instances: int = 16
    flow_log_retention_days: int = 90
    log_retention_days: int = 365
    fsx_enabled: bool = True
    fsx_storage_gib: int = 1200
    fsx_throughput_per_tib: int = 250
    fsx_deployment_type: str = "PERSISTENT_2"
    dataset_bucket_name: str | None = None
    dataset_prefix: str = "datasets/"
    kms_key_arn: str | None = None
    allowed_instance_types: tuple[str, ...] = ("ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.g5.12xlarge",
                                               "ml.g6e.12xlarge", "ml.c5.2xlarge")
    training_plans: tuple[TrainingPlanConfig, ...] = ()
    default_warm_pool_minutes: int = 0
    notification_email: str | None = None
    pytorch_versions: tuple[str, ...] = ("2.8.0",)
    smp_versions: tuple[str, ...] = ("2.8.0",)
    retain_data: bool = True
    tags: Mapping[str, str] = field(default_factory=lambda: {"project": "ml-training-platform"})

    @property
    def private_subnet_mask(self) -> int:
        """The largest prefix length (smallest subnet) that fits the largest cluster's EFA interfaces."""
        needed = self.largest_cluster_instances * IPS_PER_EFA_INSTANCE + AWS_RESERVED_IPS_PER_SUBNET
        mask = 28
        while mask > 16 and 2 ** (32 - mask) < needed:
            mask -= 1
        return mask


def _bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    low = str(text).strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _int(text: Any) -> int:
    if isinstance(text, bool):
        raise ValueError("must be a whole number")
    if isinstance(text, int):
        return text
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError("must be a whole number") from None


def _optional_str(text: Any) -> str | None:
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "null", "none")):
        return None
    if not isinstance(text, str):
        raise ValueError("must be a string or null")
    return text.strip()


def _json(text: Any) -> Any:
    if isinstance(text, str):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise ValueError("must be JSON (for -c, quote it: -c 'key=[\"a\",\"b\"]')") from None
    return text


def _str_list(text: Any) -> tuple[str, ...]:
    value = _json(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("must be a JSON list of strings")
    return tuple(value)


def _tags(text: Any) -> dict[str, str]:
    value = _json(text)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError('must be a JSON object of string values, e.g. {"team": "ml"}')
    return value


def _plans(text: Any) -> tuple[TrainingPlanConfig, ...]:
    value = _json(text)
    if not isinstance(value, list):
        raise ValueError("must be a JSON list of {name, arn, instance_type, instance_count}")
    plans = []
    for i, item in enumerate(value):
        keys = {"name", "arn", "instance_type", "instance_count"}
        if not isinstance(item, dict) or set(item) != keys:
            raise ValueError(f"entry {i} must have exactly the keys {sorted(keys)}")
        plans.append(TrainingPlanConfig(name=str(item["name"]), arn=str(item["arn"]),
                                        instance_type=str(item["instance_type"]),
                                        instance_count=_int(item["instance_count"])))
    return tuple(plans)


PARSERS: dict[str, Callable[[Any], Any]] = {
    "name_prefix": str, "region": _optional_str, "availability_zones": _str_list, "az_count": _int,
    "vpc_cidr": str, "nat_gateways": _int, "largest_cluster_instances": _int,
    "flow_log_retention_days": _int, "log_retention_days": _int, "fsx_enabled": _bool, "fsx_storage_gib": _int,
    "fsx_throughput_per_tib": _int, "fsx_deployment_type": str, "dataset_bucket_name": _optional_str,
    "dataset_prefix": str, "kms_key_arn": _optional_str, "allowed_instance_types": _str_list,
    "training_plans": _plans, "default_warm_pool_minutes": _int, "notification_email": _optional_str,
    "pytorch_versions": _str_list, "smp_versions": _str_list, "retain_data": _bool, "tags": _tags,
}
assert set(PARSERS) == {f.name for f in fields(PlatformConfig)}


def is_platform_key(key: str) -> bool:
    """Context keys the CDK itself owns (feature flags, CLI settings) are not ours to check."""
    return not (key.startswith("@") or key.startswith("aws:") or key.startswith("cdk") or ":" in key)


def load_config(context: Mapping[str, Any]) -> PlatformConfig:
    """Parse and validate the platform keys of a CDK context; raise ConfigError listing every problem."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, raw in context.items():
        if not is_platform_key(key):
            continue
        if key not in PARSERS:
            close = difflib.get_close_matches(key, PARSERS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(sorted(PARSERS))}"
            problems.append(f"'{key}': unknown key{hint}")
            continue
        try:
            values[key] = PARSERS[key](raw)
        except ValueError as err:
            problems.append(f"'{key}' = {raw!r}: {err}")
    if problems:
        raise ConfigError(problems)
    config = PlatformConfig(**values)
    problems = validate(config)
    if problems:
        raise ConfigError(problems)
    return config


def validate(c: PlatformConfig) -> list[str]:
    p: list[str] = []

    def bad(key: str, why: str) -> None:
        p.append(f"'{key}' = {getattr(c, key)!r}: {why}")

    if not NAME_PREFIX.match(c.name_prefix):
        bad("name_prefix", "must be 3-20 lowercase letters, digits or hyphens, starting with a letter "
                           "(it starts bucket and training job names)")
    if c.region is not None and not re.match(r"^[a-z]{2}(-[a-z]+)+-\d$", c.region):
        bad("region", "must be a region name such as us-east-1, or null for an environment-agnostic synth")
    if not 2 <= c.az_count <= 6:
        bad("az_count", "must be 2 to 6 (training subnets in at least two AZs)")
    if c.availability_zones:
        if c.region is None:
            bad("availability_zones", "needs 'region' too (synth makes no look-ups)")
        elif not all(AZ_NAME.match(z) and z.startswith(c.region) for z in c.availability_zones):
            bad("availability_zones", f"must be AZ names in {c.region}, e.g. {c.region}a")
        if len(c.availability_zones) != c.az_count:
            bad("availability_zones", f"must list exactly az_count={c.az_count} zones")
    elif c.az_count > 2:
        bad("az_count", "more than 2 AZs needs 'region' and 'availability_zones' listed (synth makes no "
                        "look-ups, and an environment-agnostic stack sees only 2 AZs)")
    try:
        net = ipaddress.ip_network(c.vpc_cidr)
        if net.version != 4 or not 16 <= net.prefixlen <= 24:
            bad("vpc_cidr", "must be an IPv4 CIDR between /16 and /24, e.g. 10.80.0.0/16")
        else:
            # Each AZ gets one private (training) subnet of private_subnet_mask and one small public one.
            needed = c.az_count * (2 ** (32 - c.private_subnet_mask) + 2 ** (32 - 26))
            if needed > net.num_addresses:
                bad("vpc_cidr", f"is too small: {c.az_count} AZs x a /{c.private_subnet_mask} training subnet "
                                f"(largest_cluster_instances={c.largest_cluster_instances} x "
                                f"{IPS_PER_EFA_INSTANCE} EFA IPs) need {needed} addresses; use a larger block "
                                f"such as /16 or lower largest_cluster_instances")
    except ValueError:
        bad("vpc_cidr", "must be an IPv4 CIDR such as 10.80.0.0/16")
    if not 0 <= c.nat_gateways <= c.az_count:
        bad("nat_gateways", f"must be 0 (VPC endpoints only) to az_count={c.az_count}")
    if not 1 <= c.largest_cluster_instances <= 256:
        bad("largest_cluster_instances", "must be 1 to 256")
    for key in ("flow_log_retention_days", "log_retention_days"):
        if getattr(c, key) not in LOG_RETENTION_DAYS:
            bad(key, f"must be one of CloudWatch Logs' periods: {', '.join(map(str, LOG_RETENTION_DAYS))}")
    if c.fsx_deployment_type not in FSX_DEPLOYMENT_TYPES:
        bad("fsx_deployment_type", f"must be {' or '.join(FSX_DEPLOYMENT_TYPES)}")
    if c.fsx_storage_gib != 1200 and (c.fsx_storage_gib <= 0 or c.fsx_storage_gib % 2400):
        bad("fsx_storage_gib", "must be 1200 or a multiple of 2400")
    if c.fsx_throughput_per_tib not in FSX_THROUGHPUT_PER_TIB:
        bad("fsx_throughput_per_tib", "must be 125, 250, 500 or 1000 (MB/s per TiB, PERSISTENT_2)")
    if c.dataset_bucket_name is not None and not BUCKET_NAME.match(c.dataset_bucket_name):
        bad("dataset_bucket_name", "must be an S3 bucket name (3-63 lowercase letters, digits, dots, hyphens) "
                                   "or null to create one")
    if c.dataset_prefix.startswith("/") or not c.dataset_prefix.endswith("/") or " " in c.dataset_prefix:
        bad("dataset_prefix", "must be an S3 key prefix ending in '/' with no leading '/', e.g. datasets/")
    if c.kms_key_arn is not None and not KMS_KEY_ARN.match(c.kms_key_arn):
        bad("kms_key_arn", "must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<uuid>) or null to create "
                           "one")
    if not c.allowed_instance_types:
        bad("allowed_instance_types", "must list at least one ml.* training instance type")
    for t in c.allowed_instance_types:
        if not INSTANCE_TYPE.match(t):
            p.append(f"'allowed_instance_types' entry {t!r}: must be a SageMaker instance type such as "
                     f"ml.p5.48xlarge")
    names = [plan.name for plan in c.training_plans]
    for plan in c.training_plans:
        where = f"'training_plans' entry {plan.name!r}"
        if not re.match(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$", plan.name) or names.count(plan.name) > 1:
            p.append(f"{where}: name must be unique, 1-63 letters, digits or hyphens")
        if not TRAINING_PLAN_ARN.match(plan.arn):
            p.append(f"{where}: arn {plan.arn!r} is not a training plan ARN "
                     f"(arn:aws:sagemaker:<region>:<account>:training-plan/<name>)")
        elif c.region and plan.arn.split(":")[3] != c.region:
            p.append(f"{where}: arn is in {plan.arn.split(':')[3]} but the platform is in {c.region}")
        if plan.instance_type not in c.allowed_instance_types:
            p.append(f"{where}: instance_type {plan.instance_type!r} is not in allowed_instance_types "
                     f"{list(c.allowed_instance_types)}")
        if plan.instance_count < 1:
            p.append(f"{where}: instance_count must be at least 1")
    if not 0 <= c.default_warm_pool_minutes <= 360:
        bad("default_warm_pool_minutes", "must be 0 to 360 (SageMaker keeps warm pools up to 21600 s)")
    if c.notification_email is not None and not EMAIL.match(c.notification_email):
        bad("notification_email", "must be an e-mail address or null")
    for key in ("pytorch_versions", "smp_versions"):
        versions = getattr(c, key)
        if not versions or not all(re.match(r"^\d+\.\d+(\.\d+)?$", v) for v in versions):
            bad(key, "must list one or more versions such as \"2.8.0\" (the first is the default)")
    if len(c.tags) > 45:
        bad("tags", "must have at most 45 tags (CloudFormation adds its own, 50 in all)")
    for k, v in c.tags.items():
        if k.lower().startswith("aws:") or not 1 <= len(k) <= 128 or len(v) > 256:
            p.append(f"'tags' entry {k!r}: keys are 1-128 characters not starting with aws:, values up to 256")
    return p
