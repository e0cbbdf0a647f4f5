"""Peers gone without a word (training.resilience.peers): the verdict every survivor reaches from the answers that arrive, and
what the launcher's classifier makes of each line. The whole path, with real processes killed: test_many_hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from contract.container import fence_claim
from contract.failures import FailureCode, failure_line, parse_failure_line
from jobs.retry.classify import Category, Response, classify_description
from training.checkpoint.disk import full_message
from training.resilience.peers import peer_gone, verdict
from training.resilience.watchdog import hang_message

HOSTS = ["algo-1", "algo-1", "algo-2", "algo-2"]  # rank -> host: 2 instances x 2 processes
SAW = "Connection closed by peer [127.0.0.1]:40111"


def answer(rank: int, **more) -> dict:
    return {"rank": rank, "host": HOSTS[rank], "step": 7, "failed": None, "saw": None, **more}


def test_a_whole_host_silent_is_that_host_lost():
    code, message = verdict({0: answer(0, saw=SAW), 1: answer(1)}, 4, HOSTS, store_lost=False)
    assert code is FailureCode.HOST_LOST
    assert message.startswith("host algo-2 (ranks 2, 3) was lost: every rank on it stopped answering at once")
    assert f"rank 0 on host algo-1 saw: {SAW}" in message


def test_a_rank_silent_on_a_host_whose_other_rank_answers_is_a_process_killed_there():
    code, message = verdict({0: answer(0), 1: answer(1), 2: answer(2, saw=SAW)}, 4, HOSTS, store_lost=False)
    assert code is FailureCode.PROCESS_LOST
    assert message.startswith("rank 3 on host algo-2 ended without a failure line while the other ranks of its host")
    assert "out-of-memory killer" in message and "data_workers" in message


def test_a_rank_that_failed_first_gives_every_survivor_its_own_line():
    own = failure_line(FailureCode.CHECKPOINT_UNWRITABLE, "the checkpoint folder /opt/ml/checkpoints is no longer "
                                                          "writable")
    code, message = verdict({0: answer(0, saw=SAW), 2: answer(2, failed=own), 3: answer(3)}, 4, HOSTS, False)
    assert code is FailureCode.CHECKPOINT_UNWRITABLE
    assert message == "rank 2 on host algo-2 failed and ended the run: the checkpoint folder /opt/ml/checkpoints " \
                      "is no longer writable"


def test_the_store_gone_is_the_first_host_lost():
    code, message = verdict({2: answer(2, saw=SAW)}, 4, HOSTS, store_lost=True)
    assert code is FailureCode.HOST_LOST and message.startswith("host algo-1 was lost: the job's store")


def test_every_rank_answering_after_a_broken_connection_is_a_network_fault():
    reports = {r: answer(r, saw=SAW if r == 1 else None) for r in range(4)}
    code, message = verdict(reports, 4, HOSTS, store_lost=False)
    assert code is FailureCode.HOST_LOST and "while every rank still answers" in message


@pytest.mark.parametrize("text", ["[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                                  "[127.0.0.1]:5431", "Connection reset by peer", "[Errno 32] Broken pipe",
                                  "NCCL error: remote process exited or there was a network error, NCCL version 2.27"])
def test_the_transports_words_for_a_peer_gone_are_recognised_in_the_chain(text):
    try:
        try:
            raise RuntimeError(text)
        except RuntimeError as inner:
            raise RuntimeError("DDP's reducer: an allreduce failed") from inner
    except RuntimeError as outer:
        assert peer_gone(outer)
    assert peer_gone(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None


def superseded_message() -> str:
    import tempfile

    from training.checkpoint import fencing

    with tempfile.TemporaryDirectory() as folder:
        assert fencing.claim(Path(folder), 2, "run 'gpt-1234'") is None
        return fencing.superseded(Path(folder), 1, "run 'gpt-1234'")


def _line(code: FailureCode, message: str) -> str:
    return f"AlgorithmError: {failure_line(code, message)}"


# Each fault line the package writes, as the package writes it, and what the launcher must do with it.
FAULT_LINES = [
    ("host lost", *verdict({0: answer(0, saw=SAW), 1: answer(1)}, 4, HOSTS, False), Category.HARDWARE,
     Response.RETRY_CHECKED),
    ("store lost", *verdict({2: answer(2, saw=SAW)}, 4, HOSTS, True), Category.HARDWARE, Response.RETRY_CHECKED),
    ("process lost", *verdict({0: answer(0), 1: answer(1), 2: answer(2, saw=SAW)}, 4, HOSTS, False),
     Category.USER_ERROR, Response.FAIL),
    ("hang", FailureCode.HANG, hang_message({0: {"rank": 0, "host": "algo-1", "step": 7, "waiting": True}}, 2,
                                            ["algo-1", "algo-2"], 310, 300, "hang_timeout_min_seconds"),
     Category.HARDWARE, Response.RETRY_CHECKED),
    # An older attempt fenced out by a newer one (training.checkpoint.fencing): its execution ends, the newer one carries the run.
    ("superseded", FailureCode.SUPERSEDED, superseded_message(), Category.SUPERSEDED, Response.FAIL),
    ("read-only folder", FailureCode.CHECKPOINT_UNWRITABLE,
     full_message("EROFS", Path("/opt/ml/checkpoints"), Path("/opt/ml/checkpoints/step-40")), Category.USER_ERROR,
     Response.FAIL),
]


@pytest.mark.parametrize(("code", "message", "category", "action"), [f[1:] for f in FAULT_LINES],
                         ids=[f[0] for f in FAULT_LINES])
def test_each_fault_line_reaches_the_classifier_with_its_category(code, message, category, action):
    line = _line(code, message)
    assert parse_failure_line(line) == (code, message)
    failure = classify_description({"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed", "FailureReason": line})
    assert (failure.category, failure.action) == (category, action), failure.reason


def oom_on_rank_1(cfg, data_meta: dict):
    """A model whose third forward on rank 1 alone runs out of device memory (CUDA's error, on any device)."""
    import os

    from torch import nn

    vocab = int(data_meta.get("vocab_size", 256))

    class Lopsided(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.out, self.calls = nn.Embedding(vocab, 8), nn.Linear(8, vocab), 0

        def forward(self, x):
            self.calls += 1
            if os.environ.get("RANK") == "1" and self.calls == 3:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
            return self.out(self.emb(x))

    return Lopsided()


def test_a_rank_that_fails_alone_ends_its_peers_with_its_own_line(tmp_path, corpus, capfd):
    """Rank 1 runs out of memory in its third step; rank 0 waits for it in DDP's all-reduce. Rank 1 tells its peers
    its line before it leaves; rank 0's watchdog answers the alert and writes that same line, naming rank 1, so the
    launcher reads out_of_memory from whichever instance's failure SageMaker reports (rank 0 ended on gloo's
    "Connection closed by peer" traceback, or waited for it)."""
    from tests.training.resilience.test_watchdog import _run, _values

    values = _values(tmp_path, corpus, max_steps=8, model="tests.training.resilience.test_peers:oom_on_rank_1",
                     hang_timeout_min_seconds=3.0, hang_timeout_startup_seconds=60.0)
    ok, _ = _run(values, {"SM_OUTPUT_DATA_DIR": str(tmp_path / "output")}, 120)
    err = capfd.readouterr().err
    assert not ok
    code, _ = parse_failure_line((tmp_path / "failure").read_text())
    assert code is FailureCode.OUT_OF_MEMORY
    assert "[training:out_of_memory] rank 1 on host host-1 failed and ended the run: CUDA out of memory" in err, \
        err[-3000:]
    assert "Traceback" not in err


def test_a_claim_holds_against_older_epochs_and_yields_to_newer_ones(tmp_path):
    """training.checkpoint.fencing on one folder: the newest epoch's claim stands; an attempt without an epoch is never fenced."""
    from training.checkpoint import fencing

    run = "run 'gpt-1234'"
    assert fencing.claim(tmp_path, 3, run) is None and fence_claim(tmp_path) == 3
    assert fencing.claim(tmp_path, 3, run) is None  # the same attempt again (a restore after a fallback)
    refused = fencing.claim(tmp_path, 2, run)
    assert refused.startswith(f"run 'gpt-1234''s attempt of epoch 2 found its checkpoint folder {tmp_path} claimed by "
                              "epoch 3")
    assert fence_claim(tmp_path) == 3  # an older attempt's refusal leaves the claim as it was
    assert fencing.claim(tmp_path, 5, run) is None and fencing.superseded(tmp_path, 3, run)
    assert fencing.claim(tmp_path, None, run) is None and fencing.superseded(tmp_path, None, run) is None
    assert not list(tmp_path.glob("*.tmp"))
    assert fencing.current_epoch({"TRAINING_EPOCH": "7"}) == 7
    assert fencing.current_epoch({"TRAINING_EPOCH": "x"}) is None and fencing.current_epoch({}) is None
