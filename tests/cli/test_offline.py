"""trainctl plan and render with --platform FILE: no AWS call, exact output, user errors exit 2."""

from __future__ import annotations

import json
import re
from datetime import UTC
from pathlib import Path

import boto3
import pytest
from botocore.validate import validate_parameters

from tests.cli.conftest import DATA, run

REQUESTS = ["ddp.json", "spot-fallbacks.json", "smp.json"]


def _create_input_shape():
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return client.meta.service_model.operation_model("CreateTrainingJob").input_shape


@pytest.mark.parametrize("name", REQUESTS)
def test_render_prints_a_create_training_job_request_botocore_accepts(name, platform_file):
    result = run("render", DATA / name, "--platform", platform_file)
    assert result.exit_code == 0, result.output
    create = json.loads(result.stdout)  # stdout is the document alone, so it pipes into jq or the AWS CLI
    validate_parameters(create, _create_input_shape())  # raises ParamValidationError on any bad field
    request = json.loads((DATA / name).read_text())
    assert create["ResourceConfig"].get("InstanceType") == request["instance"]["type"]
    assert json.loads(create["HyperParameters"]["strategy"]) == request["strategy"]
    assert create["CheckpointConfig"]["S3Uri"].endswith("/checkpoints/")


def test_attempts_get_fresh_names_and_share_the_checkpoint_prefix(platform_file):
    first = json.loads(run("render", DATA / "spot-fallbacks.json", "--platform", platform_file).stdout)
    third = run("render", DATA / "spot-fallbacks.json", "--platform", platform_file, "--attempt", "3",
                "--instance-type", "ml.p5.48xlarge", "--on-demand")
    assert third.exit_code == 0, third.output
    third = json.loads(third.stdout)
    assert first["TrainingJobName"] != third["TrainingJobName"]
    assert third["TrainingJobName"].endswith("-a3")
    assert first["CheckpointConfig"] == third["CheckpointConfig"]
    assert first["EnableManagedSpotTraining"] is True and "MaxWaitTimeInSeconds" in first["StoppingCondition"]
    assert third["EnableManagedSpotTraining"] is False and "MaxWaitTimeInSeconds" not in third["StoppingCondition"]
    assert third["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"


def test_run_id_names_the_checkpoint_prefix(platform_file):
    result = run("render", DATA / "ddp.json", "--platform", platform_file, "--run-id", "gpt-small-ddp-0badcafe")
    create = json.loads(result.stdout)
    assert create["CheckpointConfig"]["S3Uri"] == (
        "s3://mltrain-checkpoints-123456789012-us-east-1/mltrain/gpt-small-ddp-0badcafe/checkpoints/")
    # The name's own random part is fresh on every render: attempt names cannot be guessed ahead.
    assert re.fullmatch(r"mltrain-gpt-small-ddp-0badcafe-[a-z2-7]{8}-a1", create["TrainingJobName"])


def test_plan_summarizes_what_would_run(platform_file):
    result = run("plan", DATA / "spot-fallbacks.json", "--platform", platform_file, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "2 x ml.p4d.24xlarge: 8x A100 40 GiB, EFA" in text
    assert "world size 16" in text
    assert "FSDP" in text
    assert "pytorch-training:2.8.0-gpu-py312" in text
    assert "yes, max wait 36h00m" in text
    assert "ml.p4d.24xlarge -> ml.p5.48xlarge -> ml.g5.48xlarge" in text
    assert "on demand after 2 interruptions" in text
    assert "at most 10 attempts" in text
    assert "mltrain/gpt-1b-fsdp-spot-<16 random>/checkpoints/ every 500 steps" in text
    assert "mltrain-gpt-1b-fsdp-spot-<16 random>-<8 random>-a1, -a2" in text


def test_plan_shows_smp_degrees_and_the_fsx_channel(platform_file):
    result = run("plan", DATA / "smp.json", "--platform", platform_file, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "tensor parallel 4 x context parallel 1 x data parallel 8; parameters sharded within groups of 2 " \
           "data-parallel ranks, 4 replicas" in result.stdout
    assert "smdistributed-modelparallel:2.5.1" in result.stdout
    assert "FSx fs-0123456789abcdef0:/abcdefgh/datasets/c4 (ro)" in result.stdout


def test_plan_shows_what_auto_picked_and_why(platform_file, tmp_path):
    request = json.loads((DATA / "ddp.json").read_text()) | {"strategy": "auto", "model_size": "7b"}
    request["hyperparameters"] |= {"micro_batch_size": 2, "activation_checkpointing": True}
    path = tmp_path / "auto.json"
    path.write_text(json.dumps(request))
    result = run("plan", path, "--platform", platform_file, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    # gpt 7b on 2 x 4 A10Gs, 16 micro-batches a step: with FSDP's gradients accumulated unsharded (fp32, the whole
    # model's per rank) only pipelines fitted (8 stages, 23.7 of 24 GiB, 259 s/step); accumulated sharded, a
    # reduce-scatter every micro-batch (fsdp_accumulation, the package's default since), FSDP fits in 20.1 GiB (21.2
    # before backward's phases were charged one after the other) and runs faster, so auto picks it.
    assert "auto -> fsdp (fsdp: 20.1 of 24 GiB per A10G" in result.stdout


def test_plan_shows_a_pipelines_stages_a_rank_and_a_model_of_ones_owns_shape(platform_file, tmp_path):
    # A 70B-shaped model of one's own at tensor 8 x pipeline 8, 10 stages a rank: the plan says the shape it sizes (not
    # the `small` preset the model field defaults to) and how the pipeline runs, as rendered for the job.
    request = json.loads((DATA / "ddp.json").read_text()) | {
        "model": "my.pkg:llama", "strategy": "hybrid", "instance": {"type": "ml.p5.48xlarge", "count": 8},
        "model_shape": {"kind": "decoder", "layers": 80, "hidden": 8192, "heads": 64, "seq_len": 4096,
                        "vocab_size": 32000},
        "parallel": {"tensor_parallel_degree": 8, "pipeline_parallel_degree": 8, "pipeline_microbatches": 16,
                     "pipeline_schedule": "interleaved_1f1b", "pipeline_stages_per_rank": 10}}
    request["hyperparameters"] = {"micro_batch_size": 1, "max_steps": 100}
    path = tmp_path / "l70.json"
    path.write_text(json.dumps(request))
    result = run("plan", path, "--platform", platform_file, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "my.pkg:llama (model_shape: decoder, 80 layers x 8192 wide, 64 heads)" in result.stdout
    assert "= 8 x 1 x 1 x 8; interleaved_1f1b, 10 stage(s) a rank, 16 micro-batches a step" in result.stdout
    assert "interleaved, 10 a rank" in result.stdout  # the sizing table's row of the layout named


def _request(tmp_path, name: str = "request", **changes) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(json.loads((DATA / "ddp.json").read_text()) | changes))
    return path


def test_a_plan_that_does_not_fit_is_an_error_naming_the_nearest_layout_that_fits(platform_file, tmp_path):
    # gpt 7b on one 4 x A10G (24 GiB) instance, nothing checkpointed: no layout fits there. A plan is a
    # promise: not "valid" (submit would start a job that runs out of memory) but the nearest layout that fits.
    path = _request(tmp_path, model_size="7b", strategy="fsdp", instance={"type": "ml.g5.12xlarge", "count": 1},
                    hyperparameters={"micro_batch_size": 1, "max_steps": 100})
    result = run("plan", path, "--platform", platform_file, env={"COLUMNS": "200"})
    _assert_user_error(result, "gpt-small-ddp does not fit: fsdp on 1 x ml.g5.12xlarge (4 GPUs) needs",
                       "nearest that fits: ", 'request fields {"strategy": ')
    assert "valid" not in result.output
    # The layout the request names is what is judged: ddp of a 7B (a whole copy of its state per GPU) does not fit
    # 2 x p4d even where fsdp would.
    ddp = _request(tmp_path, "ddp", model_size="7b", strategy="ddp", instance={"type": "ml.p4d.24xlarge", "count": 2},
                   hyperparameters={"micro_batch_size": 1, "max_steps": 100, "activation_checkpointing": True})
    _assert_user_error(run("plan", ddp, "--platform", platform_file), "does not fit: ddp on 2 x ml.p4d.24xlarge",
                       "nearest that fits: ")
    # --json is the document: every candidate, the recommendation marked as not fitting.
    doc = json.loads(run("plan", path, "--platform", platform_file, "--json").stdout)
    assert doc["recommendation"]["fits"] is False and any(c["fits"] for c in doc["candidates"])


def test_the_plan_compares_only_instance_types_the_platform_allows(platform_doc, tmp_path):
    # The platform allows p4d, p5, g5 and g6 here: the plan never shows p4de, p5en or g6e (a request naming one
    # would be refused), while the request's own type is always sized.
    platform = tmp_path / "platform.json"
    platform.write_text(json.dumps(platform_doc))
    doc = json.loads(run("plan", DATA / "spot-fallbacks.json", "--platform", platform, "--json").stdout)
    shown = {c["instance_type"] for c in doc["candidates"]}
    assert shown <= set(platform_doc["allowed_instance_types"]) and "ml.p5.48xlarge" in shown
    platform.write_text(json.dumps({**platform_doc, "allowed_instance_types": []}))  # empty: every type
    doc = json.loads(run("plan", DATA / "spot-fallbacks.json", "--platform", platform, "--json").stdout)
    assert {"ml.p4de.24xlarge", "ml.p5en.48xlarge"} <= {c["instance_type"] for c in doc["candidates"]}


# ---- user errors: exit 2, one message, no traceback ------------------------------------------------


def _assert_user_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""  # nothing half-rendered reaches a pipe
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["render", "plan"])
def test_invalid_request_names_every_field(command, platform_file):
    result = run(command, DATA / "invalid.json", "--platform", platform_file)
    _assert_user_error(result, "invalid.json is not a valid job request", "spots: unknown field; did you mean 'spot'?",
                       "instance.count: must be at least 1", "name: 'bad request'")


def test_cross_field_and_platform_rules_are_reported(platform_file, tmp_path):
    request = json.loads((DATA / "ddp.json").read_text()) | {"max_wait_hours": 12}
    (tmp_path / "r.json").write_text(json.dumps(request))
    _assert_user_error(run("render", tmp_path / "r.json", "--platform", platform_file),
                       "max_wait_hours: only applies to Spot training")
    request = json.loads((DATA / "ddp.json").read_text()) | {"instance": {"type": "ml.p3.2xlarge"}}
    (tmp_path / "r.json").write_text(json.dumps(request))
    _assert_user_error(run("render", tmp_path / "r.json", "--platform", platform_file),
                       "does not fit this platform", "instance.type: ml.p3.2xlarge is not allowed on this platform")


def test_instance_type_override_must_be_allowed(platform_file):
    result = run("render", DATA / "ddp.json", "--platform", platform_file, "--instance-type", "ml.p3.2xlarge")
    assert result.exit_code == 2, result.output
    assert "--instance-type: ml.p3.2xlarge is not allowed on this platform" in result.stderr
    assert "Traceback" not in result.output
    result = run("render", DATA / "ddp.json", "--platform", platform_file, "--instance-type", "ml.p4d.24xl")
    assert "did you mean 'ml.p4d.24xlarge'?" in result.stderr


def test_missing_request_file(platform_file):
    _assert_user_error(run("render", "no-such-request.json", "--platform", platform_file),
                       "job request file not found: no-such-request.json")


def test_malformed_json_says_where(platform_file, tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "name": "x",\n  "dataset": "s3://b/k/",\n}\n')
    _assert_user_error(run("render", path, "--platform", platform_file), "not valid JSON: line 4 column 1")


def test_request_must_be_an_object(platform_file, tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    _assert_user_error(run("plan", path, "--platform", platform_file), "must be a JSON object, got list")


def test_bad_platform_file(tmp_path):
    path = tmp_path / "platform.json"
    path.write_text(json.dumps({"name_prefix": "mltrain", "regoin": "us-east-1"}))
    _assert_user_error(run("render", DATA / "ddp.json", "--platform", path),
                       "not a platform-settings document", "regoin")
    _assert_user_error(run("render", DATA / "ddp.json", "--platform", tmp_path / "missing.json"),
                       "platform settings file not found")


def test_without_platform_file_and_without_credentials():
    result = run("render", DATA / "ddp.json", "--region", "us-east-1")
    _assert_user_error(result, "no AWS credentials found")


def test_without_platform_file_and_without_region():
    _assert_user_error(run("plan", DATA / "ddp.json"), "no AWS region configured", "--region")


def test_default_execution_names_are_valid_and_readable():
    from datetime import datetime

    from cli.commands.submit import default_execution_name
    from jobs.naming import EXECUTION_NAME

    when = datetime(2026, 11, 21, 8, 30, 5, tzinfo=UTC)
    assert default_execution_name("gpt-1b-fsdp", when) == "gpt-1b-fsdp-20261121T083005Z"
    long_name = default_execution_name("x" * 100, when)
    assert len(long_name) == 80 and EXECUTION_NAME.fullmatch(long_name)


def test_help_texts():
    result = run("--help")
    assert result.exit_code == 0
    for command in ("plan", "render", "submit", "status", "list", "stop", "logs", "local"):
        assert command in result.stdout
    render_help = run("render", "--help", env={"COLUMNS": "200"})
    assert "--attempt" in render_help.stdout and "--platform" in render_help.stdout
    assert "--on-demand" in render_help.stdout and "cli-input-json" in render_help.stdout


def test_every_example_renders(platform_file):
    """Every request in examples/ renders with this CLI into a request botocore accepts."""
    examples = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*.json")
                      if p.name != "platform-settings.json" and not p.name.startswith("local"))
    assert examples, "examples/ holds no request files"
    for example in examples:
        result = run("render", example, "--platform", Path(__file__).parents[2] / "examples/platform-settings.json")
        assert result.exit_code == 0, f"{example.name}: {result.output}"
        validate_parameters(json.loads(result.stdout), _create_input_shape())


def test_a_key_given_twice_is_refused_with_its_lines(platform_file, tmp_path):
    # json.loads would keep the last "spot" and launch on demand without a word.
    text = (DATA / "ddp.json").read_text().replace('"strategy": "ddp",', '"spot": true,\n  "strategy": "ddp",')
    text = text.replace('"max_runtime_hours": 6,', '"max_runtime_hours": 6,\n  "spot": false,')
    (tmp_path / "twice.json").write_text(text)
    result = run("plan", tmp_path / "twice.json", "--platform", platform_file)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f'{tmp_path / "twice.json"}: line 10: key "spot" appears twice in one object (first on line 3)' \
        in result.stderr
    assert 'remove one of the two "spot" keys' in result.stderr


def test_the_same_key_in_two_objects_is_fine_and_nested_twins_are_found(platform_file, tmp_path):
    from cli.errors import UserError
    from cli.request_file import read_json_object

    ok = tmp_path / "ok.json"
    ok.write_text('{"name": "a", "instance_groups": [{"name": "g1"}, {"name": "g2"}]}')
    assert read_json_object(ok, "job request") == {"name": "a", "instance_groups": [{"name": "g1"}, {"name": "g2"}]}
    nested = tmp_path / "nested.json"
    nested.write_text('{"name": "a",\n "instance": {"type": "x",\n  "count": 1,\n  "type": "y"}}')
    with pytest.raises(UserError, match=r'line 4: key "type" appears twice in one object \(first on line 2\)'):
        read_json_object(nested, "job request")


def test_a_platform_file_with_a_key_twice_is_refused(platform_file, tmp_path):
    text = platform_file.read_text().replace('"region": "us-east-1",', '"region": "us-east-1", "region": "eu-west-1",')
    (tmp_path / "platform.json").write_text(text)
    result = run("render", DATA / "ddp.json", "--platform", tmp_path / "platform.json")
    assert result.exit_code == 2
    assert 'line 3: key "region" appears twice in one object (first on line 3)' in result.stderr


@pytest.mark.parametrize("command", ["plan", "render"])
def test_without_region_or_credentials_plan_and_render_point_to_platform_file(command):
    for extra in ((), ("--region", "us-east-1")):
        result = run(command, DATA / "ddp.json", *extra)
        _assert_user_error(result, "to read the platform settings (SSM /mltrain/platform-settings)")
        assert "pass --platform FILE (e.g. examples/platform-settings.json) to work offline" in result.stderr


def test_help_groups_the_commands_by_what_they_need():
    text = run("--help", env={"COLUMNS": "200"}).stdout
    assert text.index("Offline (no AWS access with --platform FILE)") < text.index("│ plan ") \
        < text.index("The deployed platform") < text.index("│ submit ") < text.index("This machine") \
        < text.index("│ local ")
    # The help is rich markup: the extra's name must survive it.
    assert "'sagemaker-training-platform[chart]'" in run("status", "--help", env={"COLUMNS": "200"}).stdout
