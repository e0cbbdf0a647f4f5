"""The plan's input check: the loader's measured rate x the instance's vCPUs against what the GPUs consume
(jobs.planning.input_check), its io_bound warning with the figures and the fixes, and where the format comes from.
The rates are contract.data_formats' (measured, with an assumption for a GPU instance's vCPU): the tests read
them from there, so new measurements change the figures, not the tests' arithmetic."""

from __future__ import annotations

import pytest

from contract.data_formats import (
    AUTO_MAX_WORKERS,
    GPU_HOST_VCPU_RATIO,
    IMAGES,
    JPEG_BYTES_PER_PIXEL,
    JPEG_SOURCE_SCALE,
    MEASURED,
    TOKENS,
    WEBDATASET,
    load_rate,
)
from jobs.catalog import lookup
from jobs.planning import PlanInputError, plan_request
from jobs.planning.candidates import STARTUP_HOURS
from jobs.request.parse import parse_request


def plan(model="vit", size="base", instance="ml.p5.48xlarge", fmt=None, meta=None, input_mode="File", **hp):
    sizing = {"data_format": fmt} if fmt else {}
    request = parse_request({"name": "io", "dataset": "s3://bucket/data/", "model": model, "model_size": size,
                             "instance": {"type": instance}, "input_mode": input_mode, "sizing": sizing,
                             "hyperparameters": {"micro_batch_size": 64, **hp}})
    return plan_request(request, dataset_meta=meta)


def io_warning(result):
    return next((w.message for w in result.warnings if w.code == "io_bound"), None)


def test_a_vit_on_jpeg_shards_on_eight_h100s_with_auto_workers_is_io_bound_with_the_figures():
    result = plan(fmt=WEBDATASET)
    check, rec = result.input, result.recommendation
    per_worker = load_rate(WEBDATASET, (224 * JPEG_SOURCE_SCALE) ** 2, worker=True) * GPU_HOST_VCPU_RATIO
    assert check.ranks == 8 and check.vcpus == lookup("ml.p5.48xlarge").vcpus == 192
    assert check.workers_per_rank == AUTO_MAX_WORKERS and check.processes == 8 * AUTO_MAX_WORKERS
    assert check.rate_per_process == pytest.approx(per_worker)
    assert check.need == pytest.approx(rec.throughput)  # images/s, one instance
    assert check.supply < check.need and check.wait_share == pytest.approx(1 - check.supply / check.need)
    assert check.bound
    message = io_warning(result)
    assert message is not None
    for figure in (check.supply, check.need, check.rate_per_process):
        assert f"{figure:,.0f}" in message
    assert f"{check.processes} processes" in message and f"{check.wait_share:.0%}" in message
    # The GPUs run at supply / need of their speed: the steps' hours (not the startup's) grow by need / supply.
    slower = STARTUP_HOURS + (rec.hours - STARTUP_HOURS) * check.need / check.supply
    assert f"the run takes ~{slower:,.2f} h, not {rec.hours:,.2f}" in message
    assert f"data_workers={check.workers_that_feed}" in message  # the fix, with its number
    assert "store the images at the training side" in message  # decode grows with the source's pixels


def test_the_suggested_workers_feed_the_gpus():
    fix = plan(fmt=WEBDATASET).input.workers_that_feed
    assert fix is not None and fix > AUTO_MAX_WORKERS
    fed = plan(fmt=WEBDATASET, data_workers=fix)
    assert not fed.input.bound and fed.input.supply >= fed.input.need and io_warning(fed) is None
    short = plan(fmt=WEBDATASET, data_workers=fix - 1)
    assert short.input.supply < short.input.need  # the fix is the least that feeds them


def test_the_same_vit_on_npy_arrays_with_workers_is_not_io_bound():
    result = plan(fmt=IMAGES, data_workers=2)
    assert result.input.data_format == IMAGES and not result.input.bound and io_warning(result) is None


def test_npy_on_the_training_thread_waits_the_whole_load():
    """data_workers=0 (auto's choice for memory-mapped formats): each rank loads between its steps."""
    check = plan(fmt=IMAGES).input
    assert check.workers_per_rank == 0 and check.processes == check.ranks
    load = check.need / check.supply
    assert check.wait_share == pytest.approx(load / (1 + load))


def test_a_vcpu_short_instance_names_a_larger_one():
    """4 vCPUs for an L40S: three workers cannot feed a small ViT at any worker count."""
    shape = {"kind": "vit", "layers": 12, "hidden": 384, "heads": 6, "image_size": 224, "patch_size": 16}
    request = parse_request({"name": "io", "dataset": "s3://bucket/data/", "model": "my.pkg:vit_s",
                             "model_shape": shape, "instance": {"type": "ml.g6e.xlarge"}, "input_mode": "File",
                             "sizing": {"data_format": WEBDATASET}, "hyperparameters": {"micro_batch_size": 64}})
    check = plan_request(request).input
    assert check.bound and check.workers_that_feed is None and check.processes == 3
    assert "an instance type with more vCPUs per GPU (ml.g6e.xlarge has 4" in io_warning(plan_request(request))
    roomy = parse_request({**request_dict(request), "instance": {"type": "ml.g6e.16xlarge"},
                           "hyperparameters": {"micro_batch_size": 64, "data_workers": 16}})
    assert not plan_request(roomy).input.bound  # 64 vCPUs: enough cores


def request_dict(request):
    return {"name": request.name, "dataset": request.dataset, "model": request.model,
            "model_shape": {k: v for k, v in vars(request.model_shape).items() if v is not None},
            "input_mode": request.input_mode, "sizing": {"data_format": request.sizing.data_format}}


def test_a_gpt_on_tokens_is_not_io_bound_and_needs_no_hint():
    result = plan(model="gpt", size="125m")
    check = result.input
    assert (check.data_format, check.format_source) == (TOKENS, "a decoder reads token shards")
    assert check.checked and not check.bound and check.wait_share < 0.05 and io_warning(result) is None


def test_an_unknown_format_says_it_cannot_check_and_raises_no_alarm():
    result = plan()  # a ViT on S3, no sizing.data_format, no meta.json read
    assert not result.input.checked and not result.input.bound and io_warning(result) is None
    text = result.input.text()
    assert text.startswith("not checked: the dataset's format is unknown") and "sizing.data_format" in text
    assert result.to_dict()["input"]["checked"] is False


def test_the_datasets_meta_json_gives_the_format_and_a_contradiction_is_an_error():
    check = plan(meta={"format": WEBDATASET, "image_size": 224}).input
    assert (check.data_format, check.format_source) == (WEBDATASET, "the dataset's meta.json")
    with pytest.raises(PlanInputError) as info:
        plan(fmt=IMAGES, meta={"format": WEBDATASET})
    assert info.value.field == "sizing.data_format" and "'webdataset'" in str(info.value)
    unread = plan(meta="cannot read s3://bucket/data/meta.json: AccessDenied").input
    assert not unread.checked and "AccessDenied" in unread.format_source
    odd = plan(meta={"format": "parquet"}).input
    assert not odd.checked and "format 'parquet'" in odd.format_source


@pytest.mark.parametrize(("model", "size", "fmt"), [("gpt", "125m", WEBDATASET), ("vit", "base", TOKENS)])
def test_a_format_the_model_cannot_read_is_an_error_naming_the_field(model, size, fmt):
    with pytest.raises(PlanInputError) as info:
        plan(model=model, size=size, fmt=fmt)
    assert info.value.field == "sizing.data_format" and info.value.value == fmt


def test_the_bandwidth_check_counts_encoded_bytes_for_jpeg_shards():
    """FastFile on one p4d: raw 224 px arrays need more than its 0.5 GB/s; the same images as JPEGs are counted
    at their encoded size."""
    raw = plan(instance="ml.p4d.24xlarge", input_mode="FastFile", fmt=IMAGES, data_workers=4)
    jpeg = plan(instance="ml.p4d.24xlarge", input_mode="FastFile", fmt=WEBDATASET, data_workers=11)
    assert raw.input.bytes_per_sample == 3 * 224 * 224
    assert jpeg.input.bytes_per_sample == pytest.approx((224 * JPEG_SOURCE_SCALE) ** 2 * JPEG_BYTES_PER_PIXEL)
    mb_s = raw.recommendation.throughput * raw.input.bytes_per_sample / 1e6
    assert f"{mb_s:,.0f} MB/s of input (images); FastFile gives about 500 MB/s" in io_warning(raw)
    assert "FSx for Lustre or File mode" in io_warning(raw)


def test_load_rate_is_each_measured_row_and_grows_slower_with_work_between_them():
    for fmt, rows in MEASURED.items():
        for row in rows:
            assert load_rate(fmt, row.work, worker=False) == pytest.approx(row.thread)
            assert load_rate(fmt, row.work, worker=True) == pytest.approx(row.worker)
        a, b = rows[0], rows[1]
        middle = load_rate(fmt, (a.work + b.work) / 2, worker=True)
        assert min(a.worker, b.worker) < middle < max(a.worker, b.worker)
        assert load_rate(fmt, 0, worker=True) <= 10 * rows[0].worker  # the floor below the first row


def test_the_catalogs_vcpus_for_gpu_types_are_the_ec2_figures_the_check_divides():
    """[ec2] vCPUs of the GPU types people train on (the input check's supply is per vCPU)."""
    expected = {"ml.p4d.24xlarge": 96, "ml.p4de.24xlarge": 96, "ml.p5.48xlarge": 192, "ml.p5en.48xlarge": 192,
                "ml.g5.xlarge": 4, "ml.g5.2xlarge": 8, "ml.g5.4xlarge": 16, "ml.g5.8xlarge": 32,
                "ml.g5.12xlarge": 48, "ml.g5.16xlarge": 64, "ml.g5.24xlarge": 96, "ml.g5.48xlarge": 192,
                "ml.g6e.xlarge": 4, "ml.g6e.48xlarge": 192, "ml.p3.16xlarge": 64}
    assert {t: lookup(t).vcpus for t in expected} == expected
