"""Activation checkpointing (`activation_checkpointing`, training.models.speedups) with tp, pp and hybrid on gloo ranks.

The speedup wraps each block in a CheckpointWrapper before the strategy sees the model, so the block's
sub-modules move under `_checkpoint_wrapped_module`. Checked here: the same run with it on and off trains
the same losses and weights; the tensor-parallel plan (whose names are the block's, `attn.qkv`...) still
splits the wrapped blocks, so the checkpoint is laid out chunk for chunk like the unwrapped run's; the
pipeline cuts the same stages; checkpoint and export keys are the original names; and a checkpoint written
with it on resumes with it off, and the other way round, to the same weights.

The ViT (5 tokens over 2 tensor ranks) is the case torch 2.8 runs with replicated norms, where a plan that
missed the wrapped blocks would not fail but silently leave them whole on every tensor rank.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from tests.training.helpers import ADAMW, config, spawn, weights
from tests.training.parallel.test_parallel_models import gpt4
from training.checkpoint.markers import read_checkpoint
from training.models.speedups import apply_activation_checkpointing
from training.parallel.pipeline_parallel import split

pytestmark = pytest.mark.slow

GPT = {"model": "tests.training.parallel.test_parallel_models:gpt4"}  # 4 blocks, 4 heads
VIT = {"model": "tests.training.parallel.test_parallel_models:vit4", "data": "synthetic"}  # 4 blocks, 2 heads, 5 tokens
LAYOUTS = {
    2: {
        "tp": {**GPT, "strategy": "tp", "tp_degree": 2},  # sequence parallel (16 tokens split 8 + 8)
        "vit_tp": {**VIT, "strategy": "tp", "tp_degree": 2, "lr": 1e-3},
        "pp": {**GPT, "strategy": "pp", "pp_degree": 2, "pp_schedule": "interleaved_1f1b"},  # 4 stages
    },
}  # hybrid and every other layout with it on, against one process: test_conformance
# Which layouts also resume across on/off (a checkpoint at step 3, finished with the setting flipped).
RESUMED = ("tp", "pp")
# Measured here (torch 2.13 and 2.8.0, CPU, fp32, AdamW, 8 steps): on and off agree exactly, losses and
# weights (0.0): recomputation repeats the same kernels on the same inputs. The tolerance leaves room for
# a reduction order that could differ on other backends, far below what training moves (> 0.3 in loss).
AC_TOL = 1e-6
WRAPPED = "_checkpoint_wrapped_module"


def _runs(root: Path, corpus: Path, world: int) -> list:
    def run(folder: str, hps: dict, on: bool) -> dict:
        return vars(config(root / folder, corpus, micro_batch_size=2, **{**ADAMW, **hps, "activation_checkpointing": on}))

    runs = []
    for name, hps in LAYOUTS[world].items():
        runs += [(run(f"{name}_off", hps, False), None), (run(f"{name}_on", hps, True), None)]
        # Selective (per-op) checkpointing: its policy runs inside the tensor-parallel DTensor ops and each
        # pipeline stage's recompute.
        runs.append((run(f"{name}_selective", {**hps, "activation_checkpointing_policy": "selective"}, True), None))
        if name in RESUMED:
            # Written with it on, finished with it off; and the reverse.
            runs += [(run(f"{name}_on_off", hps, True), 3), (run(f"{name}_on_off", hps, False), None)]
            runs += [(run(f"{name}_off_on", hps, False), 3), (run(f"{name}_off_on", hps, True), None)]
    return runs


@pytest.fixture(scope="module")
def ac_runs(tmp_path_factory, corpus) -> Path:
    root = tmp_path_factory.mktemp("activation_checkpointing")
    spawn(2, _runs(root, corpus, 2))
    return root


NAMES = [n for layouts in LAYOUTS.values() for n in layouts]


def final_model(run: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(_step(run))["model"]


def losses(run: Path) -> list[float]:
    lines = (run / "output" / "metrics.jsonl").read_text().splitlines()
    return [r["train_loss"] for r in map(json.loads, lines) if "train_loss" in r]


def _step(run: Path, step: int | None = None) -> Path:
    folders = list((run / "checkpoints").iterdir())
    return max(folders, key=lambda p: int(p.name.removeprefix("step-"))) if step is None else run / "checkpoints" / f"step-{step}"


def _chunks(folder: Path) -> dict[str, list]:
    """Every checkpoint key and how DCP stored it: the (offset, size) of each chunk the ranks wrote."""
    meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return {k: sorted((tuple(c.offsets), tuple(c.sizes)) for c in getattr(v, "chunks", [])) for k, v in meta.items()}


def assert_trains_alike(run: Path, reference: Path) -> None:
    """The same losses and final weights, within AC_TOL."""
    assert max(abs(a - b) for a, b in zip(losses(run), losses(reference), strict=True)) <= AC_TOL
    a, b = final_model(run), final_model(reference)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= AC_TOL


@pytest.mark.parametrize("name", NAMES)
def test_on_trains_what_off_trains(ac_runs, name):
    off = ac_runs / f"{name}_off"
    assert_trains_alike(ac_runs / f"{name}_on", off)
    assert losses(off)[0] - min(losses(off)) > 0.3  # and it did train


@pytest.mark.parametrize("name", NAMES)
def test_selective_trains_what_off_trains(ac_runs, name):
    # Within AC_TOL on torch 2.13 and 2.8.0 (CPU, fp32), like full checkpointing.
    assert_trains_alike(ac_runs / f"{name}_selective", ac_runs / f"{name}_off")


@pytest.mark.parametrize("name", NAMES)
def test_the_checkpoint_is_laid_out_as_without_it(ac_runs, name):
    """Same keys (the original names: no `_checkpoint_wrapped_module`, model and optimizer alike) and the same
    chunks: a tensor-parallel plan that missed the wrapped blocks would store them whole, in one chunk."""
    on, off = _chunks(_step(ac_runs / f"{name}_on")), _chunks(_step(ac_runs / f"{name}_off"))
    assert on == off
    assert not [k for k in on if WRAPPED in k]
    assert any(k.startswith("optim.state.blocks.0.") for k in on)
    if "tp" in name:  # the blocks' projections are split over the 2 tensor ranks
        split = [k for k in on if k.startswith("model.blocks.") and k.endswith(".weight") and len(on[k]) == 2]
        assert len(split) == 4 * 4, split  # 4 blocks x (qkv, proj, fc, out)
    exported = weights(ac_runs / f"{name}_on")
    assert exported.keys() == final_model(ac_runs / f"{name}_off").keys()


@pytest.mark.parametrize("name", RESUMED)
@pytest.mark.parametrize("flip", ["on_off", "off_on"])
def test_a_checkpoint_resumes_with_it_flipped(ac_runs, name, flip):
    """Stopped at step 3 with it on (off), resumed with it off (on): the weights of the uninterrupted run."""
    resumed, straight = ac_runs / f"{name}_{flip}", ac_runs / f"{name}_{flip.split('_')[1]}"
    assert _step(resumed, 3).is_dir() and _step(resumed).name == "step-8"
    a, b = final_model(resumed), final_model(straight)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= AC_TOL


def test_the_pipeline_cuts_the_same_stages():
    """Same blocks per stage (the wrapper adds no parameters to the balance), same names, same outputs."""
    torch.manual_seed(0)
    plain = gpt4(None, {})
    wrapped = copy.deepcopy(plain)
    apply_activation_checkpointing(wrapped)
    x, out = torch.randint(0, 64, (2, 16)), {}
    for rank in (0, 1):  # interleaved: 4 stages over 2 pipeline ranks
        (a, stages_a), (b, stages_b) = split(plain, 4, rank, 2), split(wrapped, 4, rank, 2)
        assert a.state_dict().keys() == b.state_dict().keys()
        assert {s: list(m.blocks._modules) for s, m in stages_a.items()} == \
            {s: list(m.blocks._modules) for s, m in stages_b.items()}
        out |= {s: (stages_a[s], stages_b[s]) for s in stages_a}
    ya = yb = x
    for s in range(4):
        ya, yb = out[s][0](ya), out[s][1](yb)
    assert torch.equal(ya, yb)
