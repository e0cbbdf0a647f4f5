"""Mistakes a user makes on the command line end with one message (the option, the value, the fix), never a
traceback: each test below reproduces a report that used to end in one."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cli.commands.version import DISTRIBUTION, package_version
from jobs.request.field_rules import check_dataset
from tests.cli.conftest import DATA, channel_folder, run

REPO = Path(__file__).resolve().parents[2]


def _no_traceback(result) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_a_request_file_with_a_byte_order_mark_is_read(platform_file, tmp_path):
    """Notepad's UTF-8 starts with a BOM; json.loads refused it as 'Expecting value'."""
    request = tmp_path / "bom.json"
    request.write_bytes(b"\xef\xbb\xbf" + (DATA / "ddp.json").read_bytes())
    result = run("render", request, "--platform", platform_file)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["TrainingJobName"]


# ---- trainctl local: its data ---------------------------------------------------------------------------


def _local_request(tmp_path, **changes) -> Path:
    path = tmp_path / "request.json"
    path.write_text(json.dumps({**json.loads((DATA / "local-tiny.json").read_text()), **changes}))
    return path


class FakeRunLocal:
    """Stands in for cli.container_emulator.run_local: what trainctl hands over, no process started."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict, dict]] = []

    def __call__(self, create: dict, **kwargs) -> int:
        self.calls.append((create, kwargs))
        return 0


def test_data_that_is_a_file_says_a_folder_is_needed(tmp_path):
    shard = tmp_path / "shard-00000.bin"
    shard.write_bytes(b"\0\0")
    result = run("local", _local_request(tmp_path), "--data", shard, "--workdir", tmp_path / "w")
    _no_traceback(result)
    assert f"--data {shard}: is a file; --data takes a folder" in result.stderr
    assert f"--data {tmp_path}" in result.stderr  # the fix: the folder that holds it
    assert "no such directory" not in result.stderr


def test_an_fsx_dataset_locally_suggests_a_local_folder_and_runs_with_one(tmp_path, monkeypatch):
    """It suggested an s3:// dataset, which `local` refuses too; and --data did not get past the FSx check."""
    request = _local_request(tmp_path, dataset="fsx:/datasets/c4/train", validation_dataset="fsx:/datasets/c4/val")
    refused = run("local", request, "--workdir", tmp_path / "w")
    _no_traceback(refused)
    assert "dataset: `trainctl local` cannot mount FSx for Lustre: pass a local copy of the data with --data DIR" \
        in refused.stderr
    assert "s3://" not in refused.stderr

    for split in ("train", "validation"):
        channel_folder(tmp_path / "copy" / split)
    fake = FakeRunLocal()
    monkeypatch.setattr("cli.container_emulator.run_local", fake)
    result = run("local", request, "--data", tmp_path / "copy", "--nproc", "1", "--workdir", tmp_path / "w")
    assert result.exit_code == 0, result.output
    create, kwargs = fake.calls[0]
    assert kwargs["data_dirs"] == {"train": tmp_path / "copy" / "train", "validation": tmp_path / "copy" / "validation"}
    assert [c["DataSource"]["S3DataSource"]["S3Uri"] for c in create["InputDataConfig"]] == [
        (tmp_path / "copy" / split).as_uri() for split in ("train", "validation")]


# A Python without the `[train]` extra: importing torch or numpy fails as if they were not installed.
WITHOUT_TRAIN = """
import runpy, sys
class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "numpy"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Uninstalled())
sys.argv = sys.argv[1:]  # [module, its arguments...]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _without_train(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-c", WITHOUT_TRAIN, *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_local_without_torch_says_what_to_install_and_its_data_hint_works(tmp_path):
    """A `[cli]` install: the workers' ModuleNotFoundError came as a traceback, and the hint for the missing data
    folder (python -m prepare.corpus) failed without numpy."""
    local = _without_train("cli", "local", DATA / "local-tiny.json", "--workdir", tmp_path / "w", cwd=tmp_path)
    assert local.returncode == 2 and "Traceback" not in local.stderr, local.stderr
    assert "trainctl local runs the training package on this machine, and it needs torch, numpy" in local.stderr
    assert "pip install 'sagemaker-training-platform[train]'" in local.stderr
    assert not (tmp_path / "w").exists()

    prepared = _without_train("prepare.corpus", "--out", tmp_path / "corpus", "--max-bytes", "20000", "--val-fraction", "0.5",
                              "--shard-bytes", "10000", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    assert json.loads((tmp_path / "corpus" / "train" / "meta.json").read_text())["dtype"] == "uint16"


def test_a_worker_killed_by_sigkill_is_reported_as_such(tmp_path, monkeypatch):
    """The real torchrun, one worker that the kernel's OOM killer would kill: it was reported as 'exited with
    status 1'."""
    import cli.container_emulator

    killer = tmp_path / "oom.py"
    killer.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    launch = cli.container_emulator._launch_command
    monkeypatch.setattr(cli.container_emulator, "_launch_command",
                        lambda hps, entry, nproc, log_dir, instance=None: launch(hps, str(killer), nproc, log_dir))
    for split in ("train", "validation"):
        channel_folder(tmp_path / "corpus" / split)
    result = run("local", _local_request(tmp_path), "--nproc", "1", "--data", tmp_path / "corpus",
                 "--workdir", tmp_path / "w", env={"COLUMNS": "300"})
    assert result.exit_code == 128 + signal.SIGKILL, result.output
    assert "a process of the run was killed by SIGKILL (status 137)" in result.stdout
    assert "SIGKILL usually means this machine ran out of memory" in result.stdout
    assert "exited with status 1" not in result.output


def test_nproc_above_the_cpus_needs_oversubscribe(tmp_path, monkeypatch):
    """--nproc 1000 started some 200 workers and took 14 GB before anything failed."""
    monkeypatch.setattr("cli.container_emulator._gpu_count", lambda: 0)  # a CPU machine, without importing torch for it
    cpus = len(os.sched_getaffinity(0))
    fake = FakeRunLocal()
    monkeypatch.setattr("cli.container_emulator.run_local", fake)
    channel_folder(tmp_path / "corpus" / "train")
    args = ("local", _local_request(tmp_path), "--nproc", "1000", "--data", tmp_path / "corpus",
            "--workdir", tmp_path / "w")
    refused = run(*args)
    _no_traceback(refused)
    assert f"--nproc 1000: this machine has {cpus} CPUs" in refused.stderr
    assert f"pass --nproc {cpus} or fewer, or add --oversubscribe to start 1000 anyway" in refused.stderr
    assert fake.calls == []

    assert run(*args, "--oversubscribe").exit_code == 0
    assert fake.calls[0][1]["nproc"] == 1000


# ---- --chart ---------------------------------------------------------------------------------------------


def test_plan_chart_in_a_folder_that_cannot_be_made_or_of_another_format(platform_file, tmp_path):
    """matplotlib refused both after the plan was computed, as tracebacks (FileNotFoundError, ValueError)."""
    (tmp_path / "notes").write_text("")
    for chart, message, fix in [
        (tmp_path / "notes" / "dir" / "x.png", f"--chart {tmp_path / 'notes' / 'dir' / 'x.png'}: "
                                               f"{tmp_path / 'notes'} is a file, not a folder", "e.g. --chart "),
        (Path("out.txt"), "--chart out.txt: the file name must end in .png, .svg, .pdf", "e.g. --chart out.png"),
    ]:
        result = run("plan", DATA / "ddp.json", "--platform", platform_file, "--prices", "none", "--chart", chart)
        _no_traceback(result)
        assert message in result.stderr and fix in result.stderr


# ---- render --instance-type --------------------------------------------------------------------------------


def test_render_on_an_instance_type_the_strategy_cannot_use(platform_file):
    """An smp request rendered for a CPU type: the renderer looked up a CPU SMP image, KeyError: 'cpu'."""
    result = run("render", DATA / "smp.json", "--platform", platform_file, "--instance-type", "ml.m5.xlarge")
    _no_traceback(result)
    assert "--instance-type ml.m5.xlarge: the request cannot run on it" in result.stderr
    assert "smp needs NVIDIA GPU instances" in result.stderr
    assert "pick a type the request runs on, e.g. its own: " in result.stderr
    assert result.stdout == ""


# ---- help and --version ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "flags"), [
    ("plan", ["--json"]), ("status", ["--json"]), ("runs", ["--json"]), ("show", ["--json"]),
    ("submit", ["--wait"]), ("resume", ["--wait"]), ("logs", ["--follow"]), ("render", ["--on-demand"]),
])
def test_help_shows_flags_without_a_value(command, flags):
    """Help said `--json <bool>`, and `--json true` is an error."""
    result = run(command, "--help", env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    for name in flags:
        line = next(line for line in result.stdout.splitlines() if f" {name} " in line)
        assert "<bool>" not in line, line


def test_version_is_the_projects(monkeypatch):
    """There was no --version."""
    result = run("--version")  # the installed metadata's (pip wrote pyproject.toml's version there)
    assert result.exit_code == 0 and result.stdout == f"trainctl {importlib.metadata.version(DISTRIBUTION)}\n"
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)  # a checkout run with python -m cli
    assert run("--version").stdout == f"trainctl {declared}\n"


# Issue 32: a new user's day, from a fresh clone.

@pytest.mark.parametrize("text", ["", "\n", "  \n\t\n", "\ufeff"], ids=["empty", "newline", "blanks", "bom-only"])
def test_an_empty_request_file_is_said_to_be_empty(tmp_path, platform_file, text):
    # Was: "not valid JSON: line 1 column 1: Expecting value".
    path = tmp_path / "request.json"
    path.write_text(text, encoding="utf-8")
    result = run("render", path, "--platform", platform_file)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{path} is empty: a job request is a JSON object" in result.stderr
    assert "Expecting value" not in result.stderr and "examples/" in result.stderr


@pytest.mark.parametrize(("uri", "length"), [("s3://b/p/", 1), ("s3://ab/p/", 2), (f"s3://{'a' * 64}/p/", 64)])
def test_a_bucket_name_of_the_wrong_length_is_named_as_such(uri, length):
    # Was: "'s3://b/p/' is not a valid S3 URI (s3://bucket/prefix/)", of a URI of exactly that form.
    problem = check_dataset(uri)
    assert problem and f"has {length} characters; S3 bucket names have 3 to 63" in problem
    assert "not a valid S3 URI" not in problem


def test_trainctl_version_as_a_command_prints_the_version():
    # Was: "No such command 'version'." (only --version worked).
    result = run("version")
    assert result.exit_code == 0 and result.stdout.strip() == f"trainctl {package_version()}"
    assert run("--version").stdout == result.stdout


@pytest.mark.parametrize(("value", "kind"), [("123", "a number"), ("null", "null"), ('["a"]', "an array"),
                                             ('{"t": 1}', "an object"), ("true", "a boolean")])
def test_a_text_field_that_is_not_a_string_is_said_to_hold_what_it_holds(tmp_path, value, kind):
    # Was: "has no string field 'text' (its keys are ['text'])": the key named as missing while listed.
    from prepare.text import PrepareError, _jsonl

    path = tmp_path / "c.jsonl"
    path.write_text(f'{{"text": "fine"}}\n{{"text": {value}}}\n')
    with pytest.raises(PrepareError) as info:
        list(_jsonl(path, "text"))
    assert f"{path}:2: field 'text' holds {kind}" in str(info.value) and "its keys are" not in str(info.value)


@pytest.mark.parametrize(("ended", "checkpointed", "code", "says"), [
    ("completed", True, 0, "done at step 5"),
    ("stopped", True, 3, "stopped at step 5 with a checkpoint in"),
    # Ctrl-C just after the start: no checkpoint yet. Was: "stopped at step 0 with a checkpoint in ..." (empty).
    ("stopped", False, 3, "stopped at step 5, before any checkpoint was written: nothing to resume"),
], ids=["completed", "stopped", "stopped-before-any-checkpoint"])
def test_a_local_run_s_exit_status_says_stopped_or_completed(tmp_path, monkeypatch, ended, checkpointed, code, says):
    # Was: 0 both when stopped and when completed, so `trainctl local r.json && next` went on after a Ctrl-C.
    import json

    import cli.container_emulator
    from cli.commands.local import EXIT_STOPPED
    from contract.container import CHECKPOINT_MARKER, STATUS_FILE

    def run_local(create: dict, *, workdir, **_: object) -> int:
        (workdir / "output" / "data").mkdir(parents=True, exist_ok=True)
        (workdir / "output" / "data" / STATUS_FILE).write_text(json.dumps({"status": ended, "step": 5}))
        (workdir / "checkpoints" / "step-4").mkdir(parents=True)
        if checkpointed:
            (workdir / "checkpoints" / "step-4" / CHECKPOINT_MARKER).write_text("{}")
        return 0

    monkeypatch.chdir(tmp_path)
    for split in ("train", "validation"):
        channel_folder(tmp_path / "corpus" / split)
    monkeypatch.setattr(cli.container_emulator, "run_local", run_local)
    result = run("local", DATA / "local-tiny.json", "--workdir", tmp_path / "w")
    assert result.exit_code == code and (code != 3 or code == EXIT_STOPPED)
    assert says in " ".join(result.stdout.split())


def test_an_existing_workdir_the_run_cannot_write_in_is_refused_up_front(tmp_path, monkeypatch):
    # /proc/self: a system folder that exists and takes no new files, even as root (a read-only mount behaves
    # alike). Was: a PermissionError/FileNotFoundError traceback from deep in the checkpoint epoch's lock file.

    monkeypatch.chdir(tmp_path)
    for split in ("train", "validation"):
        channel_folder(tmp_path / "corpus" / split)
    result = run("local", DATA / "local-tiny.json", "--workdir", "/proc/self", "--nproc", "1")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--workdir /proc/self: cannot write in it" in result.stderr and "pass another --workdir" in result.stderr


def test_data_without_a_validation_folder_does_not_validate_on_the_request_s_own_set(tmp_path, monkeypatch, capsys):
    # --data DIR with no validation/: DIR is the train channel. Was: the request's validation_dataset (another
    # corpus, other tokens) still rendered and read, a meaningless validation loss without a word.
    from cli.commands.local import run_request_locally
    from cli.request_file import load_request

    monkeypatch.chdir(tmp_path)
    for split in ("train", "validation"):
        channel_folder(tmp_path / "corpus" / split)
    flat = channel_folder(tmp_path / "flat")
    fake = FakeRunLocal()
    run_request_locally(load_request(DATA / "local-tiny.json"), workdir=tmp_path / "w", nproc=1, data=flat,
                        run_local=fake)
    ((create, kwargs),) = fake.calls
    assert [c["ChannelName"] for c in create["InputDataConfig"]] == ["train"]
    assert kwargs["data_dirs"] == {"train": flat}
    said = " ".join(capsys.readouterr().out.split())
    assert f"[local] --data {flat} has no validation/ folder: this run validates on nothing" in said


def test_the_second_interrupt_kills_the_run_and_is_not_blamed_on_memory(tmp_path):
    # The documented "signal again to kill": the emulator's own SIGKILL. Was: "killed by SIGKILL ... usually means
    # this machine ran out of memory".
    import os
    import signal
    import subprocess
    import threading

    from cli.commands.local import local_outcome
    from cli.container_emulator import KILLED_ON_SECOND_SIGNAL, _wait_stopping_on_signal

    procs = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in range(2)]
    stopped = []
    timers = [threading.Timer(t, os.kill, (os.getpid(), signal.SIGINT)) for t in (0.3, 0.6)]
    for t in timers:
        t.start()
    codes, killed = _wait_stopping_on_signal(procs, lambda: stopped.append(True))
    assert stopped == [True] and killed and codes == [-signal.SIGKILL] * 2
    said = local_outcome(KILLED_ON_SECOND_SIGNAL, tmp_path, since=0.0)
    assert "killed at your second interrupt" in said and "memory" not in said


def test_ctrl_c_while_preparing_text_leaves_the_output_as_it_was(tmp_path, monkeypatch, capsys):
    # Was: a KeyboardInterrupt traceback and a half-written train/ (its old shards already deleted).
    import prepare.text as text
    from tests.training.formats import documents, train_tokenizer, write_jsonl

    docs = documents(60)
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", docs)
    write_jsonl(tmp_path / "a.jsonl", docs)
    write_jsonl(tmp_path / "b.jsonl", docs)
    out = tmp_path / "tokens"
    assert text.main([str(tmp_path / "a.jsonl"), "--tokenizer", str(tokenizer), "--out", str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    said = capsys.readouterr().err
    assert f"[prepare] {tmp_path / 'a.jsonl'} (1 of 1, 0 of 0 MiB read)" in said  # progress, on stderr

    real = text.read_documents

    def interrupted(path, field):
        if path.name == "b.jsonl":  # the second file: the first one's shards are being written
            raise KeyboardInterrupt
        yield from real(path, field)

    monkeypatch.setattr(text, "read_documents", interrupted)
    monkeypatch.setattr(text, "ENCODE_BATCH", 7)  # several encode batches, so shards are on disk when it stops
    assert text.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--tokenizer", str(tokenizer),
                      "--out", str(out), "--shard-tokens", "50"]) == 130
    assert f"interrupted: {out} is as it was" in capsys.readouterr().err
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before and not list(out.glob(".*.partial"))


def test_ctrl_c_while_preparing_images_leaves_the_output_as_it_was(tmp_path, monkeypatch, capsys):
    import prepare.images as images
    from tests.training.formats import write_imagefolder

    write_imagefolder(tmp_path / "folder")
    out = tmp_path / "shards"
    args = ["--imagefolder", str(tmp_path / "folder"), "--out", str(out), "--image-size", "16", "--shard-samples", "5",
            "--val-fraction", "0.25"]
    assert images.main(args) == 0
    assert "[prepare] train: shard 1 of" in capsys.readouterr().err
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real, calls = images.write_shards, []

    def stopped_in_validation(samples, folder, shard_samples, on_shard=None):
        calls.append(folder)
        if len(calls) == 2:  # train written in full, validation under way
            raise KeyboardInterrupt
        return real(samples, folder, shard_samples, on_shard)

    monkeypatch.setattr(images, "write_shards", stopped_in_validation)
    assert images.main([*args, "--seed", "1"]) == 130
    assert f"interrupted: {out} is as it was" in capsys.readouterr().err
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not list(out.glob(".*.partial"))


@pytest.mark.parametrize(("files", "says"), [
    (["a.jsonl", "b.jsonl"], "holds raw text (.jsonl): tokenize it into a channel first: python -m prepare.text"),
    (["t.parquet"], "holds raw text (.parquet): tokenize it into a channel first: python -m prepare.text"),
    (["00000.tar", "00001.tar"], "holds tar shards but no meta.json"),
    (["cat/1.jpg", "dog/2.jpg"], "looks like images (or an ImageFolder tree of class folders): make tar shards"),
    ([], "write the channel with python -m prepare.corpus"),
], ids=["jsonl", "parquet", "tar-without-meta", "imagefolder", "empty"])
def test_data_that_is_not_a_channel_is_refused_before_anything_starts_with_its_preparer(tmp_path, monkeypatch,
                                                                                          files, says):
    # Was: the job's refusal after ~15 s of start-up, naming the work folder's link (work/input/data/train) and
    # always the token preparer ("write the channel with python -m prepare.corpus (tokens)").
    monkeypatch.chdir(tmp_path)
    for name in files:
        (tmp_path / "mine" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "mine" / name).write_bytes(b"x")
    (tmp_path / "mine").mkdir(exist_ok=True)
    fake = FakeRunLocal()
    monkeypatch.setattr("cli.container_emulator.run_local", fake)
    result = run("local", _local_request(tmp_path), "--data", "mine", "--nproc", "1", "--workdir", tmp_path / "w",
                 env={"COLUMNS": "300"})
    _no_traceback(result)
    said = " ".join(result.stderr.split())
    assert f"the train data folder mine (relative to the current folder, {tmp_path}) is not a channel: it has no " \
           "meta.json" in said
    assert says in said and "input/data" not in said and fake.calls == []


def test_the_job_itself_names_the_preparer_its_channel_calls_for(tmp_path):
    # In the container (SageMaker, or a channel trainctl local did not check): the same advice by the files.
    from training.data.datasets import read_meta
    from training.environment import DataMissing

    (tmp_path / "docs.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(DataMissing, match=r"has no meta.json: .* holds raw text \(.jsonl\): tokenize it"):
        read_meta(tmp_path)


def test_a_checkpoint_folder_fix_is_one_its_user_can_apply(tmp_path):
    # Was "point checkpoint_dir at ..." everywhere, where trainctl local's request refuses checkpoint_dir: the local
    # user's knob is --workdir, a SageMaker run's folder is the platform's.
    from cli.container_emulator import prepare_layout
    from contract.container import ENV_HOSTS, ENV_LOCAL_WORKDIR
    from tests.training.helpers import LOCAL_HPS, create_request
    from training.environment import checkpoint_folder_fix

    data = {"train": channel_folder(tmp_path / "d" / "train"), "validation": channel_folder(tmp_path / "d" / "v")}
    _, env, _ = prepare_layout(create_request(LOCAL_HPS), tmp_path / "w", 1, data, None)
    assert env[ENV_LOCAL_WORKDIR] == str((tmp_path / "w").resolve())
    local = checkpoint_folder_fix("an empty folder", env)
    assert local.startswith("run trainctl local with another --workdir for an empty folder") and "checkpoint_dir" not in local
    sagemaker = checkpoint_folder_fix("an empty folder", {ENV_HOSTS: '["algo-1"]'})
    assert "trainctl submit" in sagemaker and "checkpoint_dir" not in sagemaker
    assert checkpoint_folder_fix("an empty folder", {}) == "point checkpoint_dir at an empty folder"


def test_the_local_progress_bar_shows_step_loss_throughput_and_eta(tmp_path):
    # Was: "[#####.....] 40/120" alone.
    from contract.metrics import TOKENS_PER_SEC, TRAIN_LOSS
    from training.metrics.logger import MetricsLogger

    logger = MetricsLogger(tmp_path, enabled=True, total_steps=120)
    assert logger.progress_line(10, now=100.0) == f"[##{'.' * 28}] 10/120"  # nothing logged, no pace yet
    logger.log({TRAIN_LOSS: 3.25, TOKENS_PER_SEC: 12345.6})
    # 30 steps in 60 s: 2 s a step, 80 steps left.
    assert logger.progress_line(40, now=160.0) == f"[##########{'.' * 20}] 40/120  loss 3.2500  12,346 tokens/s  ETA 2:40"


def test_own_text_needs_no_tokenizer_of_one_s_own(tmp_path, monkeypatch, capsys):
    # Was: --tokenizer required, and no tokenizer shipped: a newcomer had to train one first. The shipped one is
    # built on first use from Python's standard library, the same bytes on every build.
    import prepare.text as text
    from prepare.tokenizer import VOCAB_SIZE, default_path, default_tokenizer
    from tests.training.formats import documents, write_jsonl

    builds = []
    for cache in ("a", "b"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / cache))
        builds.append(default_tokenizer(budget=400_000).read_bytes())
    assert builds[0] == builds[1]
    write_jsonl(tmp_path / "mine.jsonl", documents(40))
    assert text.main([str(tmp_path / "mine.jsonl"), "--out", str(tmp_path / "tokens")]) == 0  # the cached one
    meta = json.loads((tmp_path / "tokens" / "train" / "meta.json").read_text())
    assert meta["vocab_size"] == VOCAB_SIZE and meta["tokenizer"]["file"] == default_path().name
    assert meta["tokenizer"]["eos_token"] == "<|endoftext|>"


def test_an_empty_split_is_refused_before_anything_starts(tmp_path, monkeypatch):
    # prepare.corpus with a small --max-bytes wrote a validation split of no file (it refuses now); the job said so
    # only after its start-up, naming the work folder's link ("w/input/data/validation holds no *.bin token shards").
    import prepare.corpus

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="too few for a validation split"):
        prepare.corpus.prepare(tmp_path / "small", max_bytes=300_000)
    assert not (tmp_path / "small").exists()
    channel_folder(tmp_path / "data" / "train")
    channel_folder(tmp_path / "data" / "validation", shards=False)
    fake = FakeRunLocal()
    monkeypatch.setattr("cli.container_emulator.run_local", fake)
    result = run("local", _local_request(tmp_path), "--data", tmp_path / "data", "--nproc", "1", "--workdir",
                 tmp_path / "w", env={"COLUMNS": "300"})
    _no_traceback(result)
    assert f"the validation data folder {tmp_path / 'data' / 'validation'} has a meta.json but no *.bin files: an " \
           "empty split" in " ".join(result.stderr.split())
    assert fake.calls == []
