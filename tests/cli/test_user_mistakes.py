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

from cli.commands.version import DISTRIBUTION
from tests.cli.conftest import DATA, run

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
        (tmp_path / "copy" / split).mkdir(parents=True)
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

    prepared = _without_train("prepare.corpus", "--out", tmp_path / "corpus", "--max-bytes", "20000",
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
        (tmp_path / "corpus" / split).mkdir(parents=True)
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
    (tmp_path / "corpus" / "train").mkdir(parents=True)
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
