"""jobs.retry.resume and the `resume_run` field, without AWS: which runs a request may continue, and after which attempt."""

from __future__ import annotations

import json

import pytest

from contract.errors import RequestInvalid
from jobs.naming import new_run_id, run_token
from jobs.request.field_rules import check_run_id
from jobs.request.parse import parse_request
from jobs.retry.resume import resume_point

# A fixed id of the minted form: parametrized ids must be the same in every pytest-xdist worker.
RUN = "gpt-125m-abcdefghij234567"
URI = f"s3://checkpoints/mltrain/{RUN}/checkpoints/"


def request(**fields):
    return parse_request({"name": "gpt-125m", "dataset": "s3://b-1/x/", "model_size": "125m",
                          "instance": {"type": "ml.p4d.24xlarge"}, "resume_run": RUN, **fields})


def job(attempt: int, status: str, model_size: str = "125m") -> dict:
    return {"TrainingJobName": f"mltrain-{RUN}-abcdefgh-a{attempt}", "TrainingJobStatus": status,
            "HyperParameters": {"model": json.dumps("gpt"), "model_size": json.dumps(model_size)}}


def test_freshly_minted_run_ids_pass_the_fields_rule():
    assert all(check_run_id(new_run_id(name)) is None for name in ("a", "gpt-125m", "x" * 40, "weird name!"))
    assert run_token(RUN) == RUN[-16:]


@pytest.mark.parametrize("value", ["gpt-125m", "gpt-125m-1234abcd", "s3://b/x/", f"{RUN}x", "-" + RUN[-16:]])
def test_what_is_not_a_run_id_is_refused_naming_the_field(value):
    with pytest.raises(RequestInvalid, match="resume_run: .* is not a run id"):
        request(resume_run=value)


def test_the_attempt_after_the_runs_last_one():
    assert resume_point(request(), [job(1, "Failed"), job(3, "Stopped"), job(2, "Failed")], URI) == 3


@pytest.mark.parametrize(("jobs", "field", "words"), [
    ([], "resume_run", "no training job"),
    ([job(1, "Failed"), job(2, "Stopping")], "resume_run", "still active"),
    ([job(1, "Failed"), job(2, "Completed")], "resume_run", "nothing to resume"),
    ([job(1, "Stopped", model_size="350m")], "model_size", "trained model_size '350m'"),
])
def test_runs_that_cannot_be_continued_are_refused(jobs, field, words):
    with pytest.raises(RequestInvalid) as refused:
        resume_point(request(), jobs, URI)
    assert str(refused.value).startswith(f"{field}: ") and words in str(refused.value) and RUN in str(refused.value)
