"""`trainctl plan --runs`: the plan corrected by the platform's finished runs, from trainctl's cache (filled by
`trainctl runs`/`show`: cli.run_cache) or a file; malformed or old records are left out and said so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.run_cache import cache_path, remember
from tests.cli.conftest import run
from tests.jobs.test_planner_runs import HPS, P4D, P5, slow_runs

REQUEST = {"name": "gpt-1b-fsdp", "strategy": "fsdp", "model": "gpt", "model_size": "1b",
           "dataset": "s3://mltrain-datasets-123456789012-us-east-1/datasets/tokens/",
           "instance": {"type": P5, "count": 2}, "hyperparameters": HPS}


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder of this test's own: the session's (tests/conftest.py) is shared with `trainctl runs` tests."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def request_file(tmp_path: Path) -> Path:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(REQUEST))
    return path


def plan(request_file: Path, platform_file: Path, *args: str):
    result = run("plan", request_file, "--platform", platform_file, "--prices", "none", *args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result


def plan_doc(request_file: Path, platform_file: Path, *args: str) -> dict:
    return json.loads(plan(request_file, platform_file, "--json", *args).stdout)


def fsdp_on_p5(doc: dict) -> dict:
    """The candidate of the runs' own layout: fsdp over the request's two p5 instances."""
    return next(c for c in doc["candidates"] if (c["instance_type"], c["strategy"], c["instance_count"]) == (P5, "fsdp", 2))


def test_two_matching_runs_correct_the_throughput_and_say_so(request_file, platform_file, tmp_path):
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(slow_runs(1.25, 2)))
    plain = fsdp_on_p5(plan_doc(request_file, platform_file, "--runs", "none"))
    doc = plan_doc(request_file, platform_file, "--runs", str(runs))
    rec = fsdp_on_p5(doc)
    assert rec["throughput"] == pytest.approx(plain["throughput"] / 1.25, rel=1e-3)
    assert rec["step_time_s"] == pytest.approx(plain["step_time_s"] * 1.25, rel=1e-3)
    assert rec["measured_runs"]["count"] == 2 and rec["error_band"] == 0.0
    assert sum(s.startswith("run run-") for s in rec["calibrated_from"]) == 2
    assert doc["measured_runs"]["given"] == doc["measured_runs"]["usable"] == 2
    assert doc["measured_runs"]["source"] == "file" and doc["measured_runs"]["path"] == str(runs)
    # Candidates on other instance types have no run of their own: as the planner made them.
    p4d = [c for c in doc["candidates"] if c["instance_type"] == P4D]
    assert p4d and not any("measured_runs" in c for c in p4d)

    text = plan(request_file, platform_file, "--runs", str(runs)).stdout
    assert "corrected by 2 runs of the platform" in text and "1.25x the model's" in text
    assert "2 run record(s) in" in text


def test_without_runs_the_plan_is_the_published_one(request_file, platform_file):
    doc = plan_doc(request_file, platform_file, "--runs", "none")
    assert not any("measured_runs" in c for c in doc["candidates"])
    assert doc["measured_runs"]["given"] == 0 and doc["measured_runs"]["source"] == "none"
    text = plan(request_file, platform_file, "--runs", "none").stdout
    assert "every published run on this GPU generation" in text and "the published rows only" in text


def test_malformed_and_old_records_are_left_out_and_counted(request_file, platform_file, tmp_path):
    runs = tmp_path / "runs.json"
    old = {"run_id": "old", "instance_type": P5, "model": "gpt", "strategy": "fsdp", "step_time_s": 9.0}
    runs.write_text(json.dumps([old, "junk", None, {"measured": None}, *slow_runs(1.25, 1)]))
    result = plan(request_file, platform_file, "--runs", str(runs))
    assert "Traceback" not in result.output
    assert "5 run record(s)" in result.stdout and "1 usable" in result.stdout and "4 without" in result.stdout
    assert "corrected by 1 run of the platform" in result.stdout and "one run: no spread" in result.stdout


@pytest.mark.parametrize(("content", "says"), [("{not json", "could not be read"), ('{"runs": 3}', "no list")])
def test_a_runs_file_that_is_not_a_list_of_records_is_a_user_error(request_file, platform_file, tmp_path,
                                                                    content, says):
    runs = tmp_path / "runs.json"
    runs.write_text(content)
    result = run("plan", request_file, "--platform", platform_file, "--prices", "none", "--runs", str(runs))
    assert result.exit_code == 2 and says in result.stderr and "--runs" in result.stderr
    assert "Traceback" not in result.output
    missing = run("plan", request_file, "--platform", platform_file, "--prices", "none", "--runs", "nope.json")
    assert missing.exit_code == 2 and "no such file" in missing.stderr


def test_the_cache_that_runs_and_show_fill_is_what_plan_reads(request_file, platform_file):
    assert not cache_path().exists()  # own_cache: an empty folder
    assert "none yet" in plan(request_file, platform_file).stdout
    first, second = slow_runs(1.25, 2)
    assert remember([first, None, {"no": "job name"}]) is None
    assert remember([second, dict(first, step_time_s=first["step_time_s"])]) is None  # the same job: replaced
    kept = json.loads(cache_path().read_text())
    assert [s["job_name"] for s in kept] == ["job-1", "job-0"]
    doc = plan_doc(request_file, platform_file)
    assert fsdp_on_p5(doc)["measured_runs"]["count"] == 2 and doc["measured_runs"]["source"] == "cache"
    assert "filled by trainctl runs/show" in plan(request_file, platform_file).stdout


def test_an_unreadable_cache_is_said_and_the_plan_goes_on(request_file, platform_file):
    cache_path().parent.mkdir(parents=True, exist_ok=True)
    cache_path().write_text("{truncated")
    result = plan(request_file, platform_file)
    assert "could not be read" in result.stdout and "Traceback" not in result.output
    # remember() rewrites it whole from what it can read.
    assert remember(slow_runs(1.25, 1)) is None and len(json.loads(cache_path().read_text())) == 1


def test_the_cache_keeps_the_sections_given_last(monkeypatch):
    import cli.run_cache

    monkeypatch.setattr(cli.run_cache, "KEEP", 2)
    runs = slow_runs(1.25, 3)
    assert remember(runs) is None
    assert [s["job_name"] for s in json.loads(cache_path().read_text())] == ["job-1", "job-2"]
    assert remember([runs[1]]) is None  # seen again: moved to the end, the other kept
    assert [s["job_name"] for s in json.loads(cache_path().read_text())] == ["job-2", "job-1"]
