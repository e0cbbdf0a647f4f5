"""PlatformConfig: one field per cdk.json context key, its doc and its rules, read by contract.schema.

Field rules that the schema engine words well enough use `min`/`max`; rules whose messages people (and the
tests) rely on use `check` functions that return today's wording. `expects` (our own annotation) says what a
value of the wrong type should have been: the loader turns the engine's "expected ..." into "must be ...".
Rules that relate two keys live in loader.relation_problems.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.schema import meta
from jobs.naming import MAX_NAME_PREFIX, NAME_PREFIX, SAGEMAKER_NAME, TEAM_SEPARATOR, team_prefix
from jobs.platform import ENV_PATTERN, TrainingPlan, image_repositories_problem, mlflow_server_problem
from platform_config.tested_torch import TESTED_TORCH_FILE, TESTED_TORCH_VERSIONS
from platform_constructs.dataset_fs import (
    DEPLOYMENT_TYPES,
    SMALLEST_STORAGE_GIB,
    STORAGE_STEP_GIB,
    storage_problem,
    throughput_problem,
)
from platform_constructs.network import EGRESS_MODES, MAX_AZ_COUNT, MIN_AZ_COUNT, training_subnet_mask
from platform_constructs.retention import RETENTION_PERIODS as LOG_RETENTION_DAYS
from platform_constructs.teams import Team, TeamSpec, team_tags

# The dataset file system's own facts (platform_constructs.dataset_fs): its deployment types by name.
FSX_DEPLOYMENT_TYPES = tuple(t.name for t in DEPLOYMENT_TYPES)
TRAINING_PLAN_ARN = re.compile(
    rf"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{{12}}:training-plan/{SAGEMAKER_NAME}$")
TRAINING_PLAN_NAME = re.compile(rf"^{SAGEMAKER_NAME}$")
INSTANCE_TYPE = re.compile(r"^ml\.[a-z0-9-]+\.[0-9]*x?large$|^ml\.[a-z0-9-]+\.[0-9]+xlarge$")
MIN_NAME_PREFIX = 3
AZ_NAME = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[0-9a-f-]{36}$")
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")

Check = Callable[[Any], "str | None"]


def _matches(pattern: re.Pattern[str], message: str) -> Check:
    return lambda value: None if pattern.match(value) else message


def _one_of(allowed: tuple[Any, ...], message: str) -> Check:
    return lambda value: None if value in allowed else message


def _between(lo: int, hi: int, message: str) -> Check:
    return lambda value: None if lo <= value <= hi else message


def _cidr(text: str) -> str | None:
    try:
        net = ipaddress.ip_network(text)
    except ValueError:
        return "must be an IPv4 CIDR such as 10.80.0.0/16"
    if net.version != 4 or not 16 <= net.prefixlen <= 24:
        return "must be an IPv4 CIDR between /16 and /24, e.g. 10.80.0.0/16"
    return None


def _name_prefix(text: str) -> str | None:
    """A launcher's prefix (jobs.naming.NAME_PREFIX) that also starts bucket names: lowercase, a letter
    first, at least MIN_NAME_PREFIX characters."""
    if not (NAME_PREFIX.fullmatch(text) and text[:1].isalpha() and text == text.lower()
            and len(text) >= MIN_NAME_PREFIX):
        return (f"must be {MIN_NAME_PREFIX}-{MAX_NAME_PREFIX} lowercase letters, digits or hyphens, starting with a "
                "letter (it starts bucket and training job names)")
    if TEAM_SEPARATOR in text:
        return (f"must not contain {TEAM_SEPARATOR!r}: team prefixes are <name_prefix>{TEAM_SEPARATOR}<team> "
                "(platform_constructs.teams), and no platform's names may start with another's team prefix")
    return None


def _prefix(text: str) -> str | None:
    if text.startswith("/") or not text.endswith("/") or " " in text:
        return "must be an S3 key prefix ending in '/' with no leading '/', e.g. datasets/"
    return None


def _env_patterns(patterns: tuple[str, ...]) -> str | None:
    bad = [p for p in patterns if not ENV_PATTERN.fullmatch(p)]
    return f"entry {bad[0]!r}: must be a variable name or a prefix ending in '*', e.g. MYLIB_*" if bad else None



def _instance_types(types: tuple[str, ...]) -> str | None:
    bad = [t for t in types if not INSTANCE_TYPE.match(t)]
    if bad:
        return f"entry {bad[0]!r}: must be a SageMaker instance type such as ml.p5.48xlarge"
    return None if types else "must list at least one ml.* training instance type"


def _versions(versions: tuple[str, ...]) -> str | None:
    if versions and all(VERSION.match(v) for v in versions):
        return None
    return "must list one or more versions such as \"2.8.0\" (the first is the default)"


def _tested_torch(versions: tuple[str, ...]) -> str | None:
    """Every offered PyTorch image's torch is one CI tests the package on (platform_config.tested_torch)."""
    if problem := _versions(versions):
        return problem
    untested = [v for v in versions if v not in TESTED_TORCH_VERSIONS]
    if not untested:
        return None
    which = ", ".join(repr(v) for v in untested)
    its = "it" if len(untested) == 1 else "them"
    return (f"{'entry' if len(untested) == 1 else 'entries'} {which}: not a torch version CI tests the training "
            f"package on (tested: {', '.join(TESTED_TORCH_VERSIONS)}); add {its} to "
            f"{TESTED_TORCH_FILE.parent.name}/{TESTED_TORCH_FILE.name} so that `make test` runs the training "
            f"tests on {its}, or drop {its} from pytorch_versions")


def _tags(tags: dict[str, str]) -> str | None:
    if len(tags) > 45:
        return "must have at most 45 tags (CloudFormation adds its own, 50 in all)"
    for k, v in tags.items():
        if k.lower().startswith("aws:") or not 1 <= len(k) <= 128 or len(v) > 256:
            return f"entry {k!r}: keys are 1-128 characters not starting with aws:, values up to 256"
    return None


def _plan_entries(plans: tuple[TrainingPlan, ...]) -> str | None:
    """Each plan on its own; whether its region and instance type fit the platform is a relation."""
    names = [p.name for p in plans]
    for plan in plans:
        where = f"entry {plan.name!r}"
        if not TRAINING_PLAN_NAME.match(plan.name) or names.count(plan.name) > 1:
            return f"{where}: name must be unique, 1-63 letters, digits or hyphens"
        if not TRAINING_PLAN_ARN.match(plan.arn):
            return (f"{where}: arn {plan.arn!r} is not a training plan ARN "
                    "(arn:aws:sagemaker:<region>:<account>:training-plan/<name>)")
        if plan.instance_count < 1:
            return f"{where}: instance_count must be at least 1"
    return None


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _f(default: Any, doc: str, **rules: Any) -> Any:
    """A field with a default (a factory for a map: dataclasses refuse a shared mutable default)."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta(doc, **rules))
    return field(default=default, metadata=meta(doc, **rules))


_RETENTION = _one_of(LOG_RETENTION_DAYS, "must be one of CloudWatch Logs' periods: "
                     + ", ".join(map(str, LOG_RETENTION_DAYS)))
_WHOLE = "a whole number"
_LIST = "a JSON list of strings (for -c, quote it: -c 'key=[\"a\",\"b\"]')"


@dataclass(frozen=True)
class PlatformConfig:
    name_prefix: str = _f("mltrain", "Starts every bucket, role, job and parameter name", expects="a string",
                          check=_name_prefix)
    region: str | None = _f(None, "Deploy region; null for an environment-agnostic synth", expects="a string or null",
                            check=_optional(_matches(REGION, "must be a region name such as us-east-1, or null for "
                                                     "an environment-agnostic synth")))
    availability_zones: tuple[str, ...] = _f((), "AZ names (needs region); empty lets the CDK pick", expects=_LIST)
    az_count: int = _f(2, "Availability zones with a training subnet", min=MIN_AZ_COUNT, max=MAX_AZ_COUNT,
                       expects=_WHOLE)
    vpc_cidr: str = _f("10.80.0.0/16", "The VPC's IPv4 block", expects="a string", check=_cidr)
    nat_gateways: int = _f(1, "NAT gateways; 0 uses VPC interface endpoints only", min=0, expects=_WHOLE)
    egress: str = _f("internet", "Where training jobs may connect: internet (HTTPS anywhere, through NAT) or "
                     "endpoints (only the VPC endpoints, whose policies admit only the platform's buckets and images)",
                     expects="a string", check=_one_of(EGRESS_MODES, f"must be {' or '.join(EGRESS_MODES)}"))
    largest_cluster_instances: int = _f(16, "Largest training cluster; sizes the training subnets", min=1, max=256,
                                        expects=_WHOLE)
    flow_log_retention_days: int = _f(90, "VPC flow log retention (days)", check=_RETENTION, expects=_WHOLE)
    log_retention_days: int = _f(365, "Launcher log retention (days)", check=_RETENTION, expects=_WHOLE)
    fsx_enabled: bool = _f(True, "Create the FSx for Lustre dataset file system", expects="true or false")
    fsx_storage_gib: int = _f(1200, f"FSx capacity (GiB): {SMALLEST_STORAGE_GIB} or a multiple of "
                              f"{STORAGE_STEP_GIB}", check=storage_problem, expects=_WHOLE)
    fsx_throughput_per_tib: int = _f(250, "FSx PERSISTENT_2 throughput (MB/s per TiB)", expects=_WHOLE,
                                     check=throughput_problem)
    fsx_deployment_type: str = _f("PERSISTENT_2", f"FSx deployment type ({' or '.join(FSX_DEPLOYMENT_TYPES)})",
                                  expects="a string", check=_one_of(FSX_DEPLOYMENT_TYPES,
                                                                    f"must be {' or '.join(FSX_DEPLOYMENT_TYPES)}"))
    dataset_bucket_name: str | None = _f(None, "An existing dataset bucket; null creates one",
                                         expects="a string or null", check=_optional(_matches(
                                             BUCKET_NAME, "must be an S3 bucket name (3-63 lowercase letters, "
                                             "digits, dots, hyphens) or null to create one")))
    dataset_prefix: str = _f("datasets/", "Dataset key prefix (training jobs read only under it)",
                             expects="a string", check=_prefix)
    kms_key_arn: str | None = _f(None, "An existing KMS key; null creates one", expects="a string or null",
                                 check=_optional(_matches(KMS_KEY_ARN, "must be a KMS key ARN (arn:aws:kms:<region>:"
                                                          "<account>:key/<uuid>) or null to create one")))
    allowed_instance_types: tuple[str, ...] = _f(
        ("ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.g5.12xlarge", "ml.g6e.12xlarge", "ml.c5.2xlarge"),
        "Instance types a job may request", expects=_LIST, check=_instance_types)
    # Request policy (jobs.request.environment_rules, jobs.request.image_rules): published in the platform settings of the same names.
    environment_patterns: tuple[str, ...] = _f((), "Variable names or PREFIX* patterns a job's environment may set "
                                               "on top of the default allow-list (NCCL_*, TORCH_*, HF_*...); the "
                                               "refused ones (LD_*, PYTHON*, AWS_*...) stay refused",
                                               expects=_LIST, check=_env_patterns)
    allowed_image_repositories: tuple[str, ...] = _f((), "ECR repositories a job's image may come from "
                                                     "(<registry>/<repo>, or <registry>/ for all), on top of the "
                                                     "AWS registries of the platform's images",
                                                     expects=_LIST, check=image_repositories_problem)
    training_plans: tuple[TrainingPlan, ...] = _f((), "SageMaker training plans jobs may run on",
                                                  check=_plan_entries,
                                                  expects="a JSON list of {name, arn, instance_type, instance_count}")
    default_warm_pool_minutes: int = _f(0, "Warm pool kept after a job (minutes)", expects=_WHOLE, check=_between(
        0, 360, "must be 0 to 360 (SageMaker keeps warm pools up to 21600 s)"))
    mlflow_tracking_server: str | None = _f(
        None, "MLflow tracking server every run logs to (one MLflow run per run, in the team's experiment): a SageMaker "
        "managed MLflow ARN, which the execution roles may then log runs to and nothing else, or an http(s) URI the "
        "jobs can reach; null: none", expects="a string or null",
        check=mlflow_server_problem)
    notification_email: str | None = _f(None, "E-mail subscribed to run notifications", expects="a string or null",
                                        check=_optional(_matches(EMAIL, "must be an e-mail address or null")))
    notify_refusals: bool = _f(False, "Also send requests the launcher refuses (RequestInvalid) to the notification "
                               "topic; false: only whoever started the execution sees them (trainctl prints the "
                               "refusal, the console shows it as the execution's cause)", expects="true or false")
    pytorch_versions: tuple[str, ...] = _f(("2.8.0",), "PyTorch image versions (first is the default); each one "
                                           "CI tests the package on (platform_config/tested_torch.json)",
                                           expects=_LIST, check=_tested_torch)
    # Not checked against the tested set: the SMP image's torch (torch.sagemaker) exists only in that image.
    smp_versions: tuple[str, ...] = _f(("2.8.0",), "SMP image versions (first is the default); not tested here: "
                                       "the SMP library exists only in its image", expects=_LIST, check=_versions)
    retain_data: bool = _f(True, "Keep buckets, key, logs and file system when the stack is deleted",
                           expects="true or false")
    tags: dict[str, str] = _f({"project": "ml-training-platform"}, "Tags on every resource", check=_tags,
                              expects='a JSON object of string values, e.g. {"team": "ml"}')
    teams: tuple[Team, ...] = _f((), "Teams sharing the platform, each with its own launcher, execution role, "
                                 "engineers' policy and data (docs/SECURITY.md); empty: one team, as before",
                                 expects='a JSON list of {"name", "engineer_roles", "dataset_prefix", '
                                         '"allowed_instance_types", "allowed_image_repositories", '
                                         '"monthly_budget_usd"}')

    team_keys: bool = _f(True, "With teams: each team's own KMS key (alias/<prefix>--<team>-data, about $1 a month) "
                         "and its own checkpoint and output buckets encrypted with it, which only the team's roles "
                         "may use; false: the platform key and shared buckets, separated by prefix",
                         expects="true or false")

    @property
    def team_specs(self) -> tuple[TeamSpec, ...]:
        """Each team resolved for the stacks; with no teams declared, the default team: the platform's own
        prefix, dataset prefix and instance types, so every name stays where it was."""
        if not self.teams:
            return (TeamSpec(name=None, name_prefix=self.name_prefix, dataset_prefix=self.dataset_prefix,
                             allowed_instance_types=self.allowed_instance_types,
                             image_repositories=self.allowed_image_repositories),)
        return tuple(TeamSpec(name=t.name, name_prefix=team_prefix(self.name_prefix, t.name),
                              job_tags=team_tags(self.name_prefix, t.name), monthly_budget_usd=t.monthly_budget_usd,
                              dataset_prefix=t.dataset_prefix or f"{self.dataset_prefix}{t.name}/",
                              allowed_instance_types=t.allowed_instance_types or self.allowed_instance_types,
                              engineer_roles=t.engineer_roles, own_key=self.team_keys,
                              image_repositories=tuple(dict.fromkeys(self.allowed_image_repositories
                                                                     + t.allowed_image_repositories)))
                     for t in self.teams)

    @property
    def private_subnet_mask(self) -> int:
        """The largest prefix length (smallest subnet) that fits the largest cluster's EFA interfaces."""
        return training_subnet_mask(self.largest_cluster_instances)
