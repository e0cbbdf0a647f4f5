"""`trainctl local` for the model-parallel strategies: examples/local-tp.json, examples/local-pp.json and
a hybrid made from the latter (interleaved, 3 stages a rank) run through the whole local path (the request's
`parallel` section checked against --nproc, rendered into tp_degree / pp_degree / pp_microbatches / pp_schedule /
pp_stages_per_rank, trained under a real torchrun) on the test corpus, to completion; the export loads into a fresh
model.

(hsdp, with a stop and a resume: test_training_local.py.)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from contract.models import GPTConfig
from tests.training.helpers import SEQ, weights
from training.models.gpt import GPT

pytestmark = [pytest.mark.slow, pytest.mark.trainctl_local]

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
STEPS = 6


def short_request(tmp_path: Path, corpus: Path, example: str, **parallel) -> Path:
    """The example on the test corpus, a few steps, nothing saved on the way (the export is the end state)."""
    request = json.loads((EXAMPLES / example).read_text())
    request.update(dataset=str(corpus / "train"), validation_dataset=str(corpus / "validation"),
                   checkpoint_interval=100)
    request["parallel"].update(parallel)
    request["hyperparameters"].update(max_steps=STEPS, seq_len=SEQ, micro_batch_size=2, eval_interval=0,
                                      log_interval=1, warmup_steps=1)
    path = tmp_path / example
    path.write_text(json.dumps(request))
    return path


# The hybrid: the pp example with tensor parallelism inside each of 2 pipeline ranks, on the interleaved schedule at 3
# stages a rank (the `small` preset's 6 blocks, one a stage; its 6 heads split over 2 tensor ranks); 4 micro-batches
# divide the 2 x 2 x 2 samples a pipeline step pools.
HYBRID = {"strategy": "hybrid", "name": "local-hybrid", "model_size": "small"}
HYBRID_PARALLEL = {"tensor_parallel_degree": 2, "pipeline_schedule": "interleaved_1f1b", "pipeline_stages_per_rank": 3}


@pytest.mark.parametrize("example, nproc, parallel, expected", [
    ("local-tp.json", 2, {}, {"strategy": '"tp"', "tp_degree": "2", "pp_degree": "1"}),
    ("local-pp.json", 2, {}, {"strategy": '"pp"', "pp_degree": "2", "pp_microbatches": "4", "pp_schedule": '"1f1b"'}),
    ("local-pp.json", 4, HYBRID_PARALLEL, {"strategy": '"hybrid"', "tp_degree": "2", "pp_degree": "2",
                                           "pp_schedule": '"interleaved_1f1b"', "pp_stages_per_rank": "3"}),
], ids=["tp", "pp", "hybrid"])
def test_a_model_parallel_request_runs_through_trainctl_local(tmp_path, corpus, capfd, example, nproc, parallel,
                                                             expected):
    from cli.commands.local import run_request_locally
    from cli.request_file import load_request

    path = short_request(tmp_path, corpus, example, **parallel)
    if parallel:  # the hybrid: same example, the strategy that takes both degrees
        path.write_text(json.dumps({**json.loads(path.read_text()), **HYBRID}))
    work = tmp_path / "work"
    assert run_request_locally(load_request(path), workdir=work, nproc=nproc, data=None) == 0

    status = json.loads((work / "output" / "data" / "training_status.json").read_text())
    assert status["status"] == "completed" and status["step"] == STEPS
    hps = json.loads((work / "input" / "config" / "hyperparameters.json").read_text())
    assert {k: hps[k] for k in expected} == expected
    # 16 tokens split evenly over 2 tensor ranks: sequence parallel on both torch versions.
    out = capfd.readouterr().out
    assert ("[tp] sequence parallelism on" in out) == (hps["tp_degree"] == "2")
    if parallel:  # the stages the package cut: 2 ranks x 3, rank 0 holding every second
        assert "[pp] 6 stages over 2 pipeline ranks (3 a rank, interleaved_1f1b, 4 micro-batches a step); this " \
               "rank holds stages [0, 2, 4]" in out

    config = json.loads((work / "model" / "config.json").read_text())
    assert config["architecture"] == "gpt" and config["step"] == STEPS
    model = GPT(GPTConfig(**{f.name: config[f.name] for f in dataclasses.fields(GPTConfig)}))
    model.load_state_dict(weights(work), strict=True)  # every tensor whole, under the model's own names
    with torch.no_grad():
        logits = model(torch.randint(0, config["vocab_size"], (1, SEQ)))
    assert logits.shape == (1, SEQ, config["vocab_size"]) and torch.isfinite(logits).all()


# Llama 3 70B's shape on 32 x ml.p5.48xlarge: the layout the issue asks the plan to propose.
LLAMA_70B_ON_32_P5 = {"name": "l70", "model": "my.pkg:llama", "dataset": "s3://bucket/data/", "strategy": "auto",
                      "instance": {"type": "ml.p5.48xlarge", "count": 32},
                      "model_shape": {"kind": "decoder", "layers": 80, "hidden": 8192, "heads": 64, "seq_len": 8192,
                                      "vocab_size": 128256},
                      "hyperparameters": {"micro_batch_size": 1, "activation_checkpointing": True}}


def test_the_plans_fsdp_by_tensor_parallel_for_a_70b_runs_in_miniature_matching_one_process(tmp_path, corpus):
    """trainctl plan shows FSDP x TP for a 70B on 32 x p5 (tensor 2 x shard 128, 1.5% behind pure FSDP's 256 shards
    in its time model), with the request fields that run it; those fields on a tiny model, on 4 CPU processes
    (tensor 2 x shard 2 through trainctl local), end on the weights of one process given the same global batch."""
    from cli.commands.local import run_request_locally
    from cli.request_file import load_request
    from jobs.planning import plan_request
    from jobs.request.parse import parse_request
    from tests.training.helpers import max_diff

    doc = plan_request(parse_request(LLAMA_70B_ON_32_P5)).to_dict()
    shown = [c for c in doc["candidates"] if c["instance_count"] == 32 and c["instance_type"] == "ml.p5.48xlarge"]
    [two_d] = [c for c in shown if c["degrees"] == {"replicate": 1, "shard": 128, "tensor": 2, "pipeline": 1}]
    assert two_d["fits"] and two_d["request"] == {"strategy": "tp", "parallel": {"tensor_parallel_degree": 2}}

    def run(name: str, nproc: int, fields: dict) -> Path:
        request = {k: v for k, v in json.loads((EXAMPLES / "local-tp.json").read_text()).items() if k != "parallel"}
        request.update(name=name, dataset=str(corpus / "train"), validation_dataset=str(corpus / "validation"),
                       checkpoint_interval=100, **fields)
        request["hyperparameters"].update(max_steps=STEPS, seq_len=SEQ, micro_batch_size=2, global_batch_size=8,
                                          eval_interval=0, log_interval=1, warmup_steps=1)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(request))
        work = tmp_path / name
        assert run_request_locally(load_request(path), workdir=work, nproc=nproc, data=None) == 0
        return work

    miniature = run("fsdp-by-tp", 4, two_d["request"])
    one = run("one-process", 1, {"strategy": "single"})
    hps = json.loads((miniature / "input" / "config" / "hyperparameters.json").read_text())
    # dp_shard 0: FSDP over the rest, 4 / 2 = 2 ranks.
    assert (hps["strategy"], hps["tp_degree"], hps["dp_shard"]) == ('"tp"', "2", "0")
    # fp32 on CPU (gloo): the conformance matrix's weight tolerance for every layout against one process.
    assert max_diff(weights(miniature), weights(one)) <= 1e-6
