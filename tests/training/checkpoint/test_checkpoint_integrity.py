"""Checkpoints that never go bad (training.checkpoint): non-finite steps are never saved, checksums catch a
changed byte, a bad step falls back to the previous one, and a folder that cannot take a save fails first."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter

from contract.failures import FailureCode, parse_failure_line
from jobs.retry.classify import Category, Response, classify_description
from tests.training.helpers import config, free_port, max_diff, start_ranks, weights
from training.checkpoint import state as training_state
from training.checkpoint.disk import SPACE_EXTRA_BYTES, SPACE_MARGIN
from training.checkpoint.manager import CheckpointManager
from training.checkpoint.markers import MARKER, file_checksum, read_checkpoint, share, step_dirs
from training.loop import train
from training.metrics.meter import StepMeter
from training.parallel.process_group import Dist, setup, teardown
from training.precision import Precision
from training.resilience.outcome import TrainingFailure
from training.resilience.stop import StopFlag

WRITTEN = dict(max_steps=6, checkpoint_interval=2, keep_checkpoints=5)  # step-2, step-4, step-6


def nan_after_3(cfg, data_meta: dict):
    """A bring-your-own model whose logits turn NaN from its 4th training step on (a run diverging mid-way)."""
    vocab = int(data_meta.get("vocab_size", 256))

    class Diverging(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.out = nn.Embedding(vocab, 8), nn.Linear(8, vocab)
            self.steps = 0

        def forward(self, x):
            self.steps += self.training
            logits = self.out(self.emb(x))
            return logits * float("nan") if self.steps > 3 else logits

    return Diverging()


def run(cfg, stop_at: int | None = None):
    return train(cfg, setup(cfg), StopFlag(), stop_at=stop_at)


def flip_byte(path: Path) -> None:
    """One byte inverted in the middle of a file (inside the tensor data), its size unchanged."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def failure(cfg) -> TrainingFailure:
    with pytest.raises(TrainingFailure) as failed:
        run(cfg)
    return failed.value


@pytest.fixture(scope="module")
def written(tmp_path_factory, corpus) -> Path:
    """A tiny run's checkpoint folder: step-2, step-4 and step-6, each marker with checksums."""
    root = tmp_path_factory.mktemp("written")
    run(config(root, corpus, **WRITTEN))
    return root / "checkpoints"


def copy_of(written: Path, tmp_path: Path) -> Path:
    shutil.copytree(written, tmp_path / "checkpoints")
    return tmp_path / "checkpoints"


# ---- non-finite steps ---------------------------------------------------------------------------------
@pytest.mark.parametrize("keep, stop_at, kept", [(1, None, ["step-3"]), (2, None, ["step-3", "step-2"]),
                                                 (1, 5, ["step-3"])])
def test_a_nonfinite_step_below_patience_is_never_saved_and_the_last_finite_one_stays(
        tmp_path, corpus, capsys, keep, stop_at, kept):
    cfg = config(tmp_path, corpus, model="tests.training.checkpoint.test_checkpoint_integrity:nan_after_3", max_steps=6,
                 checkpoint_interval=1, keep_checkpoints=keep, nonfinite_patience=10)
    result = run(cfg, stop_at=stop_at)
    out = capsys.readouterr().out
    assert result.status == ("stopped" if stop_at else "completed")
    assert [p.name for _, p in step_dirs(tmp_path / "checkpoints")] == kept
    last = read_checkpoint(tmp_path / "checkpoints" / "step-3")["model"]
    assert all(torch.isfinite(t).all() for t in last.values())
    assert "step-4 not saved: the loss or gradient norm is NaN/Inf there (1 step(s) in a row" in out
    assert f"step-{result.step} not saved" in out and "the newest checkpoint stays step-3" in out


def test_an_fp16_step_with_an_inf_gradient_and_a_finite_loss_may_be_saved():
    """The scaler skips such a step on purpose: only the loss counts (count_grad_norm=False)."""
    dist = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    meter = StepMeter(dist, Precision(torch.float16), 1, 10, 4, 16, "tokens", None, nonfinite_patience=3,
                      count_grad_norm=False)
    meter.add(torch.tensor(2.0), torch.tensor(float("inf")))
    assert meter.raise_if_nonfinite(1) == 0
    meter.add(torch.tensor(float("nan")), torch.tensor(1.0))
    assert meter.raise_if_nonfinite(2) == 1


# ---- checksums and fallback ---------------------------------------------------------------------------
def test_markers_hold_a_checksum_per_file(written):
    marker = json.loads((written / "step-6" / MARKER).read_text())
    assert marker["checksum"] == "crc32"
    assert set(marker["checksums"]) == set(marker["files"]) == {".metadata", "__0_0.distcp"}
    assert all(file_checksum(written / "step-6" / name) == crc for name, crc in marker["checksums"].items())


def test_a_flipped_byte_is_refused_and_the_previous_step_resumes_with_its_weights(written, tmp_path, corpus, capsys):
    checkpoints = copy_of(written, tmp_path)
    flip_byte(checkpoints / "step-6" / "__0_0.distcp")
    result = run(config(tmp_path, corpus, **{**WRITTEN, "max_steps": 4}))  # resumed at step 4: nothing to train
    out = capsys.readouterr().out
    assert result.step == 4
    assert re.search(r"\[checkpoint\] step-6 failed verification \(__0_0\.distcp: crc32 [0-9a-f]{8} on disk, the "
                     r"marker says [0-9a-f]{8}\): resuming from step-4", out)
    assert "checksums verified" in out
    step_4 = read_checkpoint(checkpoints / "step-4")["model"]
    exported = weights(tmp_path)
    assert max_diff({k: exported[k] for k in step_4}, step_4) == 0


def test_a_damaged_step_without_a_fallback_fails_naming_the_file(written, tmp_path, corpus):
    checkpoints = copy_of(written, tmp_path)
    for name in ("step-4", "step-6"):
        shutil.rmtree(checkpoints / name)
    flip_byte(checkpoints / "step-2" / "__0_0.distcp")
    failed = failure(config(tmp_path, corpus, **WRITTEN))
    assert failed.code is FailureCode.CHECKPOINT_UNREADABLE
    assert "step-2 failed verification (__0_0.distcp: crc32" in str(failed) and "intact copy" in str(failed)


def test_an_old_marker_without_checksums_is_resumed_on_its_sizes(written, tmp_path, corpus, capsys):
    checkpoints = copy_of(written, tmp_path)
    marker = checkpoints / "step-6" / MARKER
    old = json.loads(marker.read_text())
    marker.write_text(json.dumps({"step": old["step"], "files": old["files"]}))
    assert run(config(tmp_path, corpus, **WRITTEN)).step == 6
    assert "at step 6 (sizes checked: its marker has no checksums)" in capsys.readouterr().out


def test_a_step_that_fails_to_load_midway_falls_back_and_every_part_is_overwritten(
        written, tmp_path, corpus, capsys, monkeypatch):
    """The rng part loads last: when it fails, step-6's model, optimizer, scheduler, data position and loop
    are already in place. Resuming step-4 over them must train exactly as a clean resume of step-4 does."""
    clean = copy_of(written, tmp_path / "clean")
    shutil.rmtree(clean / "step-6")
    run(config(tmp_path / "clean", corpus, **{**WRITTEN, "max_steps": 8}))

    copy_of(written, tmp_path / "fallback")
    loaded_steps = []
    real_load = training_state.RngState.load_state_dict

    def fail_once(self, state):
        loaded_steps.append(self.loop.step)
        if len(loaded_steps) == 1:
            raise RuntimeError("injected: the rng blob is unreadable")
        real_load(self, state)

    monkeypatch.setattr(training_state.RngState, "load_state_dict", fail_once)
    capsys.readouterr()
    run(config(tmp_path / "fallback", corpus, **{**WRITTEN, "max_steps": 8}))
    assert loaded_steps == [6, 4]  # the first try had step-6's loop part in place when it failed
    assert "step-6 failed to load (RuntimeError: injected: the rng blob is unreadable): resuming from step-4" \
        in capsys.readouterr().out
    assert max_diff(weights(tmp_path / "fallback"), weights(tmp_path / "clean")) == 0


def test_a_checkpoint_of_another_shape_fails_with_torchs_cause_naming_the_tensor(written, tmp_path, corpus):
    # Markers without a fingerprint (written before them), so the load itself meets the other shape: a marker
    # with one is refused before loading (test_checkpoint_owner).
    for step in copy_of(written, tmp_path).iterdir():
        marker = json.loads((step / MARKER).read_text())
        del marker["fingerprint"]
        (step / MARKER).write_text(json.dumps(marker))
    failed = failure(config(tmp_path, corpus, **{**WRITTEN, "model_size": "small"}))
    assert failed.code is FailureCode.CHECKPOINT_UNREADABLE
    message = parse_failure_line(failed.line)[1]
    assert re.search(r"step-6 failed to load \(ValueError: Size mismatch between saved torch\.Size\(\[\d+, \d+\]\) "
                     r"and current: torch\.Size\(\[\d+, \d+\]\) for model\.\S+\); step-4 likewise; step-2 likewise",
                     message)
    assert message.count("Size mismatch") == 1 and "settings it was written with" in message


# ---- a folder that cannot take a save -----------------------------------------------------------------
def test_a_folder_root_cannot_write_fails_before_the_first_step(tmp_path, corpus, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    for folder in (tmp_path / "a-file" / "checkpoints", Path("/proc")):  # /proc: os.access says writable
        failed = failure(config(tmp_path, corpus, checkpoint_dir=str(folder)))
        assert failed.code is FailureCode.CHECKPOINT_UNWRITABLE
        assert f"the checkpoint folder {folder} is not writable (" in str(failed)
        assert "point checkpoint_dir at a folder this job can write" in str(failed)
    assert "[metrics]" not in capsys.readouterr().out and not (tmp_path / "model").exists()


def test_too_little_free_space_fails_before_the_first_step_naming_free_and_needed(
        written, tmp_path, corpus, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=10 << 30, used=10 << 30, free=4096))
    failed = failure(config(tmp_path, corpus))
    assert failed.code is FailureCode.CHECKPOINT_UNWRITABLE
    assert f"the checkpoint folder {tmp_path / 'checkpoints'} has 4.0 KiB free (4096 bytes)" in str(failed)
    assert "instance.volume_gb" in str(failed) and not (tmp_path / "model").exists()
    # Before any checkpoint, the estimate is the model's and AdamW's tensors that a save really writes.
    needed = int(re.search(r"needs about .*? \((\d+) bytes: the model's tensors", str(failed)).group(1))
    saved = read_checkpoint(written / "step-6")
    tensors = sum(t.numel() * t.element_size() for part in ("model", "optim") for t in saved[part].values()
                  if isinstance(t, torch.Tensor))
    assert abs((needed - SPACE_EXTRA_BYTES) / SPACE_MARGIN - tensors) <= 0.01 * tensors


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP's, from the async save's thread
@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("error", ["oserror", "torch_writer", "torch_writer_bare"])
def test_a_disk_full_during_a_save_is_one_line_naming_enospc_and_the_folder(
        tmp_path, corpus, monkeypatch, asynchronous, error):
    def full(self, plan, planner):
        if error == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device")
        if error == "torch_writer_bare":  # no errno anywhere: the folder's free space tells
            raise RuntimeError("[enforce fail at inline_container.cc:593] . PytorchStreamWriter failed writing file "
                               "data/0: file write failed")
        try:  # torch's C++ writer: its own text, the OSError only in the context (pytorch issue 76108)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0") from None

    def usage(path):  # room at the start, none by the first save
        usage.calls += 1
        return SimpleNamespace(total=10 << 30, used=0, free=(10 << 30) if usage.calls == 1 else 0)

    usage.calls = 0
    monkeypatch.setattr(shutil, "disk_usage", usage)
    monkeypatch.setattr(FileSystemWriter, "write_data", full)
    failed = failure(config(tmp_path, corpus, checkpoint_interval=2, async_checkpoint=asynchronous))
    assert failed.code is FailureCode.CHECKPOINT_UNWRITABLE
    assert (f"no space left on device (ENOSPC) while writing checkpoint step-2 in {tmp_path / 'checkpoints'}"
            in str(failed))
    # The launcher reads it as the user's to fix (a larger volume), not a retry.
    job = {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed", "FailureReason": f"AlgorithmError: {failed.line}"}
    verdict = classify_description(job)
    assert verdict.category is Category.USER_ERROR and verdict.action is Response.FAIL
    assert "checkpoint_unwritable" in verdict.reason


def _remount_read_only(folder: Path) -> bool:
    """Make `folder`, a tmpfs mounted by the test, read-only as the kernel does after a disk error; False where
    this machine does not let the test mount (not root, or a sandbox without the capability)."""
    return subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True).returncode == 0


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP's, from the async save's thread
@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_folder_that_turns_read_only_mid_run_is_one_line_naming_it(tmp_path, corpus, monkeypatch, asynchronous):
    """The volume remounted read-only after step-2's save (a disk error): the next save ended in a traceback. Where
    the test may mount a tmpfs it remounts it read-only for real; elsewhere the writer fails as it would (EROFS)."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0
    saves = []
    real_save = CheckpointManager.save

    def save(self, step, nonfinite=0):
        saves.append(step)
        if len(saves) == 2 and not (mounted and _remount_read_only(folder)):
            def read_only(writer, plan, planner):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(folder / f"step-{step}" / "__0_0.distcp"))

            monkeypatch.setattr(FileSystemWriter, "write_data", read_only)
        return real_save(self, step, nonfinite)

    monkeypatch.setattr(CheckpointManager, "save", save)
    try:
        failed = failure(config(tmp_path, corpus, checkpoint_interval=2, async_checkpoint=asynchronous))
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], capture_output=True)
    assert failed.code is FailureCode.CHECKPOINT_UNWRITABLE, failed
    assert f"the checkpoint folder {folder} is no longer writable: " in str(failed)
    # An async step-2 may still be unmarked when the folder turns read-only: its marker is what fails then.
    assert re.search(r"\(EROFS\) while writing checkpoint step-" + ("[24]" if asynchronous else "4") + r"\b", str(failed))
    assert saves[:2] == [2, 4]  # an async save's error surfaces when the next save waits for it


# ---- two ranks -----------------------------------------------------------------------------------------
def test_verification_shares_every_file_once_largest_first():
    sizes = {"a": 100, "b": 90, "c": 10, "d": 5, ".metadata": 1}
    shares = [share(sizes, r, 2) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == sorted(sizes) and shares == [["a", "d"], ["b", "c", ".metadata"]]


def _write_corrupt_resume(rank: int, world: int, port: int, root: str, corpus: str) -> None:
    """On each rank: write step-2 and step-4 with DDP; rank 0 flips a byte in the file rank 1 verifies on
    resume; resume (max_steps 2, so nothing trains after the resume)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        cfg = config(Path(root), Path(corpus), strategy="ddp", micro_batch_size=2, max_steps=4, checkpoint_interval=2)
        train(cfg, setup(cfg), StopFlag())
        step_4 = Path(root) / "checkpoints" / "step-4"
        if rank == 0:
            sizes = json.loads((step_4 / MARKER).read_text())["files"]
            flip_byte(step_4 / share(sizes, 1, world)[0])
        torch.distributed.barrier()
        cfg = config(Path(root), Path(corpus), strategy="ddp", micro_batch_size=2, max_steps=2, checkpoint_interval=2)
        train(cfg, setup(cfg), StopFlag())
    finally:
        teardown()


def test_two_ranks_hash_their_own_files_and_agree_on_a_damaged_one(tmp_path, corpus, capfd):
    start_ranks(_write_corrupt_resume, (2, free_port(), str(tmp_path), str(corpus)), 2)
    out = capfd.readouterr().out
    step_2 = tmp_path / "checkpoints" / "step-2"
    marker = json.loads((step_2 / MARKER).read_text())
    assert set(marker["checksums"]) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert all(file_checksum(step_2 / name) == crc for name, crc in marker["checksums"].items())
    assert re.search(r"step-4 failed verification \(__\d_0\.distcp: crc32 .*\): resuming from step-2", out)
    assert "3 checksums verified" in out and "over 2 rank(s)" in out
    model = read_checkpoint(step_2)["model"]
    exported = weights(tmp_path)
    assert max_diff({k: exported[k] for k in model}, model) == 0
