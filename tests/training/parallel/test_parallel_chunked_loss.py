"""The chunked loss (training.loss, `loss_chunk_tokens`) where the package calls it on 2 gloo ranks: tensor parallel
(sequence parallel, the logits gathered whole for the loss: training.parallel.strategies.tp), the pipeline's schedule (the
last stage's loss inside torch's PipelineSchedule, training.parallel.pipeline_parallel), training and evaluating. Chunks of 5
tokens (a 2 x 16-token micro-batch: 7 chunks, the last short) against the whole loss.

Measured (torch 2.13 and 2.8.0 alike, CPU, fp32, AdamW, 8 steps, an evaluation every 4; `-s` prints them): train and
validation losses (about 4) apart by at most 4.8e-7, one fp32 ulp (1.2e-7 relative: the chunks' sums add in another
order), the final weights equal (0.0: the logits' gradient is exactly the whole loss's, tests/training/
test_chunked_loss.py), on every layout. Held at 1e-6 relative for the losses and 1e-6 for the weights, far below
what training moves (> 0.3 in loss).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.metrics import TRAIN_LOSS, VAL_LOSS
from tests.training.helpers import ADAMW, config, max_diff, spawn, weights

pytestmark = pytest.mark.slow

GPT = {"model": "tests.training.parallel.test_parallel_models:gpt4"}  # 4 blocks, 4 heads
LAYOUTS = {
    "tp": {**GPT, "strategy": "tp", "tp_degree": 2},  # sequence parallel (16 tokens split 8 + 8)
    "pp": {**GPT, "strategy": "pp", "pp_degree": 2, "pp_schedule": "interleaved_1f1b"},  # 4 stages
}  # FSDP calls the loss as one process does (training.step.TrainStep.loss): every layout with the chunked loss
# against one process is test_conformance's matrix (each cell in 5-token chunks)
TOL = 1e-6


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus) -> Path:
    root = tmp_path_factory.mktemp("chunked_loss")
    spawn(2, [(vars(config(root / f"{name}_{chunk}", corpus, micro_batch_size=2, eval_interval=4, eval_batches=2,
                           loss_chunk_tokens=chunk, **{**ADAMW, **hps})), None)
              for name, hps in LAYOUTS.items() for chunk in (0, 5)])
    return root


def metric(run: Path, name: str) -> list[float]:
    lines = (run / "output" / "metrics.jsonl").read_text().splitlines()
    return [r[name] for r in map(json.loads, lines) if name in r]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_chunked_loss_trains_and_evaluates_what_the_whole_one_does(runs, name):
    chunked, whole = runs / f"{name}_5", runs / f"{name}_0"
    diffs = {}
    for m in (TRAIN_LOSS, VAL_LOSS):
        a, b = metric(chunked, m), metric(whole, m)
        assert len(a) == len(b) > 0, m
        diffs[m] = max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))
    diffs["weights"] = max_diff(weights(chunked), weights(whole))
    print(f"\n{name}: chunked against whole, largest relative loss and absolute weight differences: {diffs}")
    assert max(diffs.values()) <= TOL, diffs
    assert metric(whole, TRAIN_LOSS)[0] - min(metric(whole, TRAIN_LOSS)) > 0.3  # and it did train
