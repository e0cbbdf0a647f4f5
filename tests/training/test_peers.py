"""Peers gone without a word (training.peers): the verdict every survivor reaches from the answers that arrive, and
what the launcher's classifier makes of each line. The whole path, with real processes killed: test_many_hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.failures import FailureCode, failure_line, parse_failure_line
from jobs.retry.classify import Category, Response, classify_description
from training.checkpoint import _full_message
from training.peers import peer_gone, verdict
from training.watchdog import hang_message

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
    ("read-only folder", FailureCode.CHECKPOINT_UNWRITABLE,
     _full_message("EROFS", Path("/opt/ml/checkpoints"), Path("/opt/ml/checkpoints/step-40")), Category.USER_ERROR,
     Response.FAIL),
]


@pytest.mark.parametrize(("code", "message", "category", "action"), [f[1:] for f in FAULT_LINES],
                         ids=[f[0] for f in FAULT_LINES])
def test_each_fault_line_reaches_the_classifier_with_its_category(code, message, category, action):
    line = _line(code, message)
    assert parse_failure_line(line) == (code, message)
    failure = classify_description({"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed", "FailureReason": line})
    assert (failure.category, failure.action) == (category, action), failure.reason
