"""sourcedir.tar.gz: deterministic bytes, the layout the container expects, nothing compiled."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tarfile
import time

from bundles import sourcedir as packaging


def test_same_content_gives_the_same_bytes(tmp_path):
    first = packaging.build_sourcedir(tmp_path / "a")
    # Touch every source file and add bytecode: neither may change the archive.
    for path in packaging.source_files().values():
        os.utime(path, (time.time() + 5, time.time() + 5))
    for package in packaging.PACKAGES:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(packaging.ROOT / package)], check=True)
    second = packaging.build_sourcedir(tmp_path / "b")
    assert first.name == "sourcedir.tar.gz"
    assert first.read_bytes() == second.read_bytes()
    mtime = second.stat().st_mtime_ns
    assert packaging.build_sourcedir(tmp_path / "b") == second and second.stat().st_mtime_ns == mtime


def test_layout_train_py_at_the_root_next_to_the_package(tmp_path):
    archive = packaging.build_sourcedir(tmp_path)
    assert gzip.decompress(archive.read_bytes())  # valid gzip; its header has no name and mtime 0
    assert archive.read_bytes()[4:8] == b"\0\0\0\0"
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert "train.py" in names and "training/train.py" in names and "training/config.py" in names
    assert "training/parallel/strategies/fsdp.py" in names and "training/models/gpt.py" in names
    assert "contract/hyperparameters.py" in names and not [n for n in names if n.startswith(("jobs/", "cli/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert "requirements.txt" not in names
    assert {(m.mtime, m.uid, m.gid, m.mode, m.uname) for m in members} == {(0, 0, 0, 0o644, "")}


def test_root_train_py_runs_from_the_unpacked_archive(tmp_path):
    with tarfile.open(packaging.build_sourcedir(tmp_path)) as tar:
        tar.extractall(tmp_path / "code", filter="data")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "train.py", "--max_step", "1"], cwd=tmp_path / "code", env=env,
                            capture_output=True, text=True, timeout=120)
    # Imports resolved from /opt/ml/code's layout; a user mistake is one line, not a traceback.
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == ("error: unknown hyperparameter 'max_step' (did you mean 'max_steps'?); "
                                     "accepted: " + result.stderr.split("accepted: ", 1)[1].strip())
