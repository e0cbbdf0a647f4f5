"""A valid job request plus the platform's settings -> the exact CreateTrainingJob request of attempt N.

Every attempt of one run gets a fresh job name (job names are unique per account and region) and the same
checkpoint S3 prefix, so a retry resumes where the last attempt checkpointed. Neither the run id nor an
attempt's name (jobs.naming) can be guessed ahead (both carry random characters), and every attempt's Environment carries
the run id (contract.container.ENV_RUN_ID): a job found under an attempt's name is the run's own only when it
carries that marker (jobs.retry.run_state.is_ours), never because of its name or its checkpoint prefix. The keys in
CREATE_REQUEST_KEYS are present in every rendered request: the state machine maps each one explicitly
(`"<Key>.$": "$.launch.create.<Key>"`) and a missing path would fail the execution, so optional settings are
rendered in an always-present form (ProfilerConfig with DisableProfiler, Environment possibly {}) or nested
inside an always-present object (MaxWaitTimeInSeconds in StoppingCondition, KeepAlivePeriodInSeconds and
TrainingPlanArn in ResourceConfig).

Where the tests stop: every rendered request passes botocore's parameter validation (plus the service
model's enums, lengths and patterns), but SageMaker's server-side rules are not exercised here (no AWS
account): e.g. warm pools combined with Spot, instance-store sizes on NVMe types, and which GPU types the
SMP v2 image supports are only as right as AWS's documentation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from contract.container import (
    CHECKPOINT_DIR,
    CODE_CHANNEL,
    ENV_EPOCH,
    ENV_METRICS_NAMESPACE,
    ENV_MLFLOW_EXPERIMENT,
    ENV_MLFLOW_TRACKING_URI,
    ENV_PRICE,
    ENV_REQUEST,
    ENV_RUN_ID,
    ENV_SECRET_ARNS,
    ENV_TENSORBOARD_DIR,
    INIT_CHANNEL,
    INPUT_DATA_DIR,
    TENSORBOARD_DIR,
    TOO_LONG,
    TRAIN_CHANNEL,
    VALIDATION_CHANNEL,
)
from contract.errors import Problem, RequestInvalid
from contract.hyperparameters import Strategy, canonical_name, encode_hyperparameters
from contract.metrics import metric_definitions
from jobs import catalog
from jobs.naming import job_name, metrics_namespace, new_name_nonce, platform_tags
from jobs.planning.auto_strategy import attempt_cadence, plan_for_request
from jobs.planning.cadence import before_plan_end, reclaim_epoch
from jobs.platform import PlatformSettings, TrainingPlan
from jobs.prices import cluster_usd_per_hour
from jobs.render.container_entry import container_entrypoint
from jobs.render.images import resolve_image
from jobs.request.command_line import TOOLKIT_PREFIX, command_line_problems
from jobs.request.environment_rules import secrets_variable
from jobs.request.field_rules import dataset_kind, fsx_path
from jobs.request.image_rules import starts_through_platform_entry
from jobs.request.limits import MAX_ENVIRONMENT_TEXT, PLATFORM_ENVIRONMENT
from jobs.request.parallelism import request_hyperparameters
from jobs.request.schema import JobRequest

CREATE_REQUEST_KEYS: tuple[str, ...] = (
    "TrainingJobName",
    "AlgorithmSpecification",
    "RoleArn",
    "HyperParameters",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "StoppingCondition",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "TensorBoardOutputConfig",
    "Environment",
    "ProfilerConfig",
    "InfraCheckConfig",
    "Tags",
)

# The request's fields its MLflow run records as parameters (`request.<field>`) beside the job's configuration, which
# carries the rest (strategy, model, hyperparameters, degrees): what it trains on, on what, on which terms.
REQUEST_PARAMS = ("name", "dataset", "validation_dataset", "instance", "instance_groups", "spot", "input_mode",
                  "framework_version", "image", "training_plan", "max_runtime_hours", "init_from_run")
ENTRY_POINT = "train.py"
CONTAINER_LOG_LEVEL = 20  # logging.INFO, as SDK v2 sends it
PROFILING_INTERVAL_MS = 500


def checkpoint_s3_uri(platform: PlatformSettings, run_id: str) -> str:
    """Shared by every attempt of the run; ends in `/` so sibling prefixes never sync into the job."""
    return f"s3://{platform.checkpoint_bucket}/{platform.name_prefix}/{run_id}/checkpoints/"


def output_s3_uri(platform: PlatformSettings, run_id: str) -> str:
    return f"s3://{platform.output_bucket}/{platform.name_prefix}/{run_id}/output/"


def tensorboard_s3_uri(platform: PlatformSettings, run_id: str) -> str:
    """Where a run's TensorBoard event files go (every attempt of the run adds its own beside the others')."""
    return f"s3://{platform.output_bucket}/{platform.name_prefix}/{run_id}/tensorboard/"


def tensorboard_command(uri: str, run_id: str) -> str:
    """How an engineer opens a run's event files: a local copy (tensorboard reads s3:// only with extra plugins)."""
    return f"aws s3 sync {uri} tensorboard/{run_id} && tensorboard --logdir tensorboard/{run_id}"


def render_create_training_job(
    request: JobRequest,
    platform: PlatformSettings,
    *,
    run_id: str,
    attempt: int,
    instance_type: str | None = None,
    spot: bool | None = None,
    infra_check: bool | None = None,
    name_nonce: str | None = None,
    epoch: int | None = None,
    starts_at: float | None = None,
    measured_stall_s: float | None = None,
    plans_ended: list[str] | tuple[str, ...] = (),
    prices: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The botocore CreateTrainingJob kwargs for `attempt` (1-based) of run `run_id`.

    `instance_type` and `spot` override the request's for this attempt (the retry policy moves to a
    fallback type after a capacity shortage, and off Spot after repeated interruptions). `name_nonce` is the
    job name's random part: fresh random characters unless given (trainctl's stand-in renders fix it).
    `starts_at`: when the attempt launches, epoch seconds (now unless given): it decides whether the request's
    training plan still holds instances, and how the checkpoint cadence fits before the plan's end.
    `measured_stall_s`: a checkpoint save's stall as the run's earlier attempts measured it (the cadence plans
    with it rather than with the planner's model of a save). `plans_ended`: training plans an earlier attempt was
    stopped on; the attempt does not target them. `epoch`: the attempt's epoch (contract.container.ENV_EPOCH, which
    fences the checkpoint folder against older attempts): the attempt number unless given. `prices`: on-demand USD per
    instance-hour by type (the launcher's, from the Price List API), for the attempt's price on a platform with an
    MLflow server (_price).
    """
    if attempt < 1:
        raise ValueError(f"attempt numbers start at 1, got {attempt}")
    use_spot = request.spot if spot is None else spot
    primary = instance_type or request.training_instance_type
    name = job_name(platform.name_prefix, run_id, attempt, name_nonce or new_name_nonce())
    starts_at = time.time() if starts_at is None else starts_at
    plan = attempt_training_plan(request, platform, starts_at, plans_ended)
    hyperparameters = training_hyperparameters(request, platform, name, primary)
    hyperparameters.update(_cadence(request, primary, use_spot, plan, starts_at, hyperparameters, measured_stall_s))
    _check_command_line(hyperparameters)
    resources = _resources(request, platform, primary, plan)
    create: dict[str, Any] = {
        "TrainingJobName": name,
        "AlgorithmSpecification": _algorithm(request, platform, primary),
        "RoleArn": platform.execution_role_arn,
        "HyperParameters": encode_hyperparameters(hyperparameters),
        "InputDataConfig": _channels(request, platform),
        "OutputDataConfig": {"S3OutputPath": output_s3_uri(platform, run_id),
                             "KmsKeyId": platform.data_kms_key_arn or platform.kms_key_arn},
        "ResourceConfig": resources,
        "VpcConfig": {"SecurityGroupIds": list(platform.security_group_ids), "Subnets": list(platform.subnet_ids)},
        "StoppingCondition": _stopping(request, use_spot, primary),
        "EnableNetworkIsolation": request.network_isolation,
        "EnableInterContainerTrafficEncryption": request.inter_container_encryption,
        "EnableManagedSpotTraining": use_spot,
        "CheckpointConfig": {"S3Uri": checkpoint_s3_uri(platform, run_id), "LocalPath": CHECKPOINT_DIR},
        # Always rendered (the state machine maps every key): with `tensorboard` off the job writes no event files,
        # and an empty folder syncs nothing.
        "TensorBoardOutputConfig": {"LocalPath": TENSORBOARD_DIR, "S3OutputPath": tensorboard_s3_uri(platform, run_id)},
        # The run's marker and the attempt's epoch last: a request may set neither (jobs.request.environment_rules
        # refuses them); the marker tells the run's own job from one that took its name, the epoch fences the
        # checkpoint folder against an older attempt still writing (training.checkpoint.fencing); the namespace is
        # the one the team's role may write (its alarms read it).
        "Environment": {**PLATFORM_ENVIRONMENT, **request.environment, **_secrets(request), ENV_RUN_ID: run_id,
                        ENV_EPOCH: str(attempt if epoch is None else epoch),
                        ENV_METRICS_NAMESPACE: metrics_namespace(platform.name_prefix),
                        **({ENV_TENSORBOARD_DIR: TENSORBOARD_DIR} if request.tensorboard else {}),
                        **_mlflow(request, platform), **_price(platform, resources, use_spot, prices)},
        "ProfilerConfig": _profiler(request, platform, run_id),
        "InfraCheckConfig": {"EnableInfraCheck": request.infra_check if infra_check is None else infra_check},
        "Tags": _tags(request, platform, run_id, attempt, strategy_and_degrees(request, primary)[0]),
    }
    return _with_the_mapped_keys(create)


def _with_the_mapped_keys(create: dict[str, Any]) -> dict[str, Any]:
    """`create`, when its keys are CREATE_REQUEST_KEYS in order: the state machine's Launch maps exactly those, so a
    key rendered but not mapped would never reach SageMaker, and one mapped but not rendered fails every launch.
    A raise, not an assert: `python -O` drops asserts, and this must hold in every interpreter that renders."""
    if tuple(create) != CREATE_REQUEST_KEYS:
        rendered, mapped = set(create), set(CREATE_REQUEST_KEYS)
        raise RuntimeError(
            f"the rendered CreateTrainingJob keys {tuple(create)} are not jobs.render.training_job.CREATE_REQUEST_KEYS "
            f"{CREATE_REQUEST_KEYS} (rendered only: {sorted(rendered - mapped)}, mapped only: "
            f"{sorted(mapped - rendered)}): change CREATE_REQUEST_KEYS with render_create_training_job")
    return create


def _mlflow(request: JobRequest, platform: PlatformSettings) -> dict[str, str]:
    """The tracking server every run logs to, the platform's (team's) own experiment there, and the request's fields
    for the MLflow run's parameters."""
    if not platform.mlflow_tracking_uri:
        return {}
    return {ENV_MLFLOW_TRACKING_URI: platform.mlflow_tracking_uri, ENV_MLFLOW_EXPERIMENT: platform.name_prefix,
            ENV_REQUEST: request_params(request)}


def request_params(request: JobRequest) -> str:
    """REQUEST_PARAMS that the request sets, as compact JSON within a variable's MAX_ENVIRONMENT_TEXT: the longest
    values give way to TOO_LONG until it fits (every field stays named)."""
    document = request.to_dict()
    fields = {k: document[k] for k in REQUEST_PARAMS if document.get(k) not in (None, [], {})}
    text = json.dumps(fields, separators=(",", ":"))
    while len(text) > MAX_ENVIRONMENT_TEXT:
        longest = max(fields, key=lambda k: len(json.dumps(fields[k])))
        fields[longest] = TOO_LONG
        text = json.dumps(fields, separators=(",", ":"))
    return text


def _price(platform: PlatformSettings, resources: dict[str, Any], spot: bool,
           prices: Mapping[str, float] | None) -> dict[str, str]:
    """The attempt's price for its MLflow run's cost (contract.container.ENV_PRICE): rendered where the platform
    logs to MLflow and every instance of the cluster has a price; never for a training plan's instances (paid up
    front, not by the hour)."""
    rate = cluster_usd_per_hour(cluster_types(resources), prices)
    if not platform.mlflow_tracking_uri or rate is None or "TrainingPlanArn" in resources:
        return {}
    return {ENV_PRICE: json.dumps({"usd_per_hour": round(rate, 4), "spot": spot})}


def cluster_types(resources: dict[str, Any]) -> list[tuple[int, str]]:
    """(count, instance type) of a rendered ResourceConfig: its one type, or each of its instance groups."""
    groups = resources.get("InstanceGroups")
    if groups:
        return [(g["InstanceCount"], g["InstanceType"]) for g in groups]
    return [(resources["InstanceCount"], resources["InstanceType"])]


def _secrets(request: JobRequest) -> dict[str, str]:
    """The secrets' ARNs for the container entry to read (jobs.render.container_entry); never their values."""
    return {ENV_SECRET_ARNS: secrets_variable(request.secrets)} if request.secrets else {}


def _algorithm(request: JobRequest, platform: PlatformSettings, instance_type: str) -> dict[str, Any]:
    metrics = metric_definitions() + [{"Name": m.name, "Regex": m.regex} for m in request.metrics]
    return {
        "TrainingImage": resolve_image(request, platform, instance_type),
        # FSx channels are mounted, which the API calls File mode.
        "TrainingInputMode": "File" if request.effective_input_mode == "FSx" else request.effective_input_mode,
        "MetricDefinitions": metrics,
        "EnableSageMakerMetricsTimeSeries": True,
        **_entrypoint(request, platform, instance_type),
    }


def _entrypoint(request: JobRequest, platform: PlatformSettings, instance_type: str) -> dict[str, Any]:
    """The platform's PyTorch images start through jobs.render.container_entry, so that a stop reaches the ranks;
    an image the platform did not pick keeps its own entry."""
    if not starts_through_platform_entry(request, platform, instance_type):
        return {}
    return {"ContainerEntrypoint": container_entrypoint()}


def training_hyperparameters(request: JobRequest, platform: PlatformSettings, job: str,
                             instance_type: str) -> dict[str, Any]:
    """The hyperparameters before encoding: the in-container launcher's keys, the script's, the user's."""
    strategy, degrees = strategy_and_degrees(request, instance_type)
    submit_dir = platform.source_dir_s3_uri
    if request.network_isolation:
        # The container cannot fetch sourcedir.tar.gz itself; SDK v2 then sends the code as an input channel
        # and points sagemaker_submit_directory at the file inside it.
        submit_dir = f"{INPUT_DATA_DIR}/{CODE_CHANNEL}/{submit_dir.rsplit('/', 1)[-1]}"
    values: dict[str, Any] = {
        "sagemaker_program": ENTRY_POINT,
        "sagemaker_submit_directory": submit_dir,
        "sagemaker_region": platform.region,
        "sagemaker_job_name": job,
        "sagemaker_container_log_level": CONTAINER_LOG_LEVEL,
        # torchrun on every node; the single strategy runs one plain process instead.
        "sagemaker_torch_distributed_enabled": strategy is not Strategy.SINGLE,
        "sagemaker_instance_type": instance_type,
    }
    if request.instance_groups:
        values["sagemaker_distribution_instance_groups"] = [
            g.name for g in request.instance_groups if (s := catalog.lookup(g.type)) and s.accelerated]
    if request.strategy is Strategy.SMP:
        par = request.parallel
        # SMP v2's core parameters; hybrid_shard_degree 0 (shard over all ranks) is SMP's default, so left out.
        mp = {"tensor_parallel_degree": par.tensor_parallel_degree}
        if par.hybrid_shard_degree:
            mp["hybrid_shard_degree"] = par.hybrid_shard_degree
        if par.context_parallel_degree != 1:
            mp["context_parallel_degree"] = par.context_parallel_degree
        values["mp_parameters"] = mp
        values["sagemaker_distributed_dataparallel_enabled"] = False
    values.update(degrees)  # torch-native degrees (hsdp, tp, pp, hybrid)
    values.update({
        "strategy": strategy.value,
        "model": request.model,
        "model_size": request.model_size,
        "checkpoint_interval": request.checkpoint_interval,
    })
    values.update(request.hyperparameters)
    if request.init_from_run:  # the request rules keep hyperparameters.init_from out of such a request
        values["init_from"] = f"{INPUT_DATA_DIR}/{INIT_CHANNEL}"
    return values


def _check_command_line(hyperparameters: dict[str, Any]) -> None:
    """The last guard before the toolkit's `/bin/sh`: every key and value it puts on the command line is one plain
    word (jobs.request.command_line). The request rules make this hold; a value that slips past them (a rule missing
    for a new field) ends the run as a bad request here rather than reaching a shell. The toolkit's own
    `sagemaker_*` keys stay off its command line and are not checked (`trainctl local` points one at a folder
    of this machine, whatever its name)."""
    on_command_line = {k: v for k, v in hyperparameters.items() if not k.startswith(TOOLKIT_PREFIX)}
    if problems := command_line_problems(on_command_line):
        raise RequestInvalid([Problem(f"hyperparameters.{key}", f"{message} (as the job would send it)")
                              for key, message in problems])


def strategy_and_degrees(request: JobRequest, instance_type: str) -> tuple[Strategy, dict[str, Any]]:
    """The strategy and torch-native degrees the attempt runs: the request's `strategy` and `parallel` section, or
    for `strategy: auto` the planner's pick with its degrees (what `trainctl plan` sized and shows), planned for
    the attempt's instance type: a fallback type with fewer GPUs per node needs other degrees."""
    if request.strategy is not Strategy.AUTO:
        return request.strategy, request_hyperparameters(request)
    chosen = plan_for_request(request, None if request.instance_groups else instance_type)
    return Strategy(chosen.strategy), chosen.parallel


def attempt_training_plan(request: JobRequest, platform: PlatformSettings, starts_at: float,
                          plans_ended: list[str] | tuple[str, ...] = ()) -> TrainingPlan | None:
    """The request's training plan, unless its end_time says its instances are reclaimed by `starts_at`, or an
    earlier attempt of the run was stopped on it (`plans_ended`: a plan's end stops its jobs, and its ARN is
    refused after): then the attempt runs on demand on the same type (a plan request has neither Spot nor
    fallbacks: jobs.request.cross_rules)."""
    plan = platform.training_plans[request.training_plan] if request.training_plan is not None else None
    if plan is None or plan.name in plans_ended:
        return None
    if plan.end_time is not None and starts_at >= reclaim_epoch(plan.end_time):
        return None
    return plan


def _cadence(request: JobRequest, instance_type: str, spot: bool, plan: TrainingPlan | None, starts_at: float,
             hyperparameters: dict[str, Any], measured_stall_s: float | None) -> dict[str, Any]:
    """`checkpoint_minutes` from the planner's Young/Daly interval for this attempt's type, count and Spot, fitted
    before the plan's end on a training plan; nothing when the request sets it (0 included: steps only) or the
    planner cannot size the attempt (the job then checkpoints by steps only, TrainConfig's default)."""
    if any(canonical_name(k) == "checkpoint_minutes" for k in hyperparameters):
        return {}
    cad = attempt_cadence(request, instance_type, spot, measured_stall_s)
    if cad is None:
        return {}
    minutes = cad.interval_min
    if plan is not None and plan.end_time is not None:
        minutes = before_plan_end(minutes, cad.save_s, starts_at, reclaim_epoch(plan.end_time))
    return {"checkpoint_minutes": round(minutes, 1)}  # as `trainctl plan` shows it


def _channels(request: JobRequest, platform: PlatformSettings) -> list[dict[str, Any]]:
    channels = [_channel(TRAIN_CHANNEL, request.dataset, request, platform)]
    if request.validation_dataset:
        channels.append(_channel(VALIDATION_CHANNEL, request.validation_dataset, request, platform))
    if request.init_from_run:
        # The other run's whole checkpoint prefix, read-only, in File mode: the training package starts from its
        # newest complete step. Its prefix is under the platform's (a team's) own: the execution role reads it.
        channels.append({
            "ChannelName": INIT_CHANNEL,
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix",
                                            "S3Uri": checkpoint_s3_uri(platform, request.init_from_run),
                                            "S3DataDistributionType": "FullyReplicated"}},
            "InputMode": "File",
        })
    if request.network_isolation:
        channels.append({
            "ChannelName": CODE_CHANNEL,
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": platform.source_dir_s3_uri,
                                            "S3DataDistributionType": "FullyReplicated"}},
            "InputMode": "File",
        })
    return channels


def _channel(name: str, uri: str, request: JobRequest, platform: PlatformSettings) -> dict[str, Any]:
    kind = dataset_kind(uri)
    if request.effective_input_mode == "FSx":
        if kind == "fsx":
            directory = f"/{platform.fsx.mount_name}/{fsx_path(uri)}"
        else:  # s3://<dataset bucket>/<linked prefix><key>: the same objects as /<mount>/<linked_path>/<key>
            directory = platform.fsx_directory(uri)
            if directory is None:  # jobs.request.platform_rules refuses it: the file system does not hold it
                raise ValueError(f"{uri} is outside the file system's linked prefix")
        return {
            "ChannelName": name,
            "DataSource": {"FileSystemDataSource": {
                "FileSystemId": platform.fsx.file_system_id,
                "FileSystemType": "FSxLustre",
                "FileSystemAccessMode": "ro",
                "DirectoryPath": directory,
            }},
            "InputMode": "File",
        }
    if kind == "local":
        # Only `trainctl local` renders these (validate_for_platform refuses them elsewhere): the local
        # runner maps the channel to the folder; SageMaker itself never sees a file:// URI.
        uri = uri if uri.startswith("file://") else f"file://{uri}"
    return {
        "ChannelName": name,
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                        # every rank reads the whole set and shards it itself
                                        "S3DataDistributionType": "FullyReplicated"}},
        "InputMode": request.effective_input_mode,
    }


def _resources(request: JobRequest, platform: PlatformSettings, instance_type: str,
               plan: TrainingPlan | None) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    types: list[str]
    if request.instance_groups:
        resources["InstanceGroups"] = [
            {"InstanceGroupName": g.name, "InstanceType": g.type, "InstanceCount": g.count}
            for g in request.instance_groups]
        types = [g.type for g in request.instance_groups]
        volume = 100
    else:
        resources["InstanceType"] = instance_type
        resources["InstanceCount"] = request.instance.count
        types = [instance_type]
        volume = request.instance.volume_gb
    resources["VolumeSizeInGB"] = volume
    # Types with local NVMe use the instance store, encrypted by the hardware; the API rejects a key there.
    if not any((s := catalog.lookup(t)) and s.local_nvme for t in types):
        resources["VolumeKmsKeyId"] = platform.kms_key_arn
    minutes = request.warm_pool_minutes if request.warm_pool_minutes is not None else platform.default_warm_pool_minutes
    if minutes and not request.instance_groups:
        resources["KeepAlivePeriodInSeconds"] = minutes * 60
    if plan is not None:
        resources["TrainingPlanArn"] = plan.arn
    return resources


def _stopping(request: JobRequest, spot: bool, instance_type: str) -> dict[str, int]:
    runtime = round(request.max_runtime_hours * 3600)
    stopping = {"MaxRuntimeInSeconds": runtime}
    if spot:
        # MaxWait covers the runtime plus time waiting for Spot capacity: never below the runtime.
        stopping["MaxWaitTimeInSeconds"] = max(runtime, round(request.spot_max_wait_hours * 3600))
    spec = catalog.lookup(instance_type)
    if request.max_pending_hours is not None and spec is not None and spec.accelerated:
        stopping["MaxPendingTimeInSeconds"] = round(request.max_pending_hours * 3600)
    return stopping


def _profiler(request: JobRequest, platform: PlatformSettings, run_id: str) -> dict[str, Any]:
    if not request.profiler:
        return {"DisableProfiler": True}
    return {
        "S3OutputPath": f"s3://{platform.output_bucket}/{platform.name_prefix}/{run_id}/profiler/",
        "ProfilingIntervalInMilliseconds": PROFILING_INTERVAL_MS,
        "DisableProfiler": False,
    }


def _tags(request: JobRequest, platform: PlatformSettings, run_id: str, attempt: int,
          strategy: Strategy) -> list[dict[str, str]]:
    own = platform_tags(platform.name_prefix, run_id=run_id, attempt=attempt, request=request.name,
                        strategy=strategy.value)
    own.update(platform.job_tags)  # a team's cost allocation tag
    tags = [{"Key": k, "Value": v} for k, v in own.items()]
    tags += [{"Key": k, "Value": v} for k, v in request.tags.items() if k not in own]
    return tags
