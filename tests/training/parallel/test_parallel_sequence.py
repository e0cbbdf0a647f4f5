"""Sequence parallelism inside tensor parallelism (training.parallel.strategies.sequence) on 2 gloo ranks: where the
probe passes, the norms' weights are DTensors replicated on the tensor mesh and their activations are
sequence shards (Shard(1)), and the forward and every gradient match the unsplit model; where it fails (or
is made to), the norms stay plain and the result still matches. Blocks cut in two runs (two pipeline stages) pass
each rank's sequence shard between them and still match.

The decoder (16 tokens) splits evenly; the ViT (4 patches + class token = 5 tokens) does not, which is the
case torch 2.8's DTensor gets wrong and the probe turns off there (see sequence.py).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
from pathlib import Path

import pytest
import torch

from tests.training.helpers import free_port, start_ranks
from tests.training.parallel.test_parallel_models import gpt4, vit4

pytestmark = pytest.mark.slow

# Differences relative to each tensor's largest magnitude. Measured here (torch 2.13 and 2.8, CPU, fp32):
# logits within 2.7e-7 and every gradient within 6.6e-7 of the unsplit model, split or not (only the order
# of the reductions differs).
TOL = 1e-5


def _inputs(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = gpt4(None, {"vocab_size": 64}) if name == "gpt" else vit4(None, {})
    model.init_weights()
    with torch.no_grad():  # non-trivial norms, so that a wrong norm gradient would show
        model.head.weight.normal_(0.0, 0.5)  # the ViT's head starts at zero: no gradient would reach the blocks
        for block in model.blocks:
            block.ln1.weight.uniform_(0.5, 1.5)
            block.ln2.bias.uniform_(-0.5, 0.5)
    x = torch.randint(0, 64, (4, 16)) if name == "gpt" else torch.randn(4, 3, 8, 8)
    return model, x


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference, relative to the tensor's largest magnitude."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def _placement(p) -> str:  # str() differs between torch versions ("S(1)" / "Shard(dim=1)")
    return "Shard(1)" if p.is_shard(1) else "Replicate" if p.is_replicate() else repr(p)


def _check(name: str, mesh, forced_off: bool, boundary: bool = False) -> dict:
    """`boundary`: the blocks split in two runs as two pipeline stages would hold them, the sequence left split
    between them (training.parallel.strategies.tp.Run)."""
    from torch.distributed.tensor import DTensor

    from training.parallel.strategies import sequence
    from training.parallel.strategies.tp import Run, tensor_parallelize

    model, x = _inputs(name)
    reference = copy.deepcopy(model)
    sequence._PROBED.clear()
    probe, log, seen = sequence._probe, io.StringIO(), {}
    if forced_off:
        sequence._probe = lambda tp_mesh, seq_len: "forced off by the test"
    blocks = list(model.blocks)
    runs = [Run(blocks[:2], leaves_whole=False), Run(blocks[2:], enters_whole=False)] if boundary else None
    try:
        with contextlib.redirect_stdout(log):
            on = tensor_parallelize(model, mesh["tp"], runs)
    finally:
        sequence._probe = probe
    # What crosses between the two runs (a pipeline stage boundary): a plain tensor of this rank's tokens.
    model.blocks[1].register_forward_hook(lambda m, args, out: seen.update(
        crossing_is_dtensor=isinstance(out, DTensor), crossing_tokens=out.shape[1]))
    model.blocks[1].ln1.register_forward_hook(lambda m, args, out: seen.update(
        placements=[_placement(p) for p in getattr(out, "placements", [])], local_tokens=
        (out.to_local() if isinstance(out, DTensor) else out).shape[1]))
    out = model(x)
    out.float().pow(2).mean().backward()
    ref = reference(x)
    ref.float().pow(2).mean().backward()
    weight = model.blocks[1].ln1.weight
    grads = {n: _relative(_full(p.grad), q.grad)
             for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True)}
    return {"on": on, "log": log.getvalue(), "norm_is_dtensor": isinstance(weight, DTensor),
            "norm_placements": [_placement(p) for p in getattr(weight, "placements", [])], **seen,
            "logits": _relative(out, ref), "grads": grads}


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as torch_dist

    from contract.parallel import ParallelDims
    from training.parallel.mesh import build_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch_dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = build_mesh(ParallelDims(tp=world), torch.device("cpu"))
        results = {f"{name}_{mode}": _check(name, mesh, mode == "off")
                   for name in ("gpt", "vit") for mode in ("auto", "off")}
        results["gpt_boundary"] = _check("gpt", mesh, False, boundary=True)
        results["vit_boundary"] = _check("vit", mesh, False, boundary=True)
        if rank == 0:
            Path(out).write_text(json.dumps(results))
        torch_dist.barrier()  # no rank tears gloo down while another still talks (an abort at exit otherwise)
    finally:
        torch_dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("sequence") / "results.json"
    start_ranks(_worker, (2, free_port(), str(out)), 2)
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", ["gpt_auto", "gpt_off", "vit_auto", "vit_off", "gpt_boundary", "vit_boundary"])
def test_matches_the_unsplit_model(results, case):
    r = results[case]
    assert r["logits"] < TOL
    assert max(r["grads"].values()) < TOL, r["grads"]
    assert len(r["grads"]) > 20  # every parameter compared, the norms' included


def test_a_pipeline_stage_boundary_carries_each_ranks_sequence_shard(results):
    """Between two stages' blocks the stream stays split: each tensor rank passes on its 8 of the 16 tokens as a
    plain tensor (what torch's pipeline sends its peer), not the gathered 16; inside a single run, whole."""
    assert results["gpt_boundary"]["on"]
    assert results["gpt_boundary"]["crossing_tokens"] == 8 and not results["gpt_boundary"]["crossing_is_dtensor"]
    assert results["gpt_auto"]["crossing_is_dtensor"] and results["gpt_auto"]["placements"] == ["Shard(1)"]
    # The ViT's 5 tokens do not split evenly over 2 ranks: there the whole sequence crosses (and still matches).
    assert results["vit_boundary"]["crossing_tokens"] == 5 and not results["vit_boundary"]["crossing_is_dtensor"]


def test_the_decoder_runs_its_norms_on_sequence_shards(results):
    """Supported on gloo/CPU on both torch versions: the norms' weights are replicated DTensors and a norm
    sees half of the 16 tokens."""
    r = results["gpt_auto"]
    assert r["on"] and "sequence parallelism on" in r["log"]
    assert r["norm_is_dtensor"] and r["norm_placements"] == ["Replicate"]
    assert r["placements"] == ["Shard(1)"] and r["local_tokens"] == 8


def test_the_vit_splits_its_uneven_sequence_where_the_probe_passes(results):
    r = results["vit_auto"]
    if r["on"]:  # torch 2.13: 5 tokens split 3 + 2
        assert r["norm_is_dtensor"] and r["placements"] == ["Shard(1)"] and r["local_tokens"] == 3
    else:  # torch 2.8: the probe names the failure, and the norms stay plain tensors
        assert "off, norms replicated: 5 tokens over 2 tensor ranks fail the probe" in r["log"]
        assert not r["norm_is_dtensor"] and r["placements"] == []


@pytest.mark.parametrize("name", ["gpt", "vit"])
def test_a_failed_probe_falls_back_to_replicated_norms_and_says_why(results, name):
    r = results[f"{name}_off"]
    assert not r["on"] and "forced off by the test" in r["log"]
    assert not r["norm_is_dtensor"] and r["placements"] == [] and r["local_tokens"] == (16 if name == "gpt" else 5)
