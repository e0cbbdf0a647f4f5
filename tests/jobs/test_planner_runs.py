"""The platform's own runs against the planner (jobs.planning.measured): the `measured` section a finished run's
record carries, and the plan corrected by such runs."""

from __future__ import annotations

import json

import pytest

from contract.metrics import MFU, STEP_TIME_MS
from jobs.catalog import lookup
from jobs.planning import plan_request
from jobs.planning.layout import Layout, numerics
from jobs.planning.measured import measured_section, usable
from jobs.planning.shape import model_facts
from jobs.planning.timing import step_time
from jobs.request.parse import parse_request

P5, P4D = "ml.p5.48xlarge", "ml.p4d.24xlarge"
HPS = {"micro_batch_size": 4, "global_batch_size": 512, "precision": "bf16", "activation_checkpointing": True}


def described_job(step_ms: float | None = 400.0, *, instance_type: str = P5, count: int = 2, strategy: str = "fsdp",
                  model: str = "gpt", size: str = "1b", name: str = "job-a1", **hps) -> dict:
    """A DescribeTrainingJob answer as Summarize holds it: hyperparameters JSON-encoded as the launcher sends them
    (jobs.render.training_job), the toolkit's own keys beside them, the training package's last metrics."""
    sent = {"sagemaker_program": "train.py", "strategy": strategy, "model": model, "model_size": size,
            **HPS, **hps}
    metrics = [] if step_ms is None else [{"MetricName": STEP_TIME_MS, "Value": step_ms},
                                          {"MetricName": MFU, "Value": 0.31}]
    return {"TrainingJobName": name, "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": count},
            "HyperParameters": {k: json.dumps(v) for k, v in sent.items()}, "FinalMetricDataList": metrics}


def test_the_section_holds_the_layout_the_measurement_and_the_planners_figure():
    section = measured_section(described_job(400.0), "gpt-1b-fsdp-0123")
    n = numerics(HPS)
    predicted = step_time(model_facts("gpt", "1b", None, n.seq_len), n, lookup(P5), Layout(2, 8, shard=16))
    assert section["run_id"] == "gpt-1b-fsdp-0123" and section["job_name"] == "job-a1"
    assert (section["instance_type"], section["instance_count"], section["strategy"]) == (P5, 2, "fsdp")
    assert (section["model"], section["model_size"], section["micro_batch_size"]) == ("gpt", "1b", 4)
    assert section["degrees"] == {"replicate": 1, "shard": 16, "tensor": 1, "pipeline": 1}
    assert section["step_time_s"] == 0.4 and section["mfu"] == 0.31
    assert section["predicted_step_time_s"] == pytest.approx(predicted.total, rel=1e-5)
    assert section["measured_over_predicted"] == pytest.approx(0.4 / predicted.total, abs=1e-4)
    # The MFU metric's formula (training.metrics.meter) at the predicted time: 512 samples' FLOPs over 16 GPUs' peak.
    flops = model_facts("gpt", "1b", None, n.seq_len).flops_per_sample * 512
    assert section["predicted_mfu"] == pytest.approx(flops / predicted.total / (lookup(P5).gpu.peak_tflops * 1e12 * 16),
                                                     abs=1e-4)
    assert usable(section)


def test_torch_native_degrees_are_the_training_packages():
    section = measured_section(described_job(strategy="hybrid", tp_degree=8, pp_degree=2, pp_microbatches=8))
    assert section["degrees"] == {"replicate": 1, "shard": 1, "tensor": 8, "pipeline": 2}
    hsdp = measured_section(described_job(strategy="hsdp"))
    assert hsdp["degrees"] == {"replicate": 2, "shard": 8, "tensor": 1, "pipeline": 1}
    assert hsdp["predicted_step_time_s"] != section["predicted_step_time_s"]


@pytest.mark.parametrize(("job", "why"), [
    (described_job(strategy="smp"), "does not lay out strategy smp"),
    (described_job(model="mypkg.models:net", size="custom"), "model_shape does not reach the job"),
    (described_job(micro_batch_size=0), "micro_batch_size"),
    (described_job(strategy="tp", tp_degree="eight"), "cannot read the job's hyperparameters"),
    (described_job(model=["gpt"]), "cannot read the job's hyperparameters"),
    (described_job(instance_type="ml.c5.4xlarge"), "not a GPU type"),
])
def test_a_layout_the_planner_cannot_size_is_recorded_without_a_figure_and_says_why(job, why):
    section = measured_section(job)
    assert section["step_time_s"] == 0.4 and section["predicted_step_time_s"] is None
    assert why in section["not_predicted"] and section["measured_over_predicted"] is None
    assert not usable(section)


def test_a_job_that_measured_no_step_time_has_no_section():
    assert measured_section(described_job(None)) is None
    assert measured_section(None) is None
    groups = described_job()
    groups["ResourceConfig"] = {"InstanceGroups": [{"InstanceType": P5, "InstanceCount": 2, "InstanceGroupName": "a"}]}
    assert measured_section(groups) is None  # instance groups: no one type to calibrate
    assert measured_section({"FinalMetricDataList": [{"MetricName": STEP_TIME_MS, "Value": float("nan")}],
                             "ResourceConfig": {"InstanceType": P5, "InstanceCount": 1}}) is None


# ---- the plan corrected by runs ---------------------------------------------------------------------------------


def request(**overrides):
    return parse_request({"name": "gpt-1b-fsdp", "strategy": "fsdp", "model": "gpt", "model_size": "1b",
                          "dataset": "s3://bucket/data/", "instance": {"type": P5, "count": 2},
                          "hyperparameters": HPS, **overrides})


def slow_runs(ratio: float, count: int, **job) -> list[dict]:
    """`count` runs of the request's own layout whose step time was `ratio` x the planner's figure."""
    predicted = measured_section(described_job(**job))["predicted_step_time_s"]
    return [measured_section(described_job(predicted * ratio * 1e3, name=f"job-{i}", **job), f"run-{i}")
            for i in range(count)]


def _candidate(result, instance_type: str, strategy: str, nodes: int):
    return next(c for c in result.candidates if (c.instance_type, c.layout.strategy, c.layout.nodes)
                == (instance_type, strategy, nodes))


def test_two_runs_at_1_25x_slow_the_matching_candidates_by_that_factor():
    plain = plan_request(request())
    fixed = plan_request(request(), runs=slow_runs(1.25, 2))
    before, after = _candidate(plain, P5, "fsdp", 2), _candidate(fixed, P5, "fsdp", 2)
    assert after.step_time_s == pytest.approx(1.25 * before.step_time_s, rel=1e-4)
    assert after.throughput == pytest.approx(before.throughput / 1.25, rel=1e-4)
    doc = after.to_dict()
    assert doc["measured_runs"]["count"] == 2 and doc["measured_runs"]["measured_over_predicted"] == 1.25
    assert doc["measured_runs"]["matched_on"] == "instance type, model, model size, strategy"
    assert doc["error_band"] == 0.0  # two runs at the same ratio: no spread
    assert [s.split(" (")[0] for s in doc["calibrated_from"][:2]] == ["run run-0", "run run-1"]
    # The same family and type, another strategy: the looser tier (type and model) corrects it too.
    ddp = _candidate(fixed, P5, "ddp", 2).to_dict()["measured_runs"]
    assert ddp["matched_on"] == "instance type, model" and ddp["count"] == 2
    counts = fixed.to_dict()["measured_runs"]
    assert (counts["given"], counts["usable"]) == (2, 2) and counts["corrected"] > 0


def test_the_median_and_the_spread_of_three_runs():
    runs = slow_runs(1.1, 1) + slow_runs(1.2, 1) + slow_runs(1.5, 1)
    doc = _candidate(plan_request(request(), runs=runs), P5, "fsdp", 2).to_dict()
    assert doc["measured_runs"]["measured_over_predicted"] == pytest.approx(1.2, abs=1e-4)
    assert doc["error_band"] == 0.25  # 1.5 / 1.2 - 1, the farthest run from the median


def test_runs_of_another_instance_type_or_model_family_change_nothing():
    plain = plan_request(request())
    other_type = slow_runs(1.25, 2, instance_type=P4D)
    other_family = slow_runs(1.25, 2, model="vit", size="base", micro_batch_size=32, global_batch_size=512,
                             activation_checkpointing=False)
    fixed = plan_request(request(), runs=other_family)
    assert [c.step_time_s for c in fixed.candidates] == [c.step_time_s for c in plain.candidates]
    assert not any("measured_runs" in c.to_dict() for c in fixed.candidates)
    # The p4d runs correct the p4d candidates only.
    on_p4d = plan_request(request(), runs=other_type)
    assert _candidate(on_p4d, P5, "fsdp", 2).step_time_s == _candidate(plain, P5, "fsdp", 2).step_time_s
    p4d = [c for c in on_p4d.candidates if c.instance_type == P4D]
    assert p4d and all(c.to_dict()["measured_runs"]["count"] == 2 for c in p4d)


@pytest.mark.parametrize("bad", [
    None, "run", 3, [], {}, {"measured": None},
    {"instance_type": P5, "model": "gpt", "strategy": "fsdp", "step_time_s": 0.5},  # an older record: no figure
    {"instance_type": P5, "model": "gpt", "strategy": "fsdp", "step_time_s": -1, "predicted_step_time_s": 0.4},
    {"instance_type": P5, "model": "gpt", "strategy": "fsdp", "step_time_s": "slow", "predicted_step_time_s": 0.4},
    {"instance_type": P5, "model": ["gpt"], "strategy": "fsdp", "step_time_s": 0.5, "predicted_step_time_s": 0.4},
])
def test_a_malformed_or_old_record_is_left_out(bad):
    plain = plan_request(request())
    result = plan_request(request(), runs=[bad, *slow_runs(1.25, 1)])
    assert result.to_dict()["measured_runs"]["given"] == 2 and result.to_dict()["measured_runs"]["usable"] == 1
    assert _candidate(result, P5, "fsdp", 2).step_time_s == pytest.approx(
        1.25 * _candidate(plain, P5, "fsdp", 2).step_time_s, rel=1e-4)


def test_the_narrowest_tier_with_runs_is_the_one_used():
    """Runs of the same size and strategy outrank runs of another size (the same strategy), which outrank runs of
    the family with another strategy."""
    same = slow_runs(1.25, 1)
    other_size = [dict(r, run_id="350m", job_name="job-350m", model_size="350m") for r in slow_runs(2.0, 1)]
    fixed = plan_request(request(), runs=same + other_size)
    fsdp = _candidate(fixed, P5, "fsdp", 2).to_dict()["measured_runs"]
    assert (fsdp["count"], fsdp["measured_over_predicted"]) == (1, 1.25)
    ddp = _candidate(fixed, P5, "ddp", 2).to_dict()["measured_runs"]  # no ddp run: the family's two, their median
    assert (ddp["count"], ddp["measured_over_predicted"], ddp["matched_on"]) == (2, 1.625, "instance type, model")
    smaller = plan_request(request(model_size="125m"), runs=same + other_size)
    tier = _candidate(smaller, P5, "fsdp", 2).to_dict()["measured_runs"]  # no 125m run: fsdp runs of any size
    assert (tier["count"], tier["matched_on"]) == (2, "instance type, model, strategy")


def test_a_hyperparameter_the_request_spelled_with_dashes_is_recorded_as_the_job_ran_it():
    # A request may write `micro-batch-size`; the launcher sends the key as written and the toolkit reads it alike.
    job = described_job(400.0)
    job["HyperParameters"] = {("micro-batch-size" if k == "micro_batch_size" else k): v
                              for k, v in job["HyperParameters"].items()}
    job["HyperParameters"]["micro-batch-size"] = json.dumps(2)
    assert measured_section(job)["micro_batch_size"] == 2
