"""The SageMaker training container contract: paths, variables, log group, and how a stop is handled.

The training package reads these; the renderer (jobs), `trainctl local` (which lays out the same folders
under a work dir) and the launcher's IAM and dashboards name the same things from here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# ---- paths inside the container (SageMaker's defaults) ----
CHECKPOINT_DIR = "/opt/ml/checkpoints"  # CheckpointConfig.LocalPath: synced to the run's S3 prefix
MODEL_DIR = "/opt/ml/model"  # tarred into model.tar.gz at the end of the job
OUTPUT_DATA_DIR = "/opt/ml/output/data"  # tarred into output.tar.gz
INPUT_DATA_DIR = "/opt/ml/input/data"  # one folder per channel
# TensorBoardOutputConfig.LocalPath (SageMaker's default): event files here are synced to the run's S3 prefix
# during training.
TENSORBOARD_DIR = "/opt/ml/output/tensorboard"
# One line written here when a job fails becomes the job's FailureReason.
FAILURE_FILE = "/opt/ml/output/failure"

# ---- variables the container sets (the sagemaker-training toolkit) ----
ENV_MODEL_DIR = "SM_MODEL_DIR"
ENV_OUTPUT_DATA_DIR = "SM_OUTPUT_DATA_DIR"
ENV_HOSTS = "SM_HOSTS"
ENV_CURRENT_HOST = "SM_CURRENT_HOST"
ENV_NUM_GPUS = "SM_NUM_GPUS"
ENV_CHANNEL_PREFIX = "SM_CHANNEL_"  # + the channel name upper-cased: SM_CHANNEL_TRAIN
ENV_HP_PREFIX = "SM_HP_"  # + the hyperparameter name upper-cased
# Not a SageMaker variable: `trainctl local` and tests move the checkpoint dir with it.
ENV_CHECKPOINT_DIR = "TRAINING_CHECKPOINT_DIR"
# Not a SageMaker variable: the launcher sets it on every attempt's job to the run's id. The training package
# records it in each checkpoint and refuses a checkpoint another run wrote; the launcher reads it back from a job
# it finds to tell its own attempt from a job that took the name.
ENV_RUN_ID = "TRAINING_RUN_ID"
# Not a SageMaker variable: the launcher sets it on every attempt's job to the attempt's epoch, a number that grows
# with each attempt of the run. The training package records it in each checkpoint and claims the checkpoint folder
# with it; an attempt that finds a newer epoch's claim stops before it writes (training.checkpoint.fencing).
ENV_EPOCH = "TRAINING_EPOCH"
# In the checkpoint folder: {FENCE_KEY: N}, the newest epoch that claimed it (training.checkpoint.fencing; `trainctl local` counts
# its invocations from it). Each completion marker records its writer's epoch under the same key.
FENCE_FILE = "EPOCH.json"
FENCE_KEY = "attempt_epoch"
# Not a SageMaker variable: the request's `secrets` as JSON, {"ENV_NAME": "<Secrets Manager ARN>"}. Only ARNs
# travel through the execution and the job; the container entry (jobs.render.container_entry) reads each secret with
# the execution role and exports it as ENV_NAME before the training command starts.
ENV_SECRET_ARNS = "TRAINING_SECRET_ARNS"
# Not a SageMaker variable: the launcher sets it to the CloudWatch namespace of the platform (or team) that runs the
# job (jobs.naming.metrics_namespace), the only one besides SageMaker's its role may write. The training package
# sends its metrics there too (training.metrics.cloudwatch), so the team's alarms and dashboard read what no other
# team's job can write; unset (a local run), it sends nothing.
ENV_METRICS_NAMESPACE = "TRAINING_METRICS_NAMESPACE"

# ---- input channels ----
TRAIN_CHANNEL = "train"
VALIDATION_CHANNEL = "validation"
CODE_CHANNEL = "code"  # network isolation: the sourcedir arrives as an input channel
INIT_CHANNEL = "init"  # a request's init_from_run: that run's checkpoints, which init_from then points at

# ---- what the training package leaves behind ----
STATUS_FILE = "training_status.json"  # in the output data dir: how the run ended (stopped, completed, step)
# A checkpoint is a `step-N` folder of CHECKPOINT_DIR; the marker written last makes it complete
# (training.checkpoint.markers says what it holds; trainctl local reads whether any exists).
CHECKPOINT_MARKER = "COMPLETE.json"
METRICS_FILE = "metrics.jsonl"  # in the output data dir: every metrics record with its time

# ---- stopping ----
# SageMaker sends SIGTERM on a stop or a Spot reclaim and SIGKILL this long after.
STOP_KILL_AFTER_SECONDS = 120
# SageMaker signals the container's PID 1 only. In its PyTorch images that is `bash -m
# start_with_right_hostname.sh train`, which neither handles nor forwards SIGTERM, and the toolkit under it
# forwards nothing either (aws/sagemaker-training-toolkit issues 125 and 173, aws/deep-learning-containers
# issue 632): a training script never sees the stop. The platform therefore starts those images through its
# own entry (jobs.render.container_entry), which turns SIGTERM into this file; every rank polls it once per step,
# and its modification time is when the stop came.
STOP_FILE = "/tmp/trainctl-stop"
# Not a SageMaker variable: `trainctl local` and tests move the stop file with it.
ENV_STOP_FILE = "TRAINING_STOP_FILE"
# Not a SageMaker variable: the folder the job writes TensorBoard event files into, set by the launcher when the
# request's `tensorboard` is on (TENSORBOARD_DIR on SageMaker; trainctl local moves it into its work folder).
ENV_TENSORBOARD_DIR = "TRAINING_TENSORBOARD_DIR"
# MLflow's own variables (the MLflow client reads them too): the tracking server a run logs to, set by the launcher
# when the platform config names one (`mlflow_tracking_server`: a SageMaker managed MLflow ARN or a URI), and by
# `trainctl local --mlflow URI`; and the experiment, the platform's (or team's) name prefix. A request may set neither
# (jobs.request.environment_rules refuses both, whatever a platform's patterns allow): a team logs into its own
# experiment only.
ENV_MLFLOW_TRACKING_URI = "MLFLOW_TRACKING_URI"
ENV_MLFLOW_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
# What names a tracking server a job can reach: a SageMaker managed MLflow ARN (the SageMaker API reference's
# MlflowResourceArn pattern) or an http(s) URI; locally also a file: store (MLFLOW_LOCAL).
MLFLOW_ARN = re.compile(r"arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:mlflow-(app|tracking-server)/[A-Za-z0-9\-]+")
MLFLOW_SERVER = re.compile(rf"{MLFLOW_ARN.pattern}|https?://[^\s/]+(/\S*)?")
MLFLOW_SERVER_FORM = ("http(s)://host:port or a SageMaker MLflow ARN (arn:aws:sagemaker:<region>:<account>:"
                      "mlflow-tracking-server/<name>)")
MLFLOW_LOCAL = re.compile(rf"{MLFLOW_SERVER.pattern}|file:/\S+")
MLFLOW_LOCAL_FORM = f"{MLFLOW_SERVER_FORM}, or file:/absolute/folder"
# The tag by which a training run's MLflow run is found (by its attempts, and by people: trainctl show prints it).
MLFLOW_RUN_ID_TAG = "trainctl.run_id"


def mlflow_place(tracking_uri: str, experiment: str, run_id: str) -> str:
    """Where a run's MLflow run is, in words a person can search by."""
    return f"the run tagged {MLFLOW_RUN_ID_TAG}={run_id} in experiment {experiment} at {tracking_uri}"


# What training.metrics.mlflow_run calls, by MLflow REST endpoint (under /api/2.0/mlflow/), and the sagemaker-mlflow
# action a SageMaker managed server authorizes it as (the action of the operation's name, the Service Authorization
# Reference's list for sagemaker-mlflow): the execution role gets these on the configured server and nothing else
# (platform_constructs.roles). Artifacts go to the server's artifact store, not through these.
MLFLOW_RUN_ACTIONS = {
    "experiments/get-by-name": "sagemaker-mlflow:GetExperimentByName",
    "experiments/create": "sagemaker-mlflow:CreateExperiment",
    "runs/search": "sagemaker-mlflow:SearchRuns",
    "runs/create": "sagemaker-mlflow:CreateRun",
    "runs/get": "sagemaker-mlflow:GetRun",
    "runs/update": "sagemaker-mlflow:UpdateRun",
    "runs/log-batch": "sagemaker-mlflow:LogBatch",
    "runs/set-tag": "sagemaker-mlflow:SetTag",
}
# Not a SageMaker variable: what the attempt's cluster costs, {"usd_per_hour": the on-demand price of all its
# instances (the AWS Price List API, asked by the launcher as it launches), "spot": whether it runs on Spot}, rendered
# only where something reads it (a platform with an MLflow server: training.metrics.mlflow_run tags the run's cost)
# and the price is known (not on a training plan, whose instances are paid up front).
ENV_PRICE = "TRAINCTL_PRICE"
# Not a SageMaker variable: the request's fields that the job's hyperparameters do not carry (what it trains on, on
# what and on which terms: jobs.render.training_job.REQUEST_PARAMS) as JSON, for its MLflow run's parameters; rendered
# on a platform with an MLflow server. A value too long for a job's environment is replaced by TOO_LONG (short: with
# every field replaced the whole is well within a variable's 512 characters).
ENV_REQUEST = "TRAINCTL_REQUEST"
TOO_LONG = "(too long)"
# Not a SageMaker variable: `trainctl local` names its --workdir, so that a fix the job suggests is one its user
# can apply (another --workdir, not a checkpoint_dir the request does not let them set).
ENV_LOCAL_WORKDIR = "TRAINCTL_LOCAL_WORKDIR"
# What torchrun (from torch 2.12) waits for its workers after forwarding the signal: inside the 120 s, with
# room for the process tree to exit. Older torchrun ignores it and waits a fixed 30 s.
TORCHRUN_SHUTDOWN_SECONDS = 110

# ---- logs ----
# CloudWatch log group of every training job (one stream per host: `<job>/algo-N-<epoch>`).
LOG_GROUP = "/aws/sagemaker/TrainingJobs"


def channel_variable(channel: str) -> str:
    return ENV_CHANNEL_PREFIX + channel.upper()


def fence_claim(folder: Path) -> int | None:
    """The newest epoch that claimed checkpoint folder `folder` (FENCE_FILE), or None: no claim yet, or an unreadable
    one (a claim is rewritten whole, so an unreadable one is a claim to make again)."""
    try:
        value = json.loads((Path(folder) / FENCE_FILE).read_text()).get(FENCE_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None
