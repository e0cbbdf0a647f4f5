"""Resuming a run by its id (request field `resume_run`), in the synthesized state machine in moto: a second
execution continues a run that ended, on the same run id and checkpoint prefix, its attempts numbered on; a run
that cannot be continued is refused in Prepare, naming the field, before anything is launched."""

from __future__ import annotations

import pytest
from moto.core.exceptions import JsonRESTError
from moto.sagemaker.models import SageMakerModelBackend, sagemaker_backends

from contract.container import ENV_RUN_ID
from tests.launcher import sagemaker_sync as sm
from tests.launcher.definition import ACCOUNT, REGION
from tests.launcher.inputs import job_request

REFUSED = ["Prepare", "ParseRequestError", "RequestInvalid"]


def run_id_of(result) -> str:
    return result.create_calls[0]["Environment"][ENV_RUN_ID]


def attempt_tag(create: dict) -> str:
    return next(t["Value"] for t in create["Tags"] if t["Key"].endswith(":attempt"))


@pytest.mark.parametrize("ending", [sm.max_runtime_reached, sm.algorithm_error], ids=["max-runtime", "user-error"])
def test_a_run_that_ended_is_resumed_on_its_id_and_checkpoints(harness, ending):
    first = harness.run(job_request(), [ending()], name=f"resume-first-{ending.__name__}")
    assert first.status == "FAILED"
    run_id = run_id_of(first)
    assert f"trainctl resume {run_id}" in first.cause  # the failure says how to go on
    more_steps = job_request(resume_run=run_id, hyperparameters={"max_steps": 5000})
    second = harness.run(more_steps, [sm.completed(train_loss=1.1)], name=f"resume-second-{ending.__name__}")
    assert second.status == "SUCCEEDED", (second.error, second.cause)
    (create,) = second.create_calls
    assert create["Environment"][ENV_RUN_ID] == run_id == second.output["run_id"]
    assert create["CheckpointConfig"] == first.create_calls[0]["CheckpointConfig"]
    assert create["TrainingJobName"].endswith("-a2") and attempt_tag(create) == "2"
    assert create["HyperParameters"]["max_steps"] == "5000"
    assert [a["attempt"] for a in second.output["attempts"]] == [2]


def test_a_run_out_of_attempts_resumes_with_a_new_retry_budget(harness):
    request = job_request(retry={"max_attempts": 2})
    first = harness.run(request, [sm.capacity_error()] * 2, name="resume-exhausted-first")
    assert first.status == "FAILED" and "attempts exhausted (2 of 2)" in first.cause
    run_id = run_id_of(first)
    resumed = job_request(resume_run=run_id, retry={"max_attempts": 2},
                          instance={"type": "ml.p5.48xlarge", "count": 1, "fallbacks": []})
    second = harness.run(resumed, [sm.capacity_error(), sm.completed()], name="resume-exhausted-second")
    assert second.status == "SUCCEEDED", (second.error, second.cause)
    assert [c["TrainingJobName"][-3:] for c in second.create_calls] == ["-a3", "-a4"]
    assert {c["ResourceConfig"]["InstanceType"] for c in second.create_calls} == {"ml.p5.48xlarge"}
    assert {c["CheckpointConfig"]["S3Uri"] for c in first.create_calls + second.create_calls} \
        == {first.create_calls[0]["CheckpointConfig"]["S3Uri"]}


def _refused(result, field: str, *words: str) -> None:
    assert result.status == "FAILED" and result.states_entered == REFUSED
    assert result.error == "RequestInvalid" and result.create_calls == []
    assert f"{field}:" in result.cause, result.cause
    for word in words:
        assert word in result.cause, result.cause


def test_resuming_a_completed_run_is_refused(harness):
    first = harness.run(job_request(), [sm.completed()], name="resume-completed-first")
    run_id = run_id_of(first)
    second = harness.run(job_request(resume_run=run_id), [], name="resume-completed-second")
    _refused(second, "resume_run", run_id, "nothing to resume", "init_from")


def test_resuming_an_active_run_is_refused(harness):
    first = harness.run(job_request(), [sm.max_runtime_reached()], name="resume-active-first")
    run_id = run_id_of(first)
    # Its job runs again as far as SageMaker says (e.g. an execution of the run that is still going).
    job = sagemaker_backends[ACCOUNT][REGION].training_jobs[first.job_names[0]]
    job.training_job_status = "InProgress"
    second = harness.run(job_request(resume_run=run_id), [], name="resume-active-second")
    job.training_job_status = "Stopped"
    _refused(second, "resume_run", run_id, "still active", first.job_names[0])


def test_resuming_an_unknown_run_is_refused(harness):
    result = harness.run(job_request(resume_run="gpt-125m-fsdp-" + "a" * 16), [], name="resume-unknown")
    _refused(result, "resume_run", "gpt-125m-fsdp-aaaaaaaaaaaaaaaa", "no training job")


def test_resuming_another_teams_run_is_refused_naming_the_field(harness, monkeypatch):
    """The account's listing shows another team's (or platform's) jobs of a run with that id, which this launcher's
    roles may not describe (IAM: `<prefix>-*`): looking them up raised AccessDenied, which Prepare retried as a
    fault and then failed naming no field. They are not this team's run: "not found here", naming resume_run."""
    first = harness.run(job_request(), [sm.max_runtime_reached()], name="resume-other-team-first")
    run_id = run_id_of(first)
    backend = sagemaker_backends[ACCOUNT][REGION]
    for name in first.job_names:  # the run's jobs become another platform's: its prefix, not this launcher's
        job = backend.training_jobs.pop(name)
        job.training_job_name = "research" + name.removeprefix("mltrain")
        backend.training_jobs[job.training_job_name] = job
    looked_up, describe = [], SageMakerModelBackend.describe_training_job

    def describe_as_the_launcher_may(backend, training_job_name: str):
        looked_up.append(training_job_name)
        if not training_job_name.startswith("mltrain-"):
            raise JsonRESTError("AccessDeniedException", "User: arn:aws:sts::123456789012:assumed-role/mltrain-prepare "
                                "is not authorized to perform: sagemaker:DescribeTrainingJob")
        return describe(backend, training_job_name)

    monkeypatch.setattr(SageMakerModelBackend, "describe_training_job", describe_as_the_launcher_may)
    second = harness.run(job_request(resume_run=run_id), [], name="resume-other-team-second")
    _refused(second, "resume_run", run_id, "no training job")
    assert not [name for name in looked_up if not name.startswith("mltrain-")], looked_up


def test_resuming_with_another_model_is_refused(harness):
    first = harness.run(job_request(), [sm.max_runtime_reached()], name="resume-model-first")
    second = harness.run(job_request(resume_run=run_id_of(first), model_size="350m"), [], name="resume-model-second")
    _refused(second, "model_size", run_id_of(first), "'125m'")


def test_a_run_id_that_is_not_one_is_refused_as_the_request_is_read(harness):
    result = harness.run(job_request(resume_run="s3://bucket/checkpoints/"), [], name="resume-not-an-id")
    _refused(result, "resume_run", "is not a run id")


def test_a_completed_run_starts_a_new_run_from_its_weights(harness):
    """Fine-tuning from a finished run: a new run id and prefix, the old run's checkpoints as the `init`
    channel and hyperparameters.init_from pointing there (the training package loads weights only)."""
    first = harness.run(job_request(), [sm.completed()], name="init-from-first")
    source = run_id_of(first)
    second = harness.run(job_request(init_from_run=source), [sm.completed()], name="init-from-second")
    assert second.status == "SUCCEEDED", (second.error, second.cause)
    (create,) = second.create_calls
    assert run_id_of(second) != source and create["TrainingJobName"].endswith("-a1")
    assert create["CheckpointConfig"]["S3Uri"] != first.create_calls[0]["CheckpointConfig"]["S3Uri"]
    (init,) = [c for c in create["InputDataConfig"] if c["ChannelName"] == "init"]
    assert init["DataSource"]["S3DataSource"]["S3Uri"] == first.create_calls[0]["CheckpointConfig"]["S3Uri"]
    assert init["InputMode"] == "File"
    assert create["HyperParameters"]["init_from"] == '"/opt/ml/input/data/init"'


@pytest.mark.parametrize("change, field, words", [
    ({"model_size": "350m"}, "model_size", ["'125m'"]),
    ({"init_from_run": "gpt-125m-fsdp-" + "b" * 16}, "init_from_run", ["no training job"]),
], ids=["another-model", "unknown-run"])
def test_starting_from_a_run_that_cannot_give_its_weights_is_refused(harness, change, field, words):
    first = harness.run(job_request(), [sm.completed()], name=f"init-refused-first-{field}")
    request = job_request(init_from_run=run_id_of(first)) | change
    _refused(harness.run(request, [], name=f"init-refused-{field}"), field, *words)
