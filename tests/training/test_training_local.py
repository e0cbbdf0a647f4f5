"""`trainctl local`'s engine end to end: a hand-written CreateTrainingJob request, 2 processes under a real
torchrun, SIGTERM mid-run (checkpoint, clean stop), then a second run that resumes and ends on the same
weights as an uninterrupted run."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
import torch

from cli.container_emulator import run_local
from tests.training.helpers import LOCAL_HPS, SEQ, create_request, sigterm_at_step, weights

pytestmark = [pytest.mark.slow, pytest.mark.trainctl_local]


def test_interrupted_local_run_resumes_to_the_uninterrupted_weights(tmp_path, corpus, two_rank_runs, capfd):
    """Ctrl-C's path: trainctl local gets the signal and creates the stop file (the slow stop-time save
    under the container entry: test_container_stop)."""
    # Only the stop's own save (checkpoint cadence does not change the weights).
    request = create_request({**LOCAL_HPS, "checkpoint_interval": 0})
    data = {"train": corpus / "train", "validation": corpus / "validation"}
    work = tmp_path / "work"

    done, sent = threading.Event(), []
    watcher = sigterm_at_step(work / "output" / "data" / "metrics.jsonl", step=3, done=done, sent=sent)
    code = run_local(request, workdir=work, nproc=2, data_dirs=data)
    done.set()
    watcher.join(timeout=1)
    assert code == 0 and sent and (work / "stop").exists()
    console = capfd.readouterr()
    assert "SignalException" not in console.err + console.out and "Traceback" not in console.err + console.out
    # What the stop shows a local user speaks of this machine, not of AWS (the issue's "Ctrl-C in a local run speaking
    # of AWS": no SageMaker, Spot, S3 or AWS in anything printed).
    assert not (aws := re.findall(r".*\b(?:SageMaker|Spot|S3|AWS)\b.*", console.out + console.err)), aws
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status["status"] == "stopped" and 3 <= status["step"] < LOCAL_HPS["max_steps"]
    stopped_at = work / "checkpoints" / f"step-{status['step']}"
    assert (stopped_at / "COMPLETE.json").exists() and (stopped_at / ".metadata").exists()
    assert not (work / "model" / "model.safetensors").exists()
    logs = "\n".join(p.read_text() for p in (work / "output" / "logs").rglob("*.log"))
    assert f"[train] stopped at step {status['step']}" in logs  # the workers' own clean exit
    # The SageMaker-like layout the script saw.
    assert json.loads((work / "input" / "config" / "hyperparameters.json").read_text())["max_steps"] == "40"
    assert (work / "input" / "data" / "train").resolve() == (corpus / "train").resolve()
    assert (work / "code" / "train.py").exists() and (work / "code" / "training" / "loop.py").exists()

    assert run_local(request, workdir=work, nproc=2, data_dirs=data) == 0
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status == {**status, "status": "completed", "step": LOCAL_HPS["max_steps"]}
    logs = "\n".join(p.read_text() for p in (work / "output" / "logs").rglob("*.log"))
    assert f"resumed from {stopped_at}" in logs
    resumed, reference = weights(work), weights(two_rank_runs / "local_reference")
    assert all(torch.equal(resumed[k], reference[k]) for k in reference)
    metrics = [json.loads(line) for line in (work / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    losses = [m["train_loss"] for m in metrics if "train_loss" in m]
    assert losses[-1] < losses[0]


def hsdp_request(tmp_path: Path, corpus: Path) -> Path:
    """examples/local-hsdp.json on the test corpus, short: 4 processes = 2 replicas x 2 shards."""
    request = json.loads((Path(__file__).resolve().parents[2] / "examples" / "local-hsdp.json").read_text())
    request.update(dataset=str(corpus / "train"), validation_dataset=str(corpus / "validation"), checkpoint_interval=100)
    request["hyperparameters"].update(max_steps=40, seq_len=SEQ, micro_batch_size=1, eval_interval=0, log_interval=1)
    path = tmp_path / "hsdp.json"
    path.write_text(json.dumps(request))
    return path


def test_an_hsdp_request_runs_through_trainctl_local_stops_and_resumes(tmp_path, corpus):
    """The whole `trainctl local` path for a torch-native strategy: the request's `parallel` section is
    validated against --nproc, rendered into the mesh hyperparameters, trained on 4 processes, stopped by
    SIGTERM, resumed, and it ends on the weights of an uninterrupted run."""
    from cli.commands.local import run_request_locally
    from cli.request_file import load_request

    loaded = load_request(hsdp_request(tmp_path, corpus))
    reference, work = tmp_path / "reference", tmp_path / "work"
    assert run_request_locally(loaded, workdir=reference, nproc=4, data=None) == 0

    done, sent = threading.Event(), []
    watcher = sigterm_at_step(work / "output" / "data" / "metrics.jsonl", step=3, done=done, sent=sent)
    assert run_request_locally(loaded, workdir=work, nproc=4, data=None) == 0
    done.set()
    watcher.join(timeout=1)
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert sent and status["status"] == "stopped" and 3 <= status["step"] < 40
    hps = json.loads((work / "input" / "config" / "hyperparameters.json").read_text())
    assert (hps["strategy"], hps["dp_shard"]) == ('"hsdp"', "2")

    assert run_request_locally(loaded, workdir=work, nproc=4, data=None) == 0
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status["status"] == "completed" and status["step"] == 40
    resumed, uninterrupted = weights(work), weights(reference)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


def test_a_planner_layout_runs_through_trainctl_local(tmp_path, corpus):
    """A candidate `trainctl plan` shows for a tiny GPT on 4 GPUs, tensor 2 x data 2 on a global batch of 2 (one
    micro-batch per batch group), rendered from its `request` fields and trained by `trainctl local` on 4
    processes: the request the planner says runs it, runs."""
    from cli.commands.local import run_request_locally
    from cli.request_file import load_request
    from jobs.planning import plan_request
    from jobs.request.parse import parse_request

    base = json.loads((Path(__file__).resolve().parents[2] / "examples" / "local-tp.json").read_text())
    base.update(dataset=str(corpus / "train"), validation_dataset=str(corpus / "validation"), checkpoint_interval=100,
                instance={"type": "ml.g5.12xlarge", "count": 1})  # 4 GPUs for the plan; local runs 4 processes
    base["hyperparameters"].update(max_steps=6, seq_len=SEQ, micro_batch_size=1, global_batch_size=2,
                                   eval_interval=0, log_interval=1)
    plan = plan_request(parse_request({**base, "strategy": "fsdp", "parallel": {}}))
    [tp2] = [c for c in plan.candidates if c.instance_type == "ml.g5.12xlarge" and c.layout.nodes == 1
             and (c.layout.strategy, c.layout.tensor) == ("tp", 2)]
    fields = tp2.to_dict()["request"]
    assert fields == {"strategy": "tp", "parallel": {"tensor_parallel_degree": 2},
                      "hyperparameters": {"micro_batch_per_group": True}}
    request = {**base, **fields, "hyperparameters": {**base["hyperparameters"], **fields["hyperparameters"]}}
    path = tmp_path / "planned.json"
    path.write_text(json.dumps(request))
    work = tmp_path / "work"
    assert run_request_locally(load_request(path), workdir=work, nproc=4, data=None) == 0
    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status["status"] == "completed" and status["step"] == 6
