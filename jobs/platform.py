"""The platform's settings, as the deployed stacks publish them.

One JSON document (the "platform settings") carries every value the launcher and trainctl
need to render a CreateTrainingJob request: the CDK app writes it into the launcher Lambda's
environment (PLATFORM_SETTINGS), into the SSM parameter `/<name_prefix>/platform-settings`
and into a stack output; `trainctl render --platform FILE` reads the same document from a file.
It is read by the schema engine (contract.schema), so a bad document gets one problem per bad key.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from contract.container import MLFLOW_SERVER, MLFLOW_SERVER_FORM
from contract.errors import Invalid, Problem
from contract.schema import join, json_schema, meta, parse_dataclass
from jobs.naming import MAX_JOB_TAGS


class PlatformSettingsInvalid(Invalid, ValueError):
    """A platform-settings document that cannot be used; one `path: message` line per problem.

    A ValueError too, as callers (trainctl) caught before the schema engine read the document."""


def _strings(value: Any) -> str | list[tuple[int, str]] | None:
    """A list of non-empty strings (the schema engine reads tuples; these stay lists, as the stacks write them)."""
    if not isinstance(value, list):
        return f"expected a list of strings, got {type(value).__name__}"
    return [(i, f"expected a non-empty string, got {item!r}") for i, item in enumerate(value)
            if not isinstance(item, str) or not item.strip()]


def _image_table(value: Any) -> list[tuple[str, str]] | None:
    """{"pytorch": {"2.8.0": {"gpu": uri, "cpu": uri}}, ...}: framework -> version -> device -> image URI."""
    found = []
    for framework, versions in value.items():
        if not isinstance(versions, dict):
            found.append((framework, "expected an object of versions, e.g. {\"2.8.0\": {\"gpu\": \"<image uri>\"}}"))
            continue
        for version, devices in versions.items():
            where = f"{framework}.{version}"
            if not isinstance(devices, dict):
                found.append((where, "expected an object of devices, e.g. {\"gpu\": \"<image uri>\"}"))
                continue
            found += [(f"{where}.{device}", f"expected an image URI, got {uri!r}") for device, uri in devices.items()
                      if not isinstance(uri, str) or not uri.strip()]
    return found


ENV_PATTERN = re.compile(r"\*|[A-Za-z_][A-Za-z0-9_]*\*?")
IMAGE_REPOSITORY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?/([a-z0-9._/-]*)")
REPOSITORY_FORM = ("<account>.dkr.ecr.<region>.amazonaws.com/<repository>, or the registry ending in '/' for all of its "
                   "repositories")


def image_repositories_problem(repositories: tuple[str, ...] | list[str]) -> str | None:
    """The first entry that is not a repository (IMAGE_REPOSITORY), for the platform config and a team's."""
    bad = [r for r in repositories if not IMAGE_REPOSITORY.fullmatch(r)]
    return f"entry {bad[0]!r}: must be {REPOSITORY_FORM}" if bad else None


def _env_patterns(value: Any) -> str | list[tuple[int, str]] | None:
    """Names or `PREFIX*` patterns: what a request's `environment` may set on top of jobs.request.environment_rules'."""
    if problem := _strings(value):
        return problem
    return [(i, f"{item!r}: give a variable name or a prefix ending in '*', e.g. MYLIB_*") for i, item in
            enumerate(value) if not ENV_PATTERN.fullmatch(item)]


def mlflow_server_problem(value: Any) -> str | None:
    """Why `value` names no tracking server a job can log to (None when it does, or is null): the platform config's
    `mlflow_tracking_server` and the settings' `mlflow_tracking_uri`."""
    if value is None or (isinstance(value, str) and MLFLOW_SERVER.fullmatch(value)):
        return None
    return f"must be {MLFLOW_SERVER_FORM}, or null"


def _repositories(value: Any) -> str | list[tuple[int, str]] | None:
    """`<registry>/<repository>` (that repository) or `<registry>/` (every repository of that registry)."""
    if problem := _strings(value):
        return problem
    return [(i, f"{item!r}: give {REPOSITORY_FORM}") for i, item in enumerate(value)
            if not IMAGE_REPOSITORY.fullmatch(item)]


@dataclass(frozen=True)
class FsxSettings:
    file_system_id: str = field(metadata=meta("FSx for Lustre file system id (fs-...)"))
    mount_name: str = field(metadata=meta("the file system's mount name"))
    # The folder on the file system that the dataset bucket prefix is linked to (no leading slash).
    linked_path: str = field(default="datasets", metadata=meta(
        "folder on the file system linked to the dataset bucket's prefix"))
    # With teams, a team's dataset_prefix lies under the prefix the one file system links: name that one here.
    linked_prefix: str | None = field(default=None, metadata=meta(
        "key prefix of the dataset bucket that the file system links to linked_path (null: dataset_prefix)"))


@dataclass(frozen=True)
class TrainingPlan:
    """A SageMaker training plan (reserved capacity) that requests may name in `training_plan`."""

    name: str = field(metadata=meta("the name requests use (the key in training_plans)"))
    arn: str = field(metadata=meta("the training plan's ARN (ResourceConfig.TrainingPlanArn)"))
    instance_type: str = field(metadata=meta("the one instance type the plan reserves"))
    instance_count: int = field(metadata=meta("instances the plan reserves", min=1))
    end_time: str | None = field(default=None, metadata=meta(
        "when the plan ends, ISO 8601 UTC (instances are reclaimed 30 minutes earlier; the planner checkpoints "
        "before)"))


@dataclass(frozen=True)
class PlatformSettings:
    name_prefix: str = field(metadata=meta("prefix of every resource and job name"))
    region: str = field(metadata=meta("AWS region of the platform"))
    execution_role_arn: str = field(metadata=meta("role the training jobs run as"))
    subnet_ids: list[str] = field(metadata=meta("private subnets of the training jobs", check=_strings))
    security_group_ids: list[str] = field(metadata=meta("security groups of the training jobs", check=_strings))
    kms_key_arn: str = field(metadata=meta("KMS key of volumes and outputs"))
    checkpoint_bucket: str = field(metadata=meta("bucket of the runs' checkpoints"))
    output_bucket: str = field(metadata=meta("bucket of model artifacts, outputs and profiler data"))
    dataset_bucket: str = field(metadata=meta("bucket of the datasets (linked to FSx when there is one)"))
    # S3 URI of the packed training/ package (sourcedir.tar.gz) that sagemaker_submit_directory names.
    source_dir_s3_uri: str = field(metadata=meta("S3 URI of the training package (sourcedir.tar.gz)"))
    # Container images resolved at synth time for the stack's region:
    # {"pytorch": {"2.8.0": {"gpu": uri, "cpu": uri}}, "pytorch-smp": {"2.5.1": {"gpu": uri}}}
    images: dict[str, dict[str, dict[str, str]]] = field(metadata=meta(
        "image URIs: framework -> version -> device (gpu, cpu, neuron)", check=_image_table))
    default_framework_version: str = field(metadata=meta("PyTorch version of requests that name none"))
    default_smp_version: str = field(metadata=meta("SMP version of smp requests that name none"))
    allowed_instance_types: list[str] = field(metadata=meta(
        "instance types requests may use (empty: every type in the catalog)", check=_strings))
    fsx: FsxSettings | None = field(default=None, metadata=meta("the dataset file system (null: none)"))
    training_plans: dict[str, TrainingPlan] = field(default_factory=dict, metadata=meta(
        "training plans by name; an entry's name is its key"))
    default_warm_pool_minutes: int = field(default=0, metadata=meta(
        "warm pool of requests that set none, minutes", min=0))
    # The execution role reads the dataset bucket only under this prefix (platform_constructs.roles).
    dataset_prefix: str | None = field(default=None, metadata=meta(
        "key prefix of the dataset bucket the training jobs may read (null: not published; not checked)"))
    # jobs.request.environment_rules: requests may set these on top of its allow-list, never its refused names.
    environment_patterns: list[str] = field(default_factory=list, metadata=meta(
        "environment variable names or `PREFIX*` patterns requests may set, on top of the default allow-list",
        check=_env_patterns))
    # A team's cost allocation tag (platform_constructs.teams): its budget filters the bill on it.
    job_tags: dict[str, str] = field(default_factory=dict, metadata=meta(
        "tags written on every job of this launcher besides the run's own (a team's cost allocation tag)",
        max=MAX_JOB_TAGS))
    # A team's own key (platform config `team_keys`, platform_constructs.encryption.TeamKey): its checkpoint and output
    # buckets' default encryption, and what the job's outputs are written with (OutputDataConfig.KmsKeyId).
    data_kms_key_arn: str | None = field(default=None, metadata=meta(
        "KMS key of the team's own checkpoint and output buckets (null: kms_key_arn)"))
    # The platform config's mlflow_tracking_server: every job logs its run there (training.metrics.mlflow_run), into the
    # experiment named for name_prefix (the team's own).
    mlflow_tracking_uri: str | None = field(default=None, metadata=meta(
        "MLflow tracking server every run logs to (a SageMaker MLflow ARN or an http(s) URI; null: none)",
        check=mlflow_server_problem))
    # jobs.request.image_rules: requests' `image` must come from these or from the registries of the images above.
    allowed_image_repositories: list[str] = field(default_factory=list, metadata=meta(
        "ECR repositories requests' `image` may come from (`<registry>/<repo>`, or `<registry>/` for all), on top "
        "of the AWS registries of the platform's own images", check=_repositories))

    def dataset_key(self, uri: str) -> str | None:
        """The key of an `s3://` dataset relative to dataset_prefix (all the execution role reads); None when it
        lies outside. Without a published prefix, the whole key (the whole bucket)."""
        return _key_under(uri, self.dataset_bucket, self.dataset_prefix)

    def fsx_directory(self, uri: str) -> str | None:
        """Where an `s3://` dataset appears on the file system: `/<mount>/<linked_path>/<key below the linked
        prefix>`; None when the file system does not link it (or there is none)."""
        if self.fsx is None:
            return None
        key = _key_under(uri, self.dataset_bucket, self.fsx.linked_prefix or self.dataset_prefix)
        if key is None:
            return None
        return "/" + "/".join(p for p in (self.fsx.mount_name, self.fsx.linked_path.strip("/"), key) if p)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlatformSettings:
        """Read a settings document; raise PlatformSettingsInvalid naming every bad key."""
        if not isinstance(data, dict):
            raise PlatformSettingsInvalid([Problem("", f"platform settings are a JSON object, got "
                                                       f"{type(data).__name__}")])
        problems: list[Problem] = []
        data = dict(data)
        # The engine reads dicts of strings only; the plans' values are objects, read one by one here.
        plans = data.pop("training_plans", None) or {}
        settings = parse_dataclass(cls, data, "", problems)
        plans = _training_plans(plans, problems)
        if problems:
            raise PlatformSettingsInvalid(problems)
        return dataclasses.replace(settings, training_plans=plans)

    @classmethod
    def from_json(cls, text: str) -> PlatformSettings:
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


class LocalPlatformSettings(PlatformSettings):
    """The settings `trainctl local` renders with (cli.platform_source.local_platform): placeholders with no AWS
    behind them, so the rules that stand for AWS (the dataset bucket and its prefix, FSx, image sources, secrets'
    scope, parallel degrees and batch sizes against the instances) leave the request to `trainctl local`'s own.

    A type, not a value: no settings document reads as one (from_dict builds a PlatformSettings), so a deployed
    platform is never local, whatever its name_prefix (a platform may be named `local`)."""

    @classmethod
    def of(cls, settings: PlatformSettings) -> LocalPlatformSettings:
        """These settings, marked as `trainctl local`'s."""
        return cls(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)})


def _key_under(uri: str, bucket: str, prefix: str | None) -> str | None:
    """The key of `s3://bucket/<prefix><key>` without the prefix (a whole path segment: `datasets/` does not hold
    `datasets-old/`); None for another bucket or outside the prefix. No prefix: the whole key."""
    uri_bucket, _, key = uri[len("s3://"):].partition("/")
    prefix = (prefix or "").strip("/")
    if uri_bucket != bucket:
        return None
    key = key.strip("/")
    if not prefix or key == prefix:
        return "" if prefix else key
    return key[len(prefix) + 1:] if key.startswith(prefix + "/") else None


def _training_plans(value: Any, problems: list[Problem]) -> dict[str, TrainingPlan]:
    if not isinstance(value, dict):
        problems.append(Problem("training_plans", f"expected an object of plans by name, got {type(value).__name__}"))
        return {}
    plans = {}
    for name, entry in value.items():
        path = join("training_plans", name)
        if not isinstance(entry, dict):
            problems.append(Problem(path, "expected an object with arn, instance_type and instance_count"))
            continue
        # The key names the plan (a `name` inside, as to_dict writes it, is the same).
        plan = parse_dataclass(TrainingPlan, {**entry, "name": name}, path, problems)
        if plan is not None:
            plans[name] = plan
    return plans


def settings_json_schema() -> dict[str, Any]:
    """The platform-settings document as a JSON Schema (draft 2020-12).

    The engine's schema leaves lists and the plans' objects open; they are spelled out here.
    """
    schema = json_schema(PlatformSettings, title="Platform settings",
                         description="What the launcher and trainctl need to render jobs on one deployed platform.")
    props = schema["properties"]
    for name in ("subnet_ids", "security_group_ids", "allowed_instance_types", "environment_patterns",
                 "allowed_image_repositories"):
        props[name].update({"type": "array", "items": {"type": "string", "minLength": 1}})
    plan = json_schema(TrainingPlan)
    del plan["$schema"]
    plan["required"] = [k for k in plan["required"] if k != "name"]
    props["training_plans"]["additionalProperties"] = plan
    return schema
