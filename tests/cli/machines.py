"""Small state machines for trainctl's AWS tests, shaped like the launcher's where trainctl reads them.

moto does not run SageMaker's `.sync` integration, so the training task here is the request/response
`createTrainingJob`, which moto forwards to its own SageMaker (whose jobs complete at once). The task
maps each key of a rendered request from `$.create.<Key>` as the launcher does, so the history holds
the same TaskScheduled parameters trainctl reads the attempts from.
"""

from __future__ import annotations

from typing import Any

TRAIN_RESOURCE = "arn:aws:states:::sagemaker:createTrainingJob"
# The keys of a rendered request these machines send. All of them would do, but moto's ASL parser takes
# ~0.4 s per definition for the full request (metric regexes, hyperparameters) and trainctl reads only
# the job name, the resources and Spot from the scheduled task.
KEYS = ("TrainingJobName", "AlgorithmSpecification", "RoleArn", "OutputDataConfig", "ResourceConfig",
        "StoppingCondition", "EnableManagedSpotTraining", "CheckpointConfig", "Tags")


def training_machine(create: dict[str, Any], end: dict[str, Any], *, attempts: int = 1) -> dict[str, Any]:
    """Prepare (Pass: the rendered request) -> `attempts` training tasks, one job name each -> `end`."""
    create = {key: create[key] for key in KEYS}
    create["AlgorithmSpecification"] = {k: v for k, v in create["AlgorithmSpecification"].items()
                                        if k != "MetricDefinitions"}
    states: dict[str, Any] = {
        "Prepare": {"Type": "Pass", "Result": create, "ResultPath": "$.create", "Next": "Train1"},
    }
    for n in range(1, attempts + 1):
        params = {f"{key}.$": f"$.create.{key}" for key in create if key not in ("TrainingJobName", "RoleArn")}
        # moto 5.2.5's ASL parser takes the key "RoleArn.$" for the Credentials field's RoleArn and fails
        # the state with States.Runtime; the literal value sidesteps it.
        params["RoleArn"] = create["RoleArn"]
        # A fresh name per attempt, as the launcher makes them.
        params["TrainingJobName.$"] = f"States.Format('{{}}-a{n}', $$.Execution.Name)"
        states[f"Train{n}"] = {"Type": "Task", "Resource": TRAIN_RESOURCE, "Parameters": params,
                               "ResultPath": "$.job", "Next": f"Train{n + 1}" if n < attempts else "End"}
    states["End"] = end
    return {"StartAt": "Prepare", "States": states}


SUCCEED = {"Type": "Succeed"}
SUMMARY = {"Type": "Pass", "End": True, "Parameters": {
    "succeeded": True, "subject": "gpt-small-ddp succeeded after 1 attempt",
    "message": "model artifact s3://out/model.tar.gz", "summary": {"attempts.$": "States.Array($.job)"}}}
FAIL = {"Type": "Fail", "Error": "CapacityExhausted",
        "Cause": "no ml.g5.12xlarge capacity after 3 attempts (CapacityError: Unable to provision requested ML "
                 "compute capacity)"}
# Keeps the execution RUNNING long enough for stop and --follow tests; they end it themselves.
WAIT_LONG = {"Type": "Wait", "Seconds": 600, "End": True}
