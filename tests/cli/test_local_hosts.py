"""The layouts that span instances, through `trainctl local --hosts 2 --nproc 2` (cli/container_emulator.py): each
instance its own folders and torchrun, checkpoints synced through the emulated S3 prefix. Each layout trains 2 SGD
steps and checkpoints, a second invocation resumes from what S3 holds and trains 2 more, and the exported weights are
one process's on the same global batch within the conformance matrix's fp32 tolerance (tests/training/
test_conformance.py: there every layout runs on one host, on both tested torch versions)."""

from __future__ import annotations

import json

import pytest
import torch

from cli.container_emulator import S3_CHECKPOINTS, run_local
from tests.training.conformance import BASE, PP
from tests.training.helpers import config, create_request, max_diff, weights, write_corpus
from tests.training.test_conformance import TOLERANCES
from training.distributed import StopFlag, setup
from training.loop import train

pytestmark = pytest.mark.slow

# 2 instances x 2 processes: rank r on algo-(1 + r // 2). hsdp shards within an instance and replicates across;
# hybrid keeps its tensor pairs within an instance and its pipeline stages across (contract.parallel's rank map).
LAYOUTS = {
    "ddp": {"strategy": "ddp"},
    "fsdp": {"strategy": "fsdp"},
    "hsdp": {"strategy": "hsdp", "dp_shard": 2},
    "hybrid": {"strategy": "hybrid", "pp_degree": 2, "tp_degree": 2, **PP},
}
HPS = {**{k: v for k, v in BASE.items() if k not in ("max_steps", "checkpoint_interval")}, "micro_batch_size": 2,
       "checkpoint_interval": 2, "seq_len": 16, "seed": 7}
WORLD, STEPS = 4, 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, corpus):
    """The single process with the 4 ranks' global batch (micro 2 x 4), 4 steps straight."""
    root = tmp_path_factory.mktemp("one_process")
    train(cfg := config(root, corpus, **{**HPS, "strategy": "single", "micro_batch_size": 2 * WORLD,
                                         "max_steps": STEPS}), setup(cfg), StopFlag())
    return weights(root)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_across_two_instances_resumes_from_s3_and_matches_one_process(layout, tmp_path, corpus, one_process,
                                                                              capfd):
    data = {"train": corpus / "train", "validation": corpus / "validation"}
    work = tmp_path / "work"
    for steps in (STEPS // 2, STEPS):  # the second invocation is the next job: a fresh download of the prefix
        request = create_request({**HPS, **LAYOUTS[layout], "max_steps": steps})
        request["ResourceConfig"]["InstanceCount"] = 2
        assert run_local(request, workdir=work, nproc=2, hosts=2, data_dirs=data) == 0
    logs = capfd.readouterr().out
    assert f"resumed from {work / 'algo-1' / 'checkpoints' / 'step-2'} at step 2" in logs
    assert sorted(p.name for p in (work / S3_CHECKPOINTS).iterdir()) == ["step-2", "step-4"]
    for host in ("algo-1", "algo-2"):
        assert json.loads((work / host / "input" / "config" / "resourceconfig.json").read_text())["current_host"] == host
    spread = max_diff(weights(work / "algo-1"), one_process)
    print(f"{layout} on 2 instances x 2 processes vs one process: largest weight difference {spread:.3g}")
    assert spread <= TOLERANCES["fp32"][2]
    assert all(torch.isfinite(t).all() for t in one_process.values())
