"""Rendering: exact CreateTrainingJob requests that botocore's own validation accepts, for every attempt."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from botocore.exceptions import ParamValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.container import (
    ENV_EPOCH,
    ENV_METRICS_NAMESPACE,
    ENV_MLFLOW_EXPERIMENT,
    ENV_MLFLOW_TRACKING_URI,
    ENV_PRICE,
    ENV_REQUEST,
    ENV_RUN_ID,
    ENV_TENSORBOARD_DIR,
    STOP_FILE,
    TENSORBOARD_DIR,
    TOO_LONG,
)
from contract.metrics import MAX_METRIC_DEFINITIONS, METRIC_NAMES, metric_definitions
from jobs import catalog
from jobs.naming import JOB_NAME, NAME_NONCE_CHARS, RUN_TOKEN_CHARS, job_name, new_name_nonce, new_run_id
from jobs.platform import LocalPlatformSettings, PlatformSettings
from jobs.render import training_job as render_module
from jobs.render.container_entry import IMAGE_START
from jobs.render.training_job import CREATE_REQUEST_KEYS, checkpoint_s3_uri, render_create_training_job
from jobs.request.environment_rules import credential_problem
from jobs.request.parse import PLATFORM_ENVIRONMENT, RequestInvalid, parse_request, validate_for_platform
from tests.jobs.conftest import REQUEST_EXAMPLES, assert_valid_create_request, load_platform

BASE = {"name": "gpt-small", "dataset": "s3://mltrain-datasets-123456789012-us-east-1/tokens/train/",
        "instance": {"type": "ml.g5.12xlarge"}}
RUN_ID = new_run_id("gpt-small")


def render(doc, platform, attempt=1, **kw):
    req = parse_request({**BASE, **doc})
    validate_for_platform(req, platform)
    return render_create_training_job(req, platform, run_id=RUN_ID, attempt=attempt, **kw)


def decoded(create) -> dict:
    return {k: json.loads(v) for k, v in create["HyperParameters"].items()}


@pytest.mark.parametrize(("keys", "named"), [
    (CREATE_REQUEST_KEYS[:-1], "rendered only: ['Tags']"),  # the state machine would drop the tags
    ((*CREATE_REQUEST_KEYS, "RetryStrategy"), "mapped only: ['RetryStrategy']"),  # every launch would fail
    (CREATE_REQUEST_KEYS[::-1], "rendered only: [], mapped only: []"),  # same keys, another order
])
def test_a_render_whose_keys_are_not_the_mapped_ones_fails(monkeypatch, platform, keys, named):
    monkeypatch.setattr(render_module, "CREATE_REQUEST_KEYS", keys)
    with pytest.raises(RuntimeError, match="change CREATE_REQUEST_KEYS with render_create_training_job") as failed:
        render({}, platform)
    assert named in str(failed.value)


def test_the_key_check_holds_under_python_O():
    """`python -O` drops asserts; the check must not be one."""
    child = ("import jobs.render.training_job as r; from tests.jobs.conftest import load_platform; "
             "from tests.jobs.render.test_render import BASE; from jobs.request.parse import parse_request; "
             "r.CREATE_REQUEST_KEYS = r.CREATE_REQUEST_KEYS[:-1]\n"
             "try: r.render_create_training_job(parse_request(BASE), load_platform(), run_id='gpt-1234', attempt=1)\n"
             "except RuntimeError as e: print('refused:', e)")
    done = subprocess.run([sys.executable, "-O", "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: the rendered CreateTrainingJob keys")


@pytest.mark.parametrize("path", [p for p in REQUEST_EXAMPLES if not p.name.startswith("local-")], ids=lambda p: p.name)
def test_examples_render_valid_requests_for_every_attempt(path, platform):
    req = parse_request(json.loads(path.read_text()))
    validate_for_platform(req, platform)
    run_id = new_run_id(req.name)
    names, prefixes, renders = set(), set(), 0
    for attempt in (1, 2, 30):
        for instance_type in req.instance_types:
            for spot in (True, False):
                create = render_create_training_job(req, platform, run_id=run_id, attempt=attempt,
                                                    instance_type=instance_type, spot=spot)
                assert tuple(create) == CREATE_REQUEST_KEYS
                assert_valid_create_request(create)
                assert create["ResourceConfig"]["InstanceType"] == instance_type
                assert create["EnableManagedSpotTraining"] is spot
                assert create["TrainingJobName"].endswith(f"-a{attempt}")
                names.add(create["TrainingJobName"])
                prefixes.add(create["CheckpointConfig"]["S3Uri"])
                renders += 1
    assert len(names) == renders, "a fresh job name every time an attempt is rendered"
    assert prefixes == {checkpoint_s3_uri(platform, run_id)}, "one checkpoint prefix per run"


def test_local_example_renders_file_channels():
    local = LocalPlatformSettings.of(load_platform())
    req = parse_request(json.loads(next(p for p in REQUEST_EXAMPLES if p.name == "local-fsdp.json").read_text()))
    validate_for_platform(req, local)
    create = render_create_training_job(req, local, run_id=new_run_id(req.name), attempt=1)
    uris = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in create["InputDataConfig"]}
    assert uris == {"train": "file://./data/stdlib-bytes/train", "validation": "file://./data/stdlib-bytes/validation"}
    hp = decoded(create)
    assert (hp["strategy"], hp["model_size"], hp["checkpoint_interval"], hp["max_steps"]) == ("fsdp", "tiny", 50, 120)


def test_botocore_validation_catches_a_broken_request(platform):
    # The check the hypothesis test relies on does fail on bad input.
    create = render({}, platform)
    del create["RoleArn"]
    with pytest.raises(ParamValidationError):
        assert_valid_create_request(create)
    create = render({}, platform)
    create["ResourceConfig"]["InstanceType"] = "ml.nope.xlarge"
    with pytest.raises(AssertionError, match="not in the enum"):
        assert_valid_create_request(create)


def test_job_names_fit_sagemakers_rules_and_the_role_prefix(platform):
    run_id = new_run_id("x" * 80)
    long_prefix = dataclasses.replace(platform, name_prefix="a-rather-long-platform-prefix")
    for settings_ in (platform, long_prefix):
        for attempt in (1, 9, 10, 30, 999):
            nonce = new_name_nonce()
            name = job_name(settings_.name_prefix, run_id, attempt, nonce)
            assert len(name) <= 63 and JOB_NAME.fullmatch(name), name
            assert name.startswith(f"{settings_.name_prefix}-") and name.endswith(f"-{nonce}-a{attempt}")
            # The run id's random part is kept whole: only the request name's slug gives way.
            assert run_id.rsplit("-", 1)[1] in name
    assert new_run_id("gpt").startswith("gpt-") and new_run_id("  ").startswith("run-")


def test_run_ids_carry_at_least_64_random_bits():
    ids = [new_run_id("gpt") for _ in range(1000)]
    assert len(set(ids)) == 1000
    tokens = [i.removeprefix("gpt-") for i in ids]
    # 16 characters of a 32-letter alphabet: 80 bits.
    assert all(len(t) == RUN_TOKEN_CHARS and set(t) <= set("abcdefghijklmnopqrstuvwxyz234567") for t in tokens)
    assert RUN_TOKEN_CHARS * 5 >= 64
    # Every character position takes many values: the bits are spread, not a counter or a constant.
    assert all(len({t[i] for t in tokens}) > 16 for i in range(RUN_TOKEN_CHARS))


def test_each_attempt_name_has_fresh_random_characters(platform):
    # Not derivable from the run id and the attempt number: nobody can take attempt 2's name ahead.
    names = {render({}, platform, attempt=2)["TrainingJobName"] for _ in range(200)}
    assert len(names) == 200
    nonces = {n.rsplit("-", 2)[1] for n in names}
    assert all(len(n) == NAME_NONCE_CHARS for n in nonces)


def test_the_run_marker_is_the_platforms_own(platform):
    with pytest.raises(RequestInvalid, match=ENV_RUN_ID):
        render({"environment": {ENV_RUN_ID: "someone-elses-run"}}, platform)


def test_the_metrics_namespace_is_the_platforms_own(platform):
    """A request naming another team's namespace would send its values there (its role cannot write it, but the job
    would believe it does); the platform sets it, no request may."""
    with pytest.raises(RequestInvalid, match=ENV_METRICS_NAMESPACE):
        render({"environment": {ENV_METRICS_NAMESPACE: "TrainingPlatform/mltrain--b"}}, platform)


def test_the_epoch_is_the_platforms_own_and_grows_with_the_attempt(platform):
    """A request that sets its own epoch could fence out the run's real attempts (or never be fenced itself)."""
    with pytest.raises(RequestInvalid, match=ENV_EPOCH):
        render({"environment": {ENV_EPOCH: "999999"}}, platform)
    assert [render({}, platform, attempt=n)["Environment"][ENV_EPOCH] for n in (1, 2, 3)] == ["1", "2", "3"]
    assert render({}, platform, attempt=2, epoch=7)["Environment"][ENV_EPOCH] == "7"


def test_launcher_and_script_hyperparameters_are_json_encoded(platform):
    create = render({"strategy": "fsdp", "hyperparameters": {"lr": 0.001, "compile": True}}, platform)
    hp = create["HyperParameters"]
    assert hp["sagemaker_program"] == '"train.py"'
    assert hp["sagemaker_torch_distributed_enabled"] == "true"
    assert hp["compile"] == "true" and hp["lr"] == "0.001"
    values = decoded(create)
    assert values["sagemaker_submit_directory"] == platform.source_dir_s3_uri
    assert values["sagemaker_job_name"] == create["TrainingJobName"]
    assert values["sagemaker_region"] == platform.region
    assert values["sagemaker_instance_type"] == "ml.g5.12xlarge"
    assert values["sagemaker_container_log_level"] == 20
    assert (values["strategy"], values["model"], values["model_size"], values["checkpoint_interval"]) == (
        "fsdp", "gpt", "small", 500)
    assert "mp_parameters" not in values
    assert decoded(render({"strategy": "single", "instance": {"type": "ml.g5.2xlarge"}}, platform))[
        "sagemaker_torch_distributed_enabled"] is False


def test_smp_gets_its_image_and_mp_parameters(platform):
    create = render({"strategy": "smp", "instance": {"type": "ml.p5.48xlarge", "count": 2},
                     "parallel": {"tensor_parallel_degree": 4, "hybrid_shard_degree": 2}}, platform)
    assert create["AlgorithmSpecification"]["TrainingImage"] == platform.images["pytorch-smp"]["2.5.1"]["gpu"]
    values = decoded(create)
    assert values["mp_parameters"] == {"tensor_parallel_degree": 4, "hybrid_shard_degree": 2}
    assert values["sagemaker_distributed_dataparallel_enabled"] is False
    assert values["sagemaker_torch_distributed_enabled"] is True
    assert json.loads(create["HyperParameters"]["mp_parameters"]) == values["mp_parameters"]


def test_images_follow_the_device(platform):
    gpu = render({}, platform)["AlgorithmSpecification"]["TrainingImage"]
    cpu = render({"instance": {"type": "ml.c5.4xlarge"}}, platform)["AlgorithmSpecification"]["TrainingImage"]
    assert (gpu, cpu) == (platform.images["pytorch"]["2.8.0"]["gpu"], platform.images["pytorch"]["2.8.0"]["cpu"])
    assert render({"image": "my.registry/train:1"}, platform)["AlgorithmSpecification"]["TrainingImage"] == \
        "my.registry/train:1"


def test_the_platforms_pytorch_images_start_through_the_stop_forwarding_entry(platform):
    """SageMaker signals only PID 1, which in its PyTorch images drops SIGTERM: the platform's own entry runs
    the image's script and turns the signal into the stop file. Images it did not pick keep their entry."""
    for doc in ({}, {"instance": {"type": "ml.c5.4xlarge"}}, {"strategy": "single", "instance": {"type": "ml.g5.2xlarge"}}):
        create = render(doc, platform)
        entry = create["AlgorithmSpecification"]["ContainerEntrypoint"]
        # the outer shell reads the secrets, then `exec`s the stop relay (its second argument) as PID 1
        assert entry[:2] == ["bash", "-c"] and "exec" in entry[2] and STOP_FILE in entry[5] and IMAGE_START in entry[5]
        assert_valid_create_request(create)  # botocore's model: at most 100 items of at most 256 characters
    assert "ContainerEntrypoint" not in render({"image": "my.registry/train:1"}, platform)["AlgorithmSpecification"]
    smp = render({"strategy": "smp", "instance": {"type": "ml.p5.48xlarge", "count": 2},
                  "parallel": {"tensor_parallel_degree": 4, "hybrid_shard_degree": 2}}, platform)
    assert "ContainerEntrypoint" not in smp["AlgorithmSpecification"]


def test_naming_the_platforms_own_image_keeps_the_stop_relay(platform):
    """The same image as the platform would pick, named in the request, starts the same way (it lost the relay,
    and a Spot reclaim then lost everything since the last checkpoint): for each of the table's PyTorch images."""
    resolved = render({}, platform)["AlgorithmSpecification"]["ContainerEntrypoint"]
    for version, devices in platform.images["pytorch"].items():
        for device, uri in devices.items():
            doc = {"image": uri, **({"instance": {"type": "ml.c5.4xlarge"}} if device == "cpu" else {})}
            named = render(doc, platform)["AlgorithmSpecification"]
            assert named["TrainingImage"] == uri and named["ContainerEntrypoint"] == resolved, (version, device)
    # The SMP image named explicitly keeps its own entry, as when the platform resolves it.
    smp_uri = next(iter(next(iter(platform.images["pytorch-smp"].values())).values()))
    assert "ContainerEntrypoint" not in render({"image": smp_uri}, platform)["AlgorithmSpecification"]


def test_spot_sets_max_wait_and_on_demand_drops_it(platform):
    create = render({"spot": True, "max_runtime_hours": 10}, platform)
    assert create["StoppingCondition"] == {"MaxRuntimeInSeconds": 36000, "MaxWaitTimeInSeconds": 72000}
    assert create["EnableManagedSpotTraining"] is True
    create = render({"spot": True, "max_runtime_hours": 10, "max_wait_hours": 12}, platform, spot=False)
    assert create["StoppingCondition"] == {"MaxRuntimeInSeconds": 36000}
    assert create["EnableManagedSpotTraining"] is False
    assert render({"spot": True, "max_runtime_hours": 672}, platform)["StoppingCondition"][
        "MaxWaitTimeInSeconds"] == 672 * 3600


def test_fsx_channels_are_mounted_paths(platform):
    create = render({"dataset": "fsx:/datasets/c4/train", "validation_dataset": "fsx:///datasets/c4/val/"}, platform)
    channels = {c["ChannelName"]: c for c in create["InputDataConfig"]}
    src = channels["train"]["DataSource"]["FileSystemDataSource"]
    assert src == {"FileSystemId": "fs-0123456789abcdef0", "FileSystemType": "FSxLustre",
                   "FileSystemAccessMode": "ro", "DirectoryPath": "/abcdefgh/datasets/c4/train"}
    assert channels["validation"]["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == "/abcdefgh/datasets/c4/val"
    assert create["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    # an S3 URI in the dataset bucket, read through the file system's linked folder
    create = render({"input_mode": "FSx"}, platform)
    assert create["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == \
        "/abcdefgh/datasets/tokens/train"
    assert_valid_create_request(create)


def test_s3_channels_and_input_modes(platform):
    for mode in ("File", "FastFile"):
        create = render({"input_mode": mode}, platform)
        assert create["AlgorithmSpecification"]["TrainingInputMode"] == mode
        assert create["InputDataConfig"] == [{"ChannelName": "train", "InputMode": mode, "DataSource": {
            "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": BASE["dataset"],
                             "S3DataDistributionType": "FullyReplicated"}}}]


def test_encryption_network_and_paths(platform):
    create = render({}, platform)
    assert create["RoleArn"] == platform.execution_role_arn
    assert create["OutputDataConfig"]["KmsKeyId"] == platform.kms_key_arn
    assert create["OutputDataConfig"]["S3OutputPath"].startswith(f"s3://{platform.output_bucket}/mltrain/gpt-small-")
    assert create["VpcConfig"] == {"SecurityGroupIds": platform.security_group_ids, "Subnets": platform.subnet_ids}
    assert create["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    ckpt = create["CheckpointConfig"]["S3Uri"]
    assert ckpt.startswith(f"s3://{platform.checkpoint_bucket}/mltrain/") and ckpt.endswith("/checkpoints/")
    # g5 has local NVMe: the API rejects a volume key there; m5 has EBS only: the key is set.
    assert "VolumeKmsKeyId" not in create["ResourceConfig"]
    assert render({"instance": {"type": "ml.m5.xlarge"}}, platform)["ResourceConfig"]["VolumeKmsKeyId"] == \
        platform.kms_key_arn
    assert create["EnableNetworkIsolation"] is False and create["EnableInterContainerTrafficEncryption"] is False


def test_a_team_with_its_own_key_writes_its_outputs_with_it(platform):
    # team_keys: the team's buckets are encrypted with its own key, and so are the outputs SageMaker writes for it;
    # the instances' volumes stay on the platform key (SageMaker creates grants on it for them).
    team = dataclasses.replace(platform, data_kms_key_arn="arn:aws:kms:us-east-1:123456789012:key/team-a")
    create = render({"instance": {"type": "ml.m5.xlarge"}}, team)
    assert create["OutputDataConfig"]["KmsKeyId"] == team.data_kms_key_arn
    assert create["ResourceConfig"]["VolumeKmsKeyId"] == platform.kms_key_arn
    assert render({}, platform)["OutputDataConfig"]["KmsKeyId"] == platform.kms_key_arn


def test_network_isolation_ships_the_code_as_a_channel(platform):
    create = render({"network_isolation": True, "inter_container_encryption": True}, platform)
    assert create["EnableNetworkIsolation"] is True and create["EnableInterContainerTrafficEncryption"] is True
    code = [c for c in create["InputDataConfig"] if c["ChannelName"] == "code"]
    assert code[0]["DataSource"]["S3DataSource"]["S3Uri"] == platform.source_dir_s3_uri
    assert decoded(create)["sagemaker_submit_directory"] == "/opt/ml/input/data/code/sourcedir.tar.gz"


def test_optional_settings_always_have_a_form(platform):
    plain = render({}, platform)
    assert plain["ProfilerConfig"] == {"DisableProfiler": True}
    assert plain["InfraCheckConfig"] == {"EnableInfraCheck": False}
    # The platform's own metrics namespace: the one its job role may write besides SageMaker's, where its alarms read.
    assert plain["Environment"] == {**PLATFORM_ENVIRONMENT, ENV_RUN_ID: RUN_ID, ENV_EPOCH: "1",
                                    ENV_METRICS_NAMESPACE: f"TrainingPlatform/{platform.name_prefix}",
                                    ENV_TENSORBOARD_DIR: TENSORBOARD_DIR}
    # TensorBoard (on by default): SageMaker syncs the folder the job writes to the run's own prefix.
    assert plain["TensorBoardOutputConfig"] == {
        "LocalPath": TENSORBOARD_DIR,
        "S3OutputPath": f"s3://{platform.output_bucket}/{platform.name_prefix}/{RUN_ID}/tensorboard/"}
    off = render({"tensorboard": False}, platform)
    assert ENV_TENSORBOARD_DIR not in off["Environment"] and off["TensorBoardOutputConfig"] == \
        plain["TensorBoardOutputConfig"]  # rendered all the same (the state machine maps it); nothing is written
    # MLflow: the platform's tracking server and the team's own experiment there, only where the platform names one.
    tracked = render({}, dataclasses.replace(platform, mlflow_tracking_uri="https://mlflow.example.com"))
    request_fields = tracked["Environment"].pop(ENV_REQUEST)
    assert tracked["Environment"] == {**plain["Environment"], ENV_MLFLOW_TRACKING_URI: "https://mlflow.example.com",
                                      ENV_MLFLOW_EXPERIMENT: platform.name_prefix}
    # The request's fields its hyperparameters do not carry, for the MLflow run's parameters.
    assert json.loads(request_fields) == {"name": "gpt-small", "dataset": BASE["dataset"], "spot": False,
                                          "instance": {"type": "ml.g5.12xlarge", "count": 1, "fallbacks": [],
                                                       "volume_gb": 100}, "max_runtime_hours": 24.0}
    assert_valid_create_request(tracked)
    assert "KeepAlivePeriodInSeconds" not in plain["ResourceConfig"]
    full = render({"profiler": True, "infra_check": True, "warm_pool_minutes": 30, "environment": {"NCCL_DEBUG": "1"},
                   "max_pending_hours": 1, "training_plan": "p5-reserved",
                   "instance": {"type": "ml.p5.48xlarge", "count": 2}}, platform)
    assert full["ProfilerConfig"]["DisableProfiler"] is False
    assert full["ProfilerConfig"]["S3OutputPath"].endswith("/profiler/")
    assert full["InfraCheckConfig"] == {"EnableInfraCheck": True}
    assert full["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert full["ResourceConfig"]["TrainingPlanArn"] == platform.training_plans["p5-reserved"].arn
    assert full["StoppingCondition"]["MaxPendingTimeInSeconds"] == 3600
    assert full["Environment"] == {**PLATFORM_ENVIRONMENT, "NCCL_DEBUG": "1", ENV_RUN_ID: RUN_ID, ENV_EPOCH: "1",
                                   ENV_METRICS_NAMESPACE: f"TrainingPlatform/{platform.name_prefix}",
                                   ENV_TENSORBOARD_DIR: TENSORBOARD_DIR}
    assert_valid_create_request(full)
    warm_default = dataclasses.replace(platform, default_warm_pool_minutes=10)
    assert render({}, warm_default)["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600
    assert "KeepAlivePeriodInSeconds" not in render({"warm_pool_minutes": 0}, warm_default)["ResourceConfig"]


def test_instance_groups(platform):
    create = render({"instance": None, "instance_groups": [
        {"name": "train", "type": "ml.p4d.24xlarge", "count": 2}, {"name": "data", "type": "ml.c5.4xlarge"}]},
        platform)
    res = create["ResourceConfig"]
    assert res["InstanceGroups"] == [
        {"InstanceGroupName": "train", "InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
        {"InstanceGroupName": "data", "InstanceType": "ml.c5.4xlarge", "InstanceCount": 1}]
    assert "InstanceType" not in res and "KeepAlivePeriodInSeconds" not in res
    values = decoded(create)
    assert values["sagemaker_distribution_instance_groups"] == ["train"]
    assert values["sagemaker_instance_type"] == "ml.p4d.24xlarge"
    assert_valid_create_request(create)


@pytest.mark.parametrize(("long", "replaced"), [
    (["dataset"], ["dataset"]),
    (["dataset", "validation_dataset"], ["dataset", "validation_dataset"]),
    # The image's 230 characters fit once the two URIs gave way: the longest go first, and no more than needed.
    (["dataset", "validation_dataset", "image", "init_from_run"], ["dataset", "validation_dataset"]),
])
def test_request_fields_too_long_for_a_variable_give_way_and_stay_named(platform, long, replaced):
    """A job's environment value holds 512 characters; S3 URIs hold 1,024: the longest values give way to TOO_LONG,
    every field stays named, the others keep their values, and the request still renders a valid job."""
    tracked = dataclasses.replace(platform, mlflow_tracking_uri="https://mlflow.example.com")
    doc = {"dataset": f"s3://mltrain-datasets-123456789012-us-east-1/{'a' * 900}/",
           "validation_dataset": f"s3://mltrain-datasets-123456789012-us-east-1/{'b' * 400}/",
           "image": f"123456789012.dkr.ecr.us-east-1.amazonaws.com/team-a/{'c' * 170}:latest",
           "init_from_run": new_run_id("gpt-small")}
    doc = {k: v for k, v in doc.items() if k in long}
    create = render(doc, tracked)
    text = create["Environment"][ENV_REQUEST]
    fields = json.loads(text)
    assert len(text) <= 512 and fields["name"] == "gpt-small" and fields["instance"]["type"] == "ml.g5.12xlarge"
    assert set(long) <= set(fields) and [k for k in fields if fields[k] == TOO_LONG] == replaced
    assert all(fields[k] == doc[k] for k in long if k not in replaced)
    assert_valid_create_request(create)


PRICES = {"ml.g5.12xlarge": 7.09, "ml.p4d.24xlarge": 37.6885, "ml.c5.4xlarge": 0.952, "ml.p5.48xlarge": 113.071}


@pytest.mark.parametrize(("doc", "spot", "usd_per_hour"), [
    ({}, False, 7.09),
    ({"spot": True, "instance": {"type": "ml.p4d.24xlarge", "count": 4}}, True, 4 * 37.6885),
    # A cluster of instance groups costs what all its instances cost.
    ({"instance": None, "instance_groups": [{"name": "train", "type": "ml.p4d.24xlarge", "count": 2},
                                            {"name": "data", "type": "ml.c5.4xlarge"}]}, False, 2 * 37.6885 + 0.952),
])
def test_an_attempt_carries_its_price_where_its_mlflow_run_tags_the_cost(platform, doc, spot, usd_per_hour):
    tracked = dataclasses.replace(platform, mlflow_tracking_uri="https://mlflow.example.com")
    create = render(doc, tracked, prices=PRICES)
    assert json.loads(create["Environment"][ENV_PRICE]) == {"usd_per_hour": round(usd_per_hour, 4), "spot": spot}
    assert_valid_create_request(create)
    # A retry on another type is priced as that type.
    fallback = render(doc, tracked, attempt=2, instance_type="ml.p5.48xlarge", prices=PRICES)
    if "instance_groups" not in doc:
        count = create["ResourceConfig"]["InstanceCount"]
        assert json.loads(fallback["Environment"][ENV_PRICE])["usd_per_hour"] == round(count * 113.071, 4)


@pytest.mark.parametrize("case", ["no MLflow server", "a type without a price", "no prices", "a training plan"])
def test_an_attempt_carries_no_price_it_does_not_know_or_nobody_reads(platform, case):
    tracked = dataclasses.replace(platform, mlflow_tracking_uri="https://mlflow.example.com")
    doc, prices, where = {"instance": {"type": "ml.p5.48xlarge", "count": 2}}, PRICES, tracked
    if case == "no MLflow server":
        where = platform
    elif case == "a type without a price":
        prices = {k: v for k, v in PRICES.items() if k != "ml.p5.48xlarge"}
    elif case == "no prices":
        prices = {}  # the Price List API did not answer (jobs.handler.training_prices)
    else:
        doc["training_plan"] = "p5-reserved"  # its instances are paid for up front, not by the hour
    create = render(doc, where, prices=prices)
    assert ENV_PRICE not in create["Environment"]
    assert ("TrainingPlanArn" in create["ResourceConfig"]) == (case == "a training plan")
    assert ENV_PRICE in render({"instance": {"type": "ml.p5.48xlarge", "count": 2}}, tracked, prices=PRICES)[
        "Environment"]  # the same request, priced, on a platform with MLflow


def test_tags_tie_the_job_to_its_run_and_attempt(platform):
    create = render({"tags": {"team": "nlp"}}, platform, attempt=3)
    tags = {t["Key"]: t["Value"] for t in create["Tags"]}
    assert tags == {"mltrain:run-id": RUN_ID, "mltrain:attempt": "3", "mltrain:request": "gpt-small",
                    "mltrain:strategy": "ddp", "team": "nlp"}


def test_metric_definitions_come_from_jobs_metrics(platform):
    create = render({"metrics": [{"name": "acc", "regex": "acc=([0-9.]+)"}]}, platform)
    assert create["AlgorithmSpecification"]["MetricDefinitions"] == [
        *metric_definitions(), {"Name": "acc", "Regex": "acc=([0-9.]+)"}]


def test_attempt_numbers_start_at_one(platform):
    with pytest.raises(ValueError, match="start at 1"):
        render({}, platform, attempt=0)


# ---- many generated requests, each rendered for a random attempt, all through botocore's validation ----

_GPU_TYPES = sorted(t for t, s in catalog.CATALOG.items() if s.kind == "gpu")
_CPU_TYPES = sorted(t for t, s in catalog.CATALOG.items() if s.kind == "cpu")
_ALL_PLATFORM = dataclasses.replace(load_platform(), allowed_instance_types=catalog.instance_types())
_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=12)
_name = st.from_regex(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,38}[a-zA-Z0-9])?", fullmatch=True)
_hp_values = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False, width=32),
                       st.booleans(), _text, st.lists(st.integers(0, 9), max_size=3))
def _valid_hp_value(name: str):
    import typing

    from contract.hyperparameters import TrainConfig

    f = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
    tp = typing.get_type_hints(TrainConfig)[name]
    tp = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
    low, high = f.metadata.get("min"), f.metadata.get("max")
    if f.metadata.get("choices"):
        return st.sampled_from(f.metadata["choices"])
    if tp is bool:
        return st.booleans()
    if tp is int:
        return st.integers(int(low) if low is not None else -10**6, int(high) if high is not None else 10**6)
    return st.floats(low if low is not None else -1e6, high if high is not None else 1e6, width=32)


_HP_KEYS = ["lr", "max_steps", "micro_batch_size", "warmup_steps", "precision", "compile", "seed", "dropout",
            "eval_interval", "seq_len", "weight_decay", "grad_clip", "keep_checkpoints", "log_interval"]


@st.composite
def job_requests(draw) -> dict:
    strategy = draw(st.sampled_from(["single", "ddp", "fsdp", "smp", "auto"]))
    groups = strategy in ("ddp", "fsdp") and draw(st.booleans())
    doc: dict = {"name": draw(_name), "strategy": strategy}
    store = draw(st.sampled_from(["s3", "fsx", "s3-via-fsx"]))
    if store == "s3":
        doc["dataset"] = f"s3://{_ALL_PLATFORM.dataset_bucket}/{draw(_text)}/"
        doc["input_mode"] = draw(st.sampled_from([None, "File", "FastFile"]))
        if draw(st.booleans()):
            doc["validation_dataset"] = f"s3://other-bucket-1/{draw(_text)}/"
    elif store == "fsx":  # under the folder the file system links (FsxSettings.linked_path)
        linked = _ALL_PLATFORM.fsx.linked_path.strip("/")
        doc["dataset"] = f"fsx:/{linked}/{draw(_text)}/{draw(_text)}"
        if draw(st.booleans()):
            doc["validation_dataset"] = f"fsx:/{linked}/{draw(_text)}"
    else:
        doc["dataset"] = f"s3://{_ALL_PLATFORM.dataset_bucket}/{draw(_text)}/"
        doc["input_mode"] = "FSx"
    if groups:
        n = draw(st.integers(1, 4))
        doc["instance_groups"] = [{"name": f"g{i}-{draw(_text)}"[:64], "type": draw(st.sampled_from(
            _GPU_TYPES if i == 0 else _GPU_TYPES + _CPU_TYPES)), "count": draw(st.integers(1, 8))} for i in range(n)]
    else:
        types = _GPU_TYPES if strategy == "smp" else _GPU_TYPES + _CPU_TYPES
        chosen = draw(st.lists(st.sampled_from(types), min_size=1, max_size=4, unique=True))
        count = 1 if strategy == "single" else draw(st.integers(1, 16))
        doc["instance"] = {"type": chosen[0], "count": count, "fallbacks": chosen[1:],
                           "volume_gb": draw(st.integers(1, 2000))}
        if strategy == "smp":
            gpus = min(catalog.CATALOG[t].accelerators for t in chosen)
            tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if gpus % d == 0]))
            doc["parallel"] = {"tensor_parallel_degree": tp}
            if all(catalog.CATALOG[t].accelerators * count // tp % 2 == 0 for t in chosen) and draw(st.booleans()):
                doc["parallel"]["hybrid_shard_degree"] = 2
    runtime = draw(st.floats(0.01, 672))
    doc["max_runtime_hours"] = runtime
    doc["spot"] = draw(st.booleans())
    if doc["spot"] and draw(st.booleans()):
        doc["max_wait_hours"] = draw(st.floats(runtime, 672))
    accelerated = all(catalog.CATALOG[t].accelerated for t in
                      ([g["type"] for g in doc.get("instance_groups", [])] or
                       [doc["instance"]["type"], *doc["instance"]["fallbacks"]]))
    if accelerated and draw(st.booleans()):
        doc["max_pending_hours"] = draw(st.floats(0.5, 672))
    doc["checkpoint_interval"] = draw(st.integers(1, 10**6))
    # Values the training package accepts: its own type, range and choices (contract.hyperparameters).
    keys = draw(st.lists(st.sampled_from(_HP_KEYS), unique=True, max_size=8))
    doc["hyperparameters"] = {k: draw(_valid_hp_value(k)) for k in keys}
    # Names from the allow-list (jobs.request.environment_rules), never a credential's.
    doc["environment"] = draw(st.dictionaries(st.from_regex(r"(NCCL|TORCH|HF|WANDB|MYLIB)_[A-Z0-9_]{0,16}",
                                                            fullmatch=True).filter(
        lambda k: credential_problem(k, "x") is None), _text, max_size=98))
    doc["tags"] = draw(st.dictionaries(st.from_regex(r"[a-z][a-z0-9 _.:/=+@-]{0,30}", fullmatch=True).filter(
        lambda k: not k.startswith("aws:")), st.from_regex(r"[A-Za-z0-9 _.:/=+@-]{0,40}", fullmatch=True),
        max_size=46))
    if not groups:
        doc["warm_pool_minutes"] = draw(st.integers(0, 360))
    for flag in ("profiler", "infra_check", "network_isolation", "inter_container_encryption"):
        doc[flag] = draw(st.booleans())
    doc["metrics"] = [{"name": f"extra_{i}", "regex": f"extra_{i}=([0-9.]+)"} for i in range(draw(st.integers(0, MAX_METRIC_DEFINITIONS - len(METRIC_NAMES))))]
    doc["retry"] = {"max_attempts": draw(st.integers(1, 30))}
    return {k: v for k, v in doc.items() if v is not None}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=job_requests(), attempt=st.integers(1, 30), execution=st.text(min_size=1, max_size=80),
       data=st.data())
def test_generated_requests_render_valid_create_training_job(doc, attempt, execution, data):
    try:
        req = parse_request(doc)
    except RequestInvalid as exc:  # the generator only builds valid requests: any problem is a bug
        raise AssertionError(f"generated request rejected:\n{exc}\n{json.dumps(doc, indent=1)}") from exc
    validate_for_platform(req, _ALL_PLATFORM)
    instance_type = data.draw(st.sampled_from(list(req.instance_types))) if req.instance else None
    spot = data.draw(st.sampled_from([None, True, False]))
    run_id = new_run_id(req.name + execution)
    create = render_create_training_job(req, _ALL_PLATFORM, run_id=run_id, attempt=attempt,
                                        instance_type=instance_type, spot=spot)
    assert tuple(create) == CREATE_REQUEST_KEYS
    assert_valid_create_request(create)
    assert create["CheckpointConfig"]["S3Uri"] == checkpoint_s3_uri(_ALL_PLATFORM, run_id)
    nonce = create["TrainingJobName"].rsplit("-", 2)[1]
    assert create["TrainingJobName"] == job_name(_ALL_PLATFORM.name_prefix, run_id, attempt, nonce)
    assert create["Environment"][ENV_RUN_ID] == run_id
    assert len(create["HyperParameters"]) <= 100 and len(create["Tags"]) <= 50
    assert len(create["AlgorithmSpecification"]["MetricDefinitions"]) <= 40
    assert create["EnableManagedSpotTraining"] is (req.spot if spot is None else spot)
    wait = create["StoppingCondition"].get("MaxWaitTimeInSeconds")
    assert (wait is not None) is create["EnableManagedSpotTraining"]
    assert wait is None or wait >= create["StoppingCondition"]["MaxRuntimeInSeconds"]


def test_platform_settings_round_trip(platform):
    assert PlatformSettings.from_dict(json.loads(json.dumps(platform.to_dict()))) == platform


@pytest.mark.parametrize(("size", "instance", "hps", "strategy"), [
    # tensor 2 x pipeline 2 x FSDP 8 (tests/jobs/test_auto_strategy.py says why it is no longer pp)
    ("7b", {"type": "ml.p4d.24xlarge", "count": 4}, {"micro_batch_size": 2}, "hybrid"),
    ("125m", {"type": "ml.g5.12xlarge", "count": 1}, {}, "ddp"),
])
def test_auto_strategy_renders_the_planners_choice(platform, size, instance, hps, strategy):
    create = render({"strategy": "auto", "model_size": size, "instance": instance, "hyperparameters": hps}, platform)
    assert decoded(create)["strategy"] == strategy
    assert {t["Key"]: t["Value"] for t in create["Tags"]}["mltrain:strategy"] == strategy


def test_torchrun_gets_a_shutdown_grace_that_fits_sagemakers_120_seconds():
    from jobs.platform import PlatformSettings
    from jobs.render.training_job import render_create_training_job
    from jobs.request.parse import parse_request
    from tests.conftest import ROOT

    platform = PlatformSettings.from_json((ROOT / "tests" / "jobs" / "data" / "platform.json").read_text())
    request = parse_request({**json.loads((ROOT / "examples" / "ddp-gpt-125m.json").read_text()),
                             "environment": {"MY_FLAG": "1"}})
    env = render_create_training_job(request, platform, run_id="r1", attempt=1)["Environment"]
    assert env == {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110", "MY_FLAG": "1", "TRAINING_RUN_ID": "r1", "TRAINING_EPOCH": "1",
                   "TRAINING_METRICS_NAMESPACE": f"TrainingPlatform/{platform.name_prefix}",
                   ENV_TENSORBOARD_DIR: TENSORBOARD_DIR}
    assert 30 < int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) < 120
