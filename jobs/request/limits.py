"""CreateTrainingJob's limits (botocore's service model, docs/REFERENCE.md) and what the platform itself adds.

A request's own share of each limit is the API's less the platform's: the renderer adds
PLATFORM_ENVIRONMENT, RUN_ENVIRONMENT and SECRETS_ENVIRONMENT to Environment, jobs.naming's PLATFORM_TAGS (and
MAX_JOB_TAGS of the platform settings' own) to Tags, and the hyperparameters of jobs.request.hyperparameter_rules
to HyperParameters.
"""

from __future__ import annotations

from contract.container import (
    ENV_EPOCH,
    ENV_METRICS_NAMESPACE,
    ENV_MLFLOW_EXPERIMENT,
    ENV_MLFLOW_TRACKING_URI,
    ENV_PRICE,
    ENV_REQUEST,
    ENV_RUN_ID,
    ENV_SECRET_ARNS,
    ENV_TENSORBOARD_DIR,
    TORCHRUN_SHUTDOWN_SECONDS,
)

MAX_HYPERPARAMETERS = 100
MAX_HYPERPARAMETER_JSON = 2500  # characters of one JSON-encoded value
MAX_ENVIRONMENT_VARIABLES = 100
MAX_ENVIRONMENT_TEXT = 512  # characters of a variable's name or value
MAX_TAGS = 50
MAX_TAG_KEY = 128  # characters of a tag's key
MAX_TAG_VALUE = 256  # characters of a tag's value
MAX_RUNTIME_HOURS = 28 * 24
MAX_PENDING_HOURS = (1800 / 3600, 2419200 / 3600)
MAX_WARM_POOL_MINUTES = 21600 // 60
MAX_INSTANCE_GROUPS = 5
MAX_S3_URI = 1024  # S3Uri in the service model
MAX_IMAGE_URI = 255  # TrainingImage
MAX_METRIC_NAME = 255  # MetricDefinition.Name
# A request is a small document: bound its nesting and size before anything walks it (Step Functions caps an
# execution's input at 256 KiB anyway).
MAX_REQUEST_DEPTH = 16
MAX_REQUEST_BYTES = 256 * 1024
# Step Functions' limit on one state's input or output, UTF-8 bytes (jobs.request.state_size: the guard that keeps the
# launcher's state under it).
MAX_STATE_BYTES = 256 * 1024
# Steps between checkpoints: far above any run's step count, below a 32-bit int the toolkit may parse into.
MAX_CHECKPOINT_INTERVAL = 10_000_000

PLATFORM_ENVIRONMENT = {
    # The stop reaches the ranks through the stop file (jobs.render.container_entry), not through torchrun. Should a
    # torchrun be signalled anyway (an image that delivers SIGTERM to it), one from torch 2.12 reads this
    # (the toolkit builds the command, so --shutdown_timeout cannot be passed) and waits inside the 120 s.
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(TORCHRUN_SHUTDOWN_SECONDS),
}
# Variables the renderer sets per run, not to a fixed value, and what each is (a request that sets one is told): the
# run's id is the marker by which the launcher knows its own jobs (jobs.retry.run_state.is_ours).
RUN_ENVIRONMENT = {
    ENV_RUN_ID: "the run's id, which marks the run's own jobs",
    ENV_EPOCH: "the attempt's epoch, which fences the checkpoint folder against older attempts",
    ENV_METRICS_NAMESPACE: "the team's own CloudWatch namespace, the one its alarms read",
    ENV_TENSORBOARD_DIR: "the folder SageMaker syncs TensorBoard event files from (the request's `tensorboard`)",
    ENV_MLFLOW_TRACKING_URI: "the platform's MLflow tracking server (platform config `mlflow_tracking_server`)",
    ENV_MLFLOW_EXPERIMENT: "the team's own MLflow experiment",
    ENV_PRICE: "the attempt's price, from the AWS Price List API (its MLflow run's cost)",
    ENV_REQUEST: "the request's fields, for its MLflow run's parameters",
}
# The variable that carries a request's `secrets` (their ARNs, as JSON; jobs.render.container_entry reads them).
SECRETS_ENVIRONMENT = (ENV_SECRET_ARNS,)
MAX_ENVIRONMENT = (MAX_ENVIRONMENT_VARIABLES - len(PLATFORM_ENVIRONMENT) - len(RUN_ENVIRONMENT)
                   - len(SECRETS_ENVIRONMENT))
