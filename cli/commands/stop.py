"""`trainctl stop`: stop an execution and the training job it is running."""

from __future__ import annotations

from cli.aws import Aws
from cli.console import out


def stop_execution(aws: Aws, execution: str, state_machine: str | None) -> None:
    from cli.execution_history import describe, describe_job

    view = describe(aws, aws.execution_arn(execution, state_machine))
    if view.status != "RUNNING":
        out().print(f"{view.name} is not running ({view.status}); nothing to stop")
        return
    # The execution first: the launcher reads a stopped job it did not ask for as an interruption and resumes it
    # (jobs.retry.classify.Category.INTERRUPTION), so the job must stop only once no Decide can follow. Then the job:
    # Step Functions stops a .sync job with its execution, but only as a best effort; an explicit
    # StopTrainingJob makes sure the instances are released.
    aws.client("stepfunctions").stop_execution(
        executionArn=view.arn, error="StoppedByUser", cause="stopped with trainctl stop")
    out().print(f"stopped execution {view.name}")
    latest = view.latest
    job = describe_job(aws, latest.job_name) if latest else None
    if job and job["TrainingJobStatus"] == "InProgress":
        aws.client("sagemaker").stop_training_job(TrainingJobName=latest.job_name)
        out().print(f"stopping training job {latest.job_name}")
