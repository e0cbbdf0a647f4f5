"""`trainctl plan`'s input check as the user sees it: the dataset's meta.json read from S3 (moto) when the plan
talks to AWS, never with --platform FILE, the figures in the output and in --json, and why it was not checked."""

from __future__ import annotations

import json

import boto3
import pytest

from cli.aws import Aws
from cli.dataset_meta import dataset_meta
from tests.cli.conftest import REGION, run

BUCKET = "mltrain-datasets-123456789012-us-east-1"
PREFIX = "images/products-wds/train/"


@pytest.fixture
def vit_request(tmp_path):
    path = tmp_path / "vit.json"
    path.write_text(json.dumps({
        "name": "vit-products", "strategy": "ddp", "model": "vit", "model_size": "base",
        "dataset": f"s3://{BUCKET}/{PREFIX}", "instance": {"type": "ml.p5.48xlarge", "count": 1},
        "input_mode": "File", "hyperparameters": {"micro_batch_size": 64, "max_steps": 1000}}))
    return path


def put_meta(text: str) -> None:
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=PREFIX + "meta.json", Body=text.encode())


def test_plan_reads_the_s3_datasets_meta_json_and_shows_the_io_check(deployed, vit_request):
    put_meta(json.dumps({"format": "webdataset", "num_classes": 1000, "image_size": 224, "channels": 3}))
    result = run("plan", vit_request, "--prices", "none", env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("input:"))
    assert "webdataset (the dataset's meta.json): the GPUs consume" in line and "of 192 vCPUs" in line
    assert "io_bound: the GPUs will wait for input: the loader supplies" in result.stdout
    doc = json.loads(run("plan", vit_request, "--prices", "none", "--json").stdout)
    check = doc["input"]
    assert check["data_format"] == "webdataset" and check["bound"] is True and check["vcpus"] == 192
    assert check["supply"] < check["need"] and check["rates"] == "contract/data_formats.py"
    assert any(w["code"] == "io_bound" for w in doc["warnings"])


def test_plan_says_why_it_cannot_check_when_the_meta_json_is_missing(deployed, vit_request):
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
    result = run("plan", vit_request, "--prices", "none", env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert (f"input: not checked: the dataset's format is unknown (cannot read s3://{BUCKET}/{PREFIX}meta.json: "
            "NoSuchKey)") in result.stdout
    assert "io_bound" not in result.stdout


def test_plan_with_a_platform_file_reads_no_s3(platform_file, vit_request, monkeypatch):
    monkeypatch.setattr("cli.aws.Aws.client", lambda self, service: pytest.fail(f"plan called {service}"))
    result = run("plan", vit_request, "--platform", platform_file, "--prices", "none", env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "input: not checked: the dataset's format is unknown (the plan reads no meta.json from FSx, or from S3 " \
           "offline): set sizing.data_format" in result.stdout


@pytest.mark.parametrize(("data", "said"), [
    (b"{not json", "is not JSON"),
    (b"[1]", "holds a JSON list, not an object"),
    (b'{"format": "images"}', {"format": "images"}),
])
def test_what_a_meta_json_holds_and_where_nothing_is_read(aws, data, said):
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="x/meta.json", Body=data)
    s3.put_object(Bucket=BUCKET, Key="meta.json", Body=data)  # a dataset at the bucket's root
    session = Aws(region=REGION)
    for uri, where in ((f"s3://{BUCKET}/x/", f"s3://{BUCKET}/x/meta.json"), (f"s3://{BUCKET}", f"s3://{BUCKET}/meta.json")):
        assert dataset_meta(uri, session) == (said if isinstance(said, dict) else f"{where} {said}")
    for elsewhere, client in (("fsx:/datasets/x", session), ("./data/x", session), (f"s3://{BUCKET}/x/", None)):
        assert dataset_meta(elsewhere, client) is None
