"""CreateTrainingJob's limits (botocore's service model, docs/REFERENCE.md) and what the platform itself adds.

A request's own share of each limit is the API's less the platform's: the renderer adds
PLATFORM_ENVIRONMENT to Environment, PLATFORM_TAGS to Tags, and the hyperparameters of
jobs.hyperparameter_rules to HyperParameters.
"""

from __future__ import annotations

from contract.container import TORCHRUN_SHUTDOWN_SECONDS

MAX_HYPERPARAMETERS = 100
MAX_HYPERPARAMETER_JSON = 2500  # characters of one JSON-encoded value
MAX_ENVIRONMENT_VARIABLES = 100
MAX_ENVIRONMENT_TEXT = 512  # characters of a variable's name or value
MAX_TAGS = 50
MAX_RUNTIME_HOURS = 28 * 24
MAX_PENDING_HOURS = (1800 / 3600, 2419200 / 3600)
MAX_WARM_POOL_MINUTES = 21600 // 60
MAX_INSTANCE_GROUPS = 5

PLATFORM_ENVIRONMENT = {
    # The toolkit builds the torchrun command itself, so its --shutdown_timeout cannot be passed: torchrun reads
    # this instead. SageMaker sends SIGKILL 120 s after SIGTERM; torchrun's default grace is 30 s, too short
    # for the workers to agree on a step and write the checkpoint.
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(TORCHRUN_SHUTDOWN_SECONDS),
}
MAX_ENVIRONMENT = MAX_ENVIRONMENT_VARIABLES - len(PLATFORM_ENVIRONMENT)
# Tags the renderer writes on every job, as `<name_prefix>:<tag>`.
PLATFORM_TAGS = ("run-id", "attempt", "request", "strategy")
