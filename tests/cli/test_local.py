"""trainctl local: the request rendered for this machine, the channels and workdir handed to cli.container_emulator."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli.commands.local import run_request_locally
from cli.errors import UserError
from cli.request_file import load_request
from tests.cli.conftest import DATA, channel_folder, run
from tests.tracking import check_run, rank_problems, tensorboard_problems
from training.metrics.mlflow_run import WORKDIR_TAG

REPO = Path(__file__).resolve().parents[2]


class FakeRunLocal:
    """Stands in for cli.container_emulator.run_local where only the arguments trainctl hands over are under test."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.calls: list[tuple[dict, dict]] = []

    def __call__(self, create: dict, **kwargs) -> int:
        self.calls.append((create, kwargs))
        return self.code


@pytest.fixture
def corpus_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The request's relative ./corpus/{train,validation} folders, under a temporary working directory."""
    monkeypatch.chdir(tmp_path)
    for split in ("train", "validation"):
        channel_folder(tmp_path / "corpus" / split)
    return tmp_path / "corpus"


def test_renders_for_this_machine_and_maps_the_request_folders(corpus_dir):
    fake = FakeRunLocal()
    loaded = load_request(DATA / "local-tiny.json")
    assert run_request_locally(loaded, workdir=None, nproc=2, data=None, run_local=fake) == 0
    ((create, kwargs),) = fake.calls
    hp = {k: json.loads(v) for k, v in create["HyperParameters"].items()}
    assert hp["strategy"] == "fsdp" and hp["max_steps"] == 6 and hp["checkpoint_interval"] == 3
    assert hp["sagemaker_program"] == "train.py"
    assert hp["sagemaker_submit_directory"] == (REPO / "training").as_uri()
    assert kwargs["nproc"] == 2
    assert kwargs["data_dirs"] == {"train": Path("corpus/train"), "validation": Path("corpus/validation")}
    # The default workdir is per request name, so running again resumes.
    assert kwargs["workdir"] == Path(".trainctl/local/cli-local-tiny") and kwargs["workdir"].is_dir()


def test_a_local_run_sends_no_metrics_to_the_teams_cloudwatch(corpus_dir, tmp_path, monkeypatch):
    # The rendered request names the platform's metrics namespace (a SageMaker job sends its lines there); the
    # emulated container drops it, even when the user's own shell sets it: a laptop's run must not write the team's
    # namespace (it did: "[metrics] could not send metrics to CloudWatch namespace TrainingPlatform/local").
    from cli.container_emulator import prepare_layout
    from contract.container import ENV_METRICS_NAMESPACE

    fake = FakeRunLocal()
    assert run_request_locally(load_request(DATA / "local-tiny.json"), workdir=None, nproc=1, data=None,
                               run_local=fake) == 0
    ((create, kwargs),) = fake.calls
    assert ENV_METRICS_NAMESPACE in create["Environment"]
    monkeypatch.setenv(ENV_METRICS_NAMESPACE, "TrainingPlatform/mine")
    _, env, _ = prepare_layout(create, tmp_path / "work", 1, kwargs["data_dirs"], None)
    assert ENV_METRICS_NAMESPACE not in env


def test_data_dir_with_splits(corpus_dir, tmp_path):
    other = tmp_path / "other"
    channel_folder(other / "train")
    channel_folder(other / "validation")
    fake = FakeRunLocal(code=3)
    loaded = load_request(DATA / "local-tiny.json")
    assert run_request_locally(loaded, workdir=tmp_path / "w", nproc=None, data=other, run_local=fake) == 3
    assert fake.calls[0][1]["data_dirs"] == {"train": other / "train", "validation": other / "validation"}
    assert fake.calls[0][1]["workdir"] == tmp_path / "w"


def test_data_dir_without_splits_is_the_train_channel(corpus_dir, tmp_path):
    flat = channel_folder(tmp_path / "flat")
    fake = FakeRunLocal()
    run_request_locally(load_request(DATA / "local-tiny.json"), workdir=tmp_path / "w", nproc=1, data=flat,
                        run_local=fake)
    assert fake.calls[0][1]["data_dirs"] == {"train": flat}


def test_missing_folders_are_user_errors(corpus_dir, tmp_path):
    fake = FakeRunLocal()
    loaded = load_request(DATA / "local-tiny.json")
    with pytest.raises(UserError, match="--data .*: no such directory"):
        run_request_locally(loaded, workdir=None, nproc=1, data=tmp_path / "nope", run_local=fake)
    shutil.rmtree(corpus_dir / "validation")
    with pytest.raises(UserError, match="the validation data folder corpus/validation does not exist"):
        run_request_locally(loaded, workdir=None, nproc=1, data=None, run_local=fake)
    assert fake.calls == []


def test_cli_reports_missing_data_with_exit_2(corpus_dir, tmp_path):
    result = run("local", DATA / "local-tiny.json", "--data", tmp_path / "nope")
    assert result.exit_code == 2 and "no such directory" in result.stderr and "Traceback" not in result.output
    result = run("local", DATA / "local-tiny.json", "--nproc", "0")
    assert result.exit_code == 2 and "--nproc" in result.stderr


def test_a_request_that_only_runs_on_sagemaker_still_renders_locally(corpus_dir, tmp_path):
    """An S3 dataset renders (SageMaker paths stay as they are); --data supplies the local copy."""
    fake = FakeRunLocal()
    run_request_locally(load_request(DATA / "spot-fallbacks.json"), workdir=tmp_path / "w", nproc=1,
                        data=corpus_dir, run_local=fake)
    create, kwargs = fake.calls[0]
    assert create["EnableManagedSpotTraining"] is True
    assert kwargs["data_dirs"] == {"train": corpus_dir / "train", "validation": corpus_dir / "validation"}


def test_a_channel_on_s3_without_local_data_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("local", DATA / "spot-fallbacks.json", "--workdir", tmp_path / "w")
    assert result.exit_code == 2, result.output
    assert "channel 'train' reads s3://" in result.stderr and "--data DIR" in result.stderr


@pytest.mark.slow
def test_local_runs_the_request_with_two_processes(corpus_dir, tmp_path, mlflow_server):
    """The real engine: torchrun, 2 gloo ranks, FSDP on the tiny GPT, checkpoints and a final model; its metrics in
    TensorBoard event files and in an MLflow run on a real tracking server (--mlflow)."""
    from prepare.corpus import prepare

    shutil.rmtree(corpus_dir)
    counts = prepare(corpus_dir, val_fraction=0.25, max_bytes=300_000, shard_bytes=200_000)
    assert counts["validation"] > 0
    workdir, since = tmp_path / "run", mlflow_server.mark()
    result = run("local", DATA / "local-tiny.json", "--nproc", "2", "--workdir", workdir, "--mlflow", mlflow_server.uri)
    assert result.exit_code == 0, result.output
    assert f"done at step 6: model in {workdir / 'model'}" in result.stdout
    records = [json.loads(line) for line in (workdir / "output/data/metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "train_loss" in r]
    assert max(steps) == 6
    assert any("val_loss" in r for r in records)
    assert (workdir / "model" / "model.safetensors").is_file()
    assert any((workdir / "checkpoints").iterdir())
    hyperparameters = json.loads((workdir / "input/config/hyperparameters.json").read_text())
    assert json.loads(hyperparameters["strategy"]) == "fsdp"
    # TensorBoard (the request's `tensorboard`, on by default): rank 0's event files in the work folder hold every
    # metric line's values at their steps.
    assert not (problems := tensorboard_problems(workdir / "output" / "tensorboard", records)), problems
    # The straggler check's metrics (every log interval, from the ranks' exchange) reach the metrics file and
    # TensorBoard like the others, and each rank's own step time is a TensorBoard chart of its own.
    assert not (problems := tensorboard_problems(workdir / "output" / "tensorboard", records,
                                                 names=("slowest_rank_ratio", "straggler_rank"))), problems
    assert not (problems := rank_problems(workdir / "output" / "tensorboard", records, world=2)), problems
    # MLflow: one run, found by the run's id and its work folder, holding every record's numbers at their steps, the
    # whole configuration as parameters, where it ran, and the exported model.
    check_run(mlflow_server, since, {WORKDIR_TAG: str(workdir.resolve())}, records,
              {"strategy": "fsdp", "max_steps": "6", "micro_batch_size": "2", "seq_len": "32",
               "request.name": "cli-local-tiny", "request.dataset": "./corpus/train"}, workdir / "model",
              instance_type="ml.c5.2xlarge")


def test_a_workdir_that_is_a_file_and_single_with_several_processes_are_refused(corpus_dir, tmp_path):
    fake = FakeRunLocal()
    loaded = load_request(DATA / "local-tiny.json")
    (tmp_path / "afile").write_text("")
    with pytest.raises(UserError, match="is a file, not a folder"):
        run_request_locally(loaded, workdir=tmp_path / "afile", nproc=1, data=None, run_local=fake)
    single = tmp_path / "single.json"
    single.write_text(json.dumps({**json.loads((DATA / "local-tiny.json").read_text()), "strategy": "single"}))
    with pytest.raises(UserError, match="--nproc 2 with strategy 'single'"):
        run_request_locally(load_request(single), workdir=tmp_path / "w", nproc=2, data=None, run_local=fake)
    assert fake.calls == []


def auto_request(tmp_path: Path) -> Path:
    """`strategy: auto` for gpt 7b on 4 x ml.p4d.24xlarge: the planner splits layers over 8 GPUs per node."""
    doc = {**json.loads((DATA / "local-tiny.json").read_text()), "name": "local-auto", "strategy": "auto",
           "model_size": "7b", "instance": {"type": "ml.p4d.24xlarge", "count": 4}}
    doc["hyperparameters"] = {**doc["hyperparameters"], "micro_batch_size": 8, "activation_checkpointing": True}
    path = tmp_path / "auto.json"
    path.write_text(json.dumps(doc))
    return path


def test_auto_is_checked_against_nproc_with_the_degrees_it_renders(corpus_dir, tmp_path):
    # The request's own `parallel` section is all 1s; the job runs the planner's degrees, sized for 32 GPUs.
    fake = FakeRunLocal()
    loaded = load_request(auto_request(tmp_path))
    with pytest.raises(UserError) as info:
        run_request_locally(loaded, workdir=tmp_path / "w", nproc=4, data=None, run_local=fake)
    assert fake.calls == []  # refused before any process starts
    message, hint = str(info.value), info.value.hint
    assert "strategy 'auto' resolves to " in message and "the planner's pick for 4 x ml.p4d.24xlarge" in message
    assert "cannot run on 4 local processes" in message and "does not divide" in message
    # The count the hint names runs: the same rendered degrees pass the check with it.
    needed = int(hint.split("--nproc ")[1].split(",")[0])
    assert run_request_locally(loaded, workdir=tmp_path / "w", nproc=needed, data=None, run_local=fake) == 0
    ((create, kwargs),) = fake.calls
    hp = {k: json.loads(v) for k, v in create["HyperParameters"].items()}
    assert hp["strategy"] in ("hsdp", "tp", "pp", "hybrid") and kwargs["nproc"] == needed
    assert needed == hp["tp_degree"] * hp["pp_degree"] * max(hp["dp_shard"], 1)


def test_an_explicit_strategy_is_checked_against_nproc_too(corpus_dir, tmp_path):
    doc = {**json.loads((DATA / "local-tiny.json").read_text()), "strategy": "tp",
           "parallel": {"tensor_parallel_degree": 2}}
    path = tmp_path / "tp.json"
    path.write_text(json.dumps(doc))
    fake = FakeRunLocal()
    with pytest.raises(UserError, match="parallel.tensor_parallel_degree: tensor 2 x pipeline 1 = 2 does not divide"):
        run_request_locally(load_request(path), workdir=tmp_path / "w", nproc=3, data=None, run_local=fake)
    assert run_request_locally(load_request(path), workdir=tmp_path / "w", nproc=2, data=None, run_local=fake) == 0


def test_a_global_batch_this_machine_cannot_split_is_refused_before_any_process(corpus_dir, tmp_path):
    """The training package would refuse it at startup (contract.hyperparameters.batch_layout): say so first."""
    doc = json.loads((DATA / "local-tiny.json").read_text())
    doc["hyperparameters"] = {**doc["hyperparameters"], "micro_batch_size": 2, "global_batch_size": 8}
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(doc))
    fake = FakeRunLocal()
    with pytest.raises(UserError, match=r"on 3 local processes, global_batch_size=8 is not a multiple .* = 2 x 3"):
        run_request_locally(load_request(path), workdir=tmp_path / "w", nproc=3, data=None, run_local=fake)
    assert fake.calls == []
    assert run_request_locally(load_request(path), workdir=tmp_path / "w", nproc=2, data=None, run_local=fake) == 0
