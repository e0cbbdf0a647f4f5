"""Hostile requests through the real Prepare Lambda handler, and the toolkit's command line of every request it
accepts.

Prepare (jobs.handler.prepare) runs here as the launcher runs it: PLATFORM_SETTINGS in its environment (the
document the default synth publishes, examples/platform-settings.json, which has a dataset_prefix), the request
in the event. Every hostile request must end in RequestInvalid with a problem on the field it abused, and no
CreateTrainingJob request. What the platform's images then do with an accepted request is reproduced from
sagemaker-training's own code (mapping.to_cmd_args and the `sagemaker_` split of environment.py, as `trainctl
local`'s container emulator does them: tests.jobs.test_training_contract.toolkit_args; process.py's
`" ".join(cmd)` run by /bin/sh): `shlex.split` must give back exactly the words meant, so no character was
read by the shell.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.errors import RequestInvalid
from contract.schema import reference_rows
from jobs import handler
from jobs.platform import PlatformSettings
from jobs.request.environment_rules import (
    ALLOWED_PATTERNS,
    REFUSED,
    check_environment,
    environment_problems,
    refused_reason,
)
from jobs.request.hyperparameter_rules import PLATFORM_OWNED
from jobs.request.limits import RUN_ENVIRONMENT
from jobs.request.parse import JobRequest
from tests.jobs.conftest import EXAMPLES
from tests.jobs.test_training_contract import toolkit_args

SETTINGS = PlatformSettings.from_json((EXAMPLES / "platform-settings.json").read_text())
TEAM_REPOSITORY = "123456789012.dkr.ecr.us-east-1.amazonaws.com/team-a/trainer"
PLATFORM = dataclasses.replace(SETTINGS, allowed_image_repositories=[TEAM_REPOSITORY])
BASE = json.loads((EXAMPLES / "ddp-gpt-125m.json").read_text())
BUCKET = SETTINGS.dataset_bucket
SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:mltrain/wandb-key"
# What a shell reads as more than text, one or two of each kind: substitution, sequencing, redirection, quoting,
# globbing, expansion, comments, whitespace. `x` around them keeps a value non-empty and in the field's shape.
METACHARACTERS = ["$(id)", "`id`", ";id", "|id", "&id", ">x", "'", '"', "\\", "*", "?", "[a]", "{a,b}", "~",
                  "!", "#", " x", "\tx", "\nx", "${IFS}"]


@pytest.fixture
def prepare(monkeypatch):
    """The Prepare handler with this file's platform settings; returns the RequestInvalid problems by path."""
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())

    def run(document: dict) -> dict[str, str]:
        with pytest.raises(RequestInvalid) as info:
            handler.prepare({"state_shape": handler.STATE_SHAPE, "request": document, "execution": {"name": "hostile"}})
        return {p.path: p.message for p in info.value.problems}
    return run


def request(**changes) -> dict:
    doc = copy.deepcopy(BASE)
    doc.update(changes)
    return doc


def nested(section: str, key: str, value) -> dict:
    doc = request()
    doc[section] = {**doc.get(section, {}), key: value} if isinstance(doc.get(section), dict) else {key: value}
    return doc


def _hyperparameter(key: str, value: str):
    return lambda bad: nested("hyperparameters", key, f"{value}{bad}")


# (field path the problem must name, the request with `{}` where the hostile text goes). metrics[].regex is
# the one free-text field left out: a regular expression needs ( ) [ ] \ *, and SageMaker applies it to the logs,
# never to a shell or a variable.
STRING_FIELDS = {
    "name": lambda bad: request(name=f"run{bad}"),
    "dataset": lambda bad: request(dataset=f"s3://{BUCKET}/datasets/tokens{bad}/"),
    "validation_dataset": lambda bad: request(validation_dataset=f"s3://{BUCKET}/datasets/val{bad}/"),
    "dataset@fsx": lambda bad: request(dataset=f"fsx:/datasets/tokens{bad}", input_mode="FSx",
                                       validation_dataset=None),
    "model": lambda bad: request(model=f"my_pkg.models:build{bad}"),
    "model_size": lambda bad: request(model="my_pkg.models:build", model_size=f"big{bad}"),
    "framework_version": lambda bad: request(framework_version=f"2.8.0{bad}"),
    "image": lambda bad: request(image=f"{TEAM_REPOSITORY}:1{bad}"),
    "training_plan": lambda bad: request(training_plan=f"plan{bad}"),
    "resume_run": lambda bad: request(resume_run=f"gpt-125m-ddp-aaaaaaaaaaaaaaaa{bad}"),
    "init_from_run": lambda bad: request(init_from_run=f"gpt-125m-ddp-aaaaaaaaaaaaaaaa{bad}"),
    "instance.type": lambda bad: request(instance={"type": f"ml.g5.12xlarge{bad}"}),
    "instance.fallbacks[0]": lambda bad: request(instance={"type": "ml.g5.12xlarge",
                                                           "fallbacks": [f"ml.g6e.12xlarge{bad}"]}),
    "instance_groups[0].name": lambda bad: request(instance=None, instance_groups=[
        {"name": f"gpu{bad}", "type": "ml.g5.12xlarge"}]),
    "instance_groups[0].type": lambda bad: request(instance=None, instance_groups=[
        {"name": "gpu", "type": f"ml.g5.12xlarge{bad}"}]),
    "strategy": lambda bad: request(strategy=f"ddp{bad}"),
    "input_mode": lambda bad: request(input_mode=f"File{bad}"),
    "parallel.pipeline_schedule": lambda bad: request(parallel={"pipeline_schedule": f"1f1b{bad}"}),
    "model_shape.kind": lambda bad: request(model="my_pkg.models:build", model_shape={
        "kind": f"decoder{bad}", "params": 1000000}),
    "sizing.data_format": lambda bad: request(sizing={"data_format": f"webdataset{bad}"}),
    "tags.team": lambda bad: nested("tags", "team", f"nlp{bad}"),
    "metrics[0].name": lambda bad: request(metrics=[{"name": f"acc{bad}", "regex": "acc=([0-9.]+)"}]),
    "environment.NCCL_DEBUG": lambda bad: nested("environment", "NCCL_DEBUG", f"WARN{bad}"),
    "secrets.WANDB_API_KEY": lambda bad: nested("secrets", "WANDB_API_KEY", f"{SECRET}{bad}"),
    **{f"hyperparameters.{key}": _hyperparameter(key, value)
       for key, value in [("init_from", "/opt/ml/input/data/train/step-10"), ("precision", "bf16"),
                          ("data", "auto"), ("optimizer", "adamw"), ("lr", "0.001"), ("max_steps", "100")]},
}
EXEMPT = {"metrics[].regex"}  # a regular expression; SageMaker applies it to the logs only


def test_every_string_field_of_the_request_is_in_the_matrix():
    strings = {path for path, kind, *_ in reference_rows(JobRequest) if kind.startswith(("string", "list of strings"))}
    # instance.fallbacks[0] is the list `instance.fallbacks`; instance_groups[0].name is `instance_groups[].name`
    covered = {re.sub(r"\[\d+\]", "[]", re.sub(r"\[\d+\]$", "", f.split("@")[0])) for f in STRING_FIELDS}
    assert strings - covered - EXEMPT == set()


# Names: the problem names the field by the hostile name itself.
NAME_FIELDS = {
    "hyperparameters": lambda bad: nested("hyperparameters", f"lr{bad}", 0.001),
    "environment": lambda bad: nested("environment", f"NCCL_DEBUG{bad}", "WARN"),
    "secrets": lambda bad: nested("secrets", f"WANDB_API_KEY{bad}", SECRET),
    "tags": lambda bad: nested("tags", f"team{bad}", "nlp"),
}


def _hostile(fields) -> list:
    """(field, metacharacters) pairs; a space in a tag is not hostile: CreateTrainingJob's pattern allows it,
    and tags reach no process."""
    return [pytest.param(f, bad, id=f"{f}-{ascii(bad)}") for f in fields for bad in METACHARACTERS
            if not (f.startswith("tags") and bad == " x")]


@pytest.mark.parametrize(("field", "bad"), _hostile(STRING_FIELDS))
def test_shell_metacharacters_in_a_string_field_are_refused_naming_it(prepare, field, bad):
    found = prepare(STRING_FIELDS[field](bad))
    assert field.split("@")[0] in found, found


@pytest.mark.parametrize(("section", "bad"), _hostile(NAME_FIELDS))
def test_shell_metacharacters_in_a_key_are_refused_naming_it(prepare, section, bad):
    found = prepare(NAME_FIELDS[section](bad))
    assert any(path.startswith(f"{section}.") for path in found), found


def test_the_issues_command_injection_is_refused_naming_the_key_the_value_and_the_fix(prepare):
    found = prepare(nested("hyperparameters", "checkpoint_dir", "/opt/ml/checkpoints$(id>/tmp/x)"))
    message = found["hyperparameters.checkpoint_dir"]
    assert "/opt/ml/checkpoints$(id>/tmp/x)" in message and "remove it" in message


def _spellings(key: str) -> list[str]:
    """The ways a key reaches the toolkit, argparse or a reader as the same key."""
    fullwidth = chr(ord(key[0]) - ord("a") + ord("ａ")) + key[1:]  # NFKC folds it back to `key`
    assert unicodedata.normalize("NFKC", fullwidth) == key
    return [key, key.upper(), key.replace("_", "-"), f"--{key}", f" {key} ", key.title(), fullwidth]


@pytest.mark.parametrize("key", sorted(PLATFORM_OWNED | {"sagemaker_mpi_enabled", "sagemaker_anything"}))
def test_a_platform_owned_hyperparameter_is_refused_under_every_spelling(prepare, key):
    spellings = _spellings(key)
    found = prepare(request(hyperparameters={s: "/opt/ml/x" for s in spellings}))
    for spelled in spellings:
        message = found.get(f"hyperparameters.{spelled}", "")
        assert "platform" in message and "'/opt/ml/x'" in message, (spelled, found)


def _refused_names() -> list[str]:
    """A concrete name for every refused pattern, and the issue's own examples."""
    names = {p.replace("*", "X") for p, _ in REFUSED}
    return sorted(names | set(RUN_ENVIRONMENT) | {"PYTHONWARNINGS", "BROWSER", "LD_PRELOAD", "BASH_ENV", "PYTHONPATH",
                           "SAGEMAKER_TRAINING_MODULE", "TRAINING_STOP_FILE", "TRAINING_CHECKPOINT_DIR",
                           "AWS_ACCESS_KEY_ID", "SM_HPS", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
                           "ld_preload", "Path", "pythonPath"})  # names compare case-insensitively


@pytest.mark.parametrize("everything", [False, True], ids=["default-patterns", "platform-allows-everything"])
def test_every_refused_variable_is_refused_even_when_a_pattern_allows_it(prepare, monkeypatch, everything):
    if everything:
        monkeypatch.setenv("PLATFORM_SETTINGS", dataclasses.replace(PLATFORM, environment_patterns=["*"]).to_json())
    names = _refused_names()
    found = prepare(request(environment={name: "1" for name in names}))
    assert set(found) == {f"environment.{name}" for name in names}, found
    assert all("may not set it" in found[f"environment.{n}"] or "set by the platform" in found[f"environment.{n}"]
               for n in names), found
    # What the renderer sets per run (the run's marker, the epoch, the team's namespace and experiment, the MLflow
    # server, the attempt's price, the request's fields) is refused saying what it is, whatever the patterns allow.
    for name, what in RUN_ENVIRONMENT.items():
        assert found[f"environment.{name}"] == f"is set by the platform to {what}; remove it", name
    secrets = prepare(request(secrets={name: SECRET for name in names}))
    assert set(secrets) == {f"secrets.{name}" for name in names}, secrets


def test_every_variable_the_renderer_sets_per_run_is_one_a_request_is_refused(prepare, monkeypatch):
    """Render a job with every per-run variable on (TensorBoard, an MLflow server, a price, secrets): each variable
    it sets that is neither the platform's fixed ones nor the request's own must be one RUN_ENVIRONMENT (or the
    secrets' variable) refuses, even where the platform's patterns allow everything. A variable added to the
    renderer but not to RUN_ENVIRONMENT would let a request set it."""
    from jobs.render.training_job import render_create_training_job
    from jobs.request.limits import PLATFORM_ENVIRONMENT, SECRETS_ENVIRONMENT
    from jobs.request.parse import parse_request

    everything = dataclasses.replace(PLATFORM, environment_patterns=["*"], mlflow_tracking_uri="https://mlflow.example")
    doc = request(secrets={"WANDB_API_KEY": SECRET}, environment={"NCCL_DEBUG": "WARN"})
    create = render_create_training_job(parse_request(doc), everything, run_id="ddp-gpt-125m-0123456789abcdef",
                                        attempt=1, prices={BASE["instance"]["type"]: 1.0})
    per_run = set(create["Environment"]) - set(PLATFORM_ENVIRONMENT) - set(doc["environment"])
    assert per_run - set(SECRETS_ENVIRONMENT) == set(RUN_ENVIRONMENT)  # every one rendered here, none unlisted
    monkeypatch.setenv("PLATFORM_SETTINGS", everything.to_json())
    found = prepare(request(environment=dict.fromkeys(per_run, "1")))
    assert set(found) == {f"environment.{name}" for name in per_run}, found


# Variables that load code, each with a value that would point it at the request's own files or server: a prefix
# the allow-list takes (NCCL_*, FI_*, CUDA_*, TORCH*, HF_*, WANDB_*) must not let them through.
LOADS_CODE_EXAMPLES = {
    "NCCL_NET_PLUGIN": "/opt/ml/input/data/train/libnccl-net-x", "NCCL_TUNER_PLUGIN": "x",
    "NCCL_PROFILER_PLUGIN": "x", "NCCL_ENV_PLUGIN": "x", "NCCL_CONF_FILE": "/opt/ml/input/data/train/nccl.conf",
    "FI_PROVIDER_PATH": "/opt/ml/input/data/train/prov", "CUDA_INJECTION64_PATH": "/opt/ml/input/data/train/inj",
    "TORCHINDUCTOR_CACHE_DIR": "/opt/ml/input/data/train/cache", "TORCH_EXTENSIONS_DIR": "/opt/ml/input/data/train",
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1", "TORCHINDUCTOR_REDIS_HOST": "cache.example.com",
    "HF_DATASETS_TRUST_REMOTE_CODE": "1", "HF_ENDPOINT": "https://hub.example.com", "HF_HOME": "/opt/ml/input/data/train",
    "HF_MODULES_CACHE": "/opt/ml/input/data/train", "HF_HUB_CACHE": "/opt/ml/input/data/train",
    "TORCH_HOME": "/opt/ml/input/data/train", "CUDA_CACHE_PATH": "/opt/ml/input/data/train",
    "WANDB_BASE_URL": "https://wandb.example.com", "WANDB__EXECUTABLE": "/opt/ml/input/data/train/python",
}


@pytest.mark.parametrize("everything", [False, True], ids=["default-patterns", "platform-allows-everything"])
def test_every_variable_that_loads_code_is_refused_by_what_it_loads(prepare, monkeypatch, everything):
    if everything:
        monkeypatch.setenv("PLATFORM_SETTINGS", dataclasses.replace(PLATFORM, environment_patterns=["*"]).to_json())
    found = prepare(request(environment=LOADS_CODE_EXAMPLES))
    assert set(found) == {f"environment.{name}" for name in LOADS_CODE_EXAMPLES}, found
    loads = ("library or plugin", "program", "folder of compiled or downloaded code", "file of further NCCL",
             "server of the request's choosing", "run a model's or a dataset's own code")
    for name in LOADS_CODE_EXAMPLES:
        assert any(what in found[f"environment.{name}"] for what in loads), (name, found[f"environment.{name}"])
        assert found[f"environment.{name}"].endswith("remove it"), name


@pytest.mark.parametrize("value", ["/opt/ml/input/data/train/libx.so", "libx.so.1", "/a/libx.so.1.2,other",
                                   "/a/libx.so:/b"])
def test_a_value_that_names_a_shared_library_is_refused_under_any_name(prepare, value):
    found = prepare(request(environment={"NCCL_DEBUG_SUBSYS": value}))
    assert "names a shared library" in found["environment.NCCL_DEBUG_SUBSYS"], found


def test_names_outside_the_allow_list_are_refused_unless_the_platform_adds_them(prepare, monkeypatch):
    found = prepare(request(environment={"MYLIB_THREADS": "4", "NCCL_DEBUG": "WARN"}))
    assert list(found) == ["environment.MYLIB_THREADS"] and "environment_patterns" in found["environment.MYLIB_THREADS"]
    monkeypatch.setenv("PLATFORM_SETTINGS", dataclasses.replace(PLATFORM, environment_patterns=["MYLIB_*"]).to_json())
    create = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": request(environment={"MYLIB_THREADS": "4"}), "execution": {}})["launch"]["create"]
    assert create["Environment"]["MYLIB_THREADS"] == "4"


CREDENTIALS = {
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "HF_TOKEN": "not-a-token-at-all",
    "MYLIB_PASSWORD": "hunter2",
    "NCCL_X": "AKIAIOSFODNN7EXAMPLE",
    "TORCH_X": "-----BEGIN OPENSSH PRIVATE KEY-----",
    "HF_X": "hf_abcdefghijklmnopqrstuvwxyz0123",
    "WANDB_X": "q8Zr3LbT0xW9mKp2VnYs7HdJ4cFa6Ge1",  # 32 random letters and digits, no known prefix
    "TORCH_Y": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",  # an AWS secret access key's shape
    "NCCL_Y": "0123456789abcdef0123456789abcdef01234567",  # 40 hex digits, a W&B key's shape
}


# What training jobs put in their variables: paths, model ids, allocator settings, run names, a short hash.
BENIGN = {
    "NCCL_TOPO_FILE": "/opt/ml/input/data/cache/huggingface-hub-2026",
    "WANDB_DIR": "/fsx/datasets/c4-en/v2/shard-00001-of-01024",
    "HF_MODEL_ID": "meta-llama/Llama-3.1-8B-Instruct-2024-07-23",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128",
    "TORCH_LOGS_DIR": "/opt/ml/input/data/Llama3/checkpoints",
    "WANDB_NAME": "my-team-project-2026-11-baseline-run-003",
    "WANDB_PROJECT": "https-wandb.example.com",
    "WANDB_RUN_GROUP": "ThisIsMyLongCamelCaseName",
    "WANDB_TAGS": "d41d8cd98f00b204e9800998ecf8427e",
    "NCCL_SOCKET_IFNAME": "^lo,docker0",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_JOB_TYPE": "pretrain-task-abcdefghijklmnopqrstu",  # `sk-` inside a word is no token prefix
}


def test_ordinary_values_are_not_taken_for_credentials(monkeypatch):
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())
    create = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": request(environment=BENIGN), "execution": {}})["launch"]["create"]
    assert {k: create["Environment"][k] for k in BENIGN} == BENIGN


def test_credential_looking_values_are_refused_with_a_pointer_to_secrets_and_never_echoed(prepare):
    found = prepare(request(environment=CREDENTIALS))
    assert set(found) == {f"environment.{name}" for name in CREDENTIALS}, found
    for name, value in CREDENTIALS.items():
        assert "`secrets`" in found[f"environment.{name}"] and value not in found[f"environment.{name}"]


@pytest.mark.parametrize("arn", [
    "arn:aws:secretsmanager:us-east-1:123456789012:secret:team-b/wandb-key",  # another team's (prefix's) secret
    "arn:aws:secretsmanager:us-east-1:123456789012:secret:mltrain-dev/wandb-key",  # a prefix only starting alike
    "arn:aws:secretsmanager:us-east-1:210987654321:secret:mltrain/wandb-key",  # another account
    "arn:aws:secretsmanager:eu-west-1:123456789012:secret:mltrain/wandb-key",  # another region
])
def test_secrets_outside_the_platforms_scope_are_refused_naming_the_scope(prepare, arn):
    message = prepare(request(secrets={"WANDB_API_KEY": arn}))["secrets.WANDB_API_KEY"]
    assert "arn:aws:secretsmanager:us-east-1:123456789012:secret:mltrain/*" in message


@pytest.mark.parametrize("image", [
    "docker.io/library/ubuntu:22.04",
    "123456789012.dkr.ecr.us-east-1.amazonaws.com/other:1",
    f"{TEAM_REPOSITORY}-evil:1",  # a repository whose name only starts like an allowed one
    "763104351884.dkr.ecr.us-east-1.amazonaws.com.evil.example/pytorch-training:2.8.0-gpu-py312",
    "999999999999.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312",
])
def test_images_outside_the_allowed_repositories_are_refused_naming_them(prepare, image):
    message = prepare(request(image=image))["image"]
    assert image in message and TEAM_REPOSITORY in message and "763104351884.dkr.ecr.us-east-1.amazonaws.com/" in message


@pytest.mark.parametrize("image", [f"{TEAM_REPOSITORY}:1", f"{TEAM_REPOSITORY}@sha256:{'a' * 64}",
                                   "763104351884.dkr.ecr.us-east-1.amazonaws.com/huggingface-pytorch-training:2.5"])
def test_images_from_the_allowed_repositories_run(monkeypatch, image):
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())
    create = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": request(image=image), "execution": {}})["launch"]["create"]
    assert create["AlgorithmSpecification"]["TrainingImage"] == image


# ---- the property: what Prepare accepts reaches the shell as the words meant ----

SAFE = re.compile(r"[A-Za-z0-9._:/=+,@%-]+")  # the issue's safe set, independent of jobs.request.command_line


def accepted_requests() -> list[tuple[str, dict]]:
    cloud = {p.stem: json.loads(p.read_text()) for p in sorted(EXAMPLES.glob("*.json"))
             if p.name != "platform-settings.json" and not p.name.startswith("local-")}
    variants = {
        "every-string-hyperparameter": request(hyperparameters={
            **BASE["hyperparameters"], "init_from": "/opt/ml/input/data/train/step-10", "data": "channels",
            "optimizer": "sgd", "lr_schedule": "constant", "backend": "nccl", "lr": 1e-05, "compile": False,
            "seed": 0, "checkpoint_minutes": 12.5, "eval-batches": 7}),
        "custom-model": request(model="my_pkg.models:build", model_size="my-size_2", model_shape=None),
        "environment-and-secrets": request(environment={"NCCL_SOCKET_IFNAME": "^lo,docker0", "WANDB_DIR": "/opt/ml/hf",
                                                        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                                           secrets={"WANDB_API_KEY": SECRET, "HF_TOKEN": SECRET + "-2"}),
        "auto": request(strategy="auto"),
        "tp": request(strategy="tp", parallel={"tensor_parallel_degree": 2}),
        "pp": request(strategy="pp", instance={"type": "ml.g5.12xlarge", "count": 2}, parallel={
            "pipeline_parallel_degree": 2, "pipeline_microbatches": 4, "pipeline_schedule": "interleaved_1f1b"}),
        "hsdp": request(strategy="hsdp", instance={"type": "ml.g5.12xlarge", "count": 2}),
        "fsx-through-the-linked-prefix": request(input_mode="FSx"),
        "groups": request(instance=None, strategy="ddp", instance_groups=[
            {"name": "gpu-a", "type": "ml.g5.12xlarge", "count": 2}, {"name": "cpu_b", "type": "ml.c5.2xlarge"}]),
        "team-image": request(image=f"{TEAM_REPOSITORY}:2026-11"),
    }
    return [*cloud.items(), *variants.items()]


@pytest.mark.parametrize(("label", "document"), accepted_requests(), ids=[n for n, _ in accepted_requests()])
def test_every_accepted_request_reaches_the_shell_as_the_words_meant(monkeypatch, label, document):
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())
    hyperparameters = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": document, "execution": {}})["launch"]["create"]["HyperParameters"]
    args = toolkit_args(hyperparameters)
    command = ["/opt/conda/bin/torchrun", "--nnodes", "1", "--nproc_per_node", "4", "/opt/ml/code/train.py", *args]
    assert shlex.split(" ".join(command)) == command, hyperparameters
    # The platform's own values too, those off the command line included (a list item, an object's pairs).
    for key, encoded in hyperparameters.items():
        value = json.loads(encoded)
        items = value if isinstance(value, list) else [f"{k}={v}" for k, v in value.items()] \
            if isinstance(value, dict) else [value]
        assert SAFE.fullmatch(key) and all(SAFE.fullmatch(str(item)) for item in items), (key, value)


def test_the_fsx_path_comes_from_the_key_under_the_linked_prefix(monkeypatch, prepare):
    """The file system links s3://<bucket>/<dataset_prefix> to /<linked_path>: the key below the prefix follows."""
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())
    create = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": request(input_mode="FSx"), "execution": {}})["launch"]["create"]
    paths = [c["DataSource"]["FileSystemDataSource"]["DirectoryPath"] for c in create["InputDataConfig"]]
    mount = SETTINGS.fsx.mount_name
    assert paths == [f"/{mount}/datasets/tokens/openwebtext/train", f"/{mount}/datasets/tokens/openwebtext/validation"]
    outside = prepare(request(input_mode="FSx", dataset=f"s3://{BUCKET}/elsewhere/tokens/", validation_dataset=None))
    assert "outside what the file system links" in outside["dataset"] and f"s3://{BUCKET}/datasets/" in outside["dataset"]
    # a prefix that only starts like the linked one is outside it too
    assert "dataset" in prepare(request(input_mode="FSx", dataset=f"s3://{BUCKET}/datasets-old/x/",
                                        validation_dataset=None))


@pytest.mark.parametrize(("dataset", "words"), [
    ("fsx:/elsewhere/x", "outside the folder the file system links"),
    ("fsx:/datasets-old/x", "outside the folder the file system links"),  # starts like it, is not under it
    ("fsx:/.", "empty or '.' path segment"),  # the file system's root, spelled another way
    ("fsx:/datasets/./../x", "climbs out"),
    ("fsx:/datasets//x", "empty or '.' path segment"),
    (f"s3://{BUCKET}/datasets/tokens/openwebtext/train", "does not end with '/'"),  # names train-old/ too
])
def test_a_dataset_path_stays_in_its_folder_and_names_no_siblings(prepare, dataset, words):
    """An fsx: path is the DirectoryPath SageMaker mounts: it must lie under the linked folder, written plainly. An
    S3 prefix without its slash also names every sibling that starts like it."""
    found = prepare(request(dataset=dataset, validation_dataset=None, input_mode=None))
    assert list(found) == ["dataset"] and words in found["dataset"], found


def test_a_plain_fsx_path_under_the_linked_folder_is_mounted_as_given(monkeypatch):
    monkeypatch.setenv("PLATFORM_SETTINGS", PLATFORM.to_json())
    doc = request(dataset="fsx:/datasets/tokens/c4/train/", validation_dataset=None, input_mode=None)
    create = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": doc, "execution": {}})["launch"]["create"]
    (channel,) = create["InputDataConfig"]
    assert channel["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == \
        f"/{SETTINGS.fsx.mount_name}/datasets/tokens/c4/train"


def test_with_teams_the_path_follows_the_file_systems_link_and_reads_stay_in_the_teams_prefix(monkeypatch, prepare):
    """A team's dataset_prefix lies under the prefix the one file system links (fsx.linked_prefix)."""
    team = dataclasses.replace(PLATFORM, dataset_prefix="datasets/team-a/",
                               fsx=dataclasses.replace(SETTINGS.fsx, linked_prefix="datasets/"))
    monkeypatch.setenv("PLATFORM_SETTINGS", team.to_json())
    own = request(input_mode="FSx", dataset=f"s3://{BUCKET}/datasets/team-a/tokens/", validation_dataset=None)
    create = handler.prepare({"state_shape": handler.STATE_SHAPE, "request": own, "execution": {}})["launch"]["create"]
    directory = create["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["DirectoryPath"]
    assert directory == f"/{SETTINGS.fsx.mount_name}/datasets/team-a/tokens"
    other = prepare(request(input_mode="FSx", dataset=f"s3://{BUCKET}/datasets/team-b/tokens/", validation_dataset=None))
    assert "outside what the training jobs may read" in other["dataset"] and "datasets/team-a/" in other["dataset"]


def test_the_renderer_refuses_a_value_that_slipped_past_the_rules():
    """The last guard before the shell: a request-derived value no rule checked still ends as a bad request."""
    from jobs.render.training_job import render_create_training_job
    from jobs.request.parse import parse_request

    slipped = dataclasses.replace(parse_request(request(model="my_pkg.models:build")), model_size="x;id")
    with pytest.raises(RequestInvalid) as info:
        render_create_training_job(slipped, PLATFORM, run_id="gpt-125m-ddp-aaaaaaaaaaaaaaaa", attempt=1)
    assert [p.path for p in info.value.problems] == ["hyperparameters.model_size"]


# ---- the allow-list by meaning, over names no list spells out ----------------------------------------------------

_PREFIXES = [p.rstrip("*") for p in ALLOWED_PATTERNS if p.endswith("*")]
_MIDDLES = st.text(st.sampled_from("ABCXYZ019_"), max_size=8)
_LOADS = ["_PLUGIN", "_PLUGIN_PATH", "_PROVIDER_PATH", "_EXTENSIONS_DIR", "_EXECUTABLE", "_ENDPOINT", "_BASE_URL",
          "_TRUST_REMOTE_CODE"]
_KNOBS = ["_DEBUG", "_LEVEL", "_THREADS", "_TIMEOUT", "_DISABLE", "_BUFFSIZE", "_ALGO"]


@settings(max_examples=200, deadline=None)
@given(prefix=st.sampled_from(_PREFIXES), middle=_MIDDLES, suffix=st.sampled_from(_LOADS))
def test_any_allowed_prefix_with_a_code_loading_meaning_is_refused(prefix, middle, suffix):
    """A name the allow-list's prefixes take, ending like a knob that loads code (a plugin, a provider path, an
    extensions folder, a program, a server, remote code), is refused whatever else it says."""
    name = f"{prefix}{middle}{suffix}"
    found = dict(check_environment({name: "1"}))
    assert "may not set it" in found.get(name, ""), (name, found)


@settings(max_examples=200, deadline=None)
@given(prefix=st.sampled_from(_PREFIXES), middle=_MIDDLES, suffix=st.sampled_from(_KNOBS))
def test_a_tuning_knob_under_an_allowed_prefix_passes_unless_a_refused_name_matches(prefix, middle, suffix):
    """The refusals by meaning do not swallow ordinary knobs: a tuning name under an allowed prefix passes both
    rules, unless it is one of the refused names (which then says whose it is)."""
    name = f"{prefix}{middle}{suffix}"
    problems = dict(check_environment({name: "1"})) | dict(environment_problems({name: "1"}, ()))
    assert not problems or refused_reason(name) is not None, (name, problems)
