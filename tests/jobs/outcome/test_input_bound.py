"""The summary's input-bound line reads the job's input_bound_share however the request spelled it."""

import json

import pytest

from contract.hyperparameters import INPUT_BOUND_SHARE
from contract.metrics import DATA_WAIT_MS, DATA_WAIT_SHARE
from jobs.outcome.summary import input_bound

WAITED = {DATA_WAIT_SHARE: 0.3, DATA_WAIT_MS: 41.5}


@pytest.mark.parametrize("key", ["input_bound_share", "input-bound-share", "--input-bound-share"])
def test_the_jobs_own_threshold_is_read_in_any_spelling(key):
    job = {"HyperParameters": {key: json.dumps(0.5)}}
    assert input_bound(WAITED, job) is None  # 30% waited is under the job's 0.5
    job["HyperParameters"][key] = json.dumps(0.2)
    assert input_bound(WAITED, job) == {**WAITED, "input_bound_share": 0.2}


def test_without_one_the_packages_default_holds():
    assert input_bound(WAITED, {"HyperParameters": {}})["input_bound_share"] == INPUT_BOUND_SHARE
    assert input_bound({DATA_WAIT_SHARE: INPUT_BOUND_SHARE / 2, DATA_WAIT_MS: 1.0}, None) is None
