"""FSDP's two ways to accumulate gradients over micro-batches (hyperparameter fsdp_accumulation), measured on the ranks:
what each holds between micro-steps. `sharded` (the default, torchtitan's) reduce-scatters every micro-batch and a
rank holds a shard of the gradients; `unsharded` skips it until the last micro-step and a rank holds the whole
model's. That both train like one process is the conformance matrix's accumulation cell (fsdp sharded; hsdp and tp_dp
unsharded); the planner charges the same memory (tests/jobs/test_planner_memory.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.training.helpers import free_port, start_ranks

WORLD = 2


def held_gradient_bytes(model: torch.nn.Module) -> int:
    """The bytes of gradients a rank holds: its parameters' (sharded) `.grad`, and FSDP2's unsharded gradients
    kept between unsynced micro-steps (FSDPParam's accumulated gradient, or its unsharded parameter's `.grad`)."""
    total = sum(p.grad.to_local().numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    seen = set()
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        group = getattr(state, "_fsdp_param_group", None)
        for fsdp_param in getattr(group, "fsdp_params", []):
            if id(fsdp_param) in seen:
                continue
            seen.add(id(fsdp_param))
            grad = fsdp_param.unsharded_accumulated_grad
            if grad is None:
                unsharded = getattr(fsdp_param, "_unsharded_param", None)
                grad = None if unsharded is None else unsharded.grad
            if grad is not None:
                total += grad.numel() * grad.element_size()
    return total


def _one_micro_step(rank: int, world: int, port: int, mode: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from contract.models import GPTConfig
    from training.models.gpt import GPT
    from training.parallel.strategies.fsdp import apply_fsdp
    from training.precision import resolve_precision

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=64, seq_len=16, vocab_size=128))
        params = sum(p.numel() for p in model.parameters())
        cpu = torch.device("cpu")
        par = apply_fsdp(model, init_device_mesh("cpu", (world,)), cpu, resolve_precision("fp32", cpu),
                         accumulation=mode)
        tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(rank))
        with par.grad_sync(False):  # the first of two micro-steps: the step loop's grad_sync(i == n - 1)
            par.model(tokens).float().mean().backward()
        if rank == 0:
            Path(out).write_text(json.dumps({"params": params, "held": held_gradient_bytes(par.model)}))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def held(tmp_path_factory) -> dict[str, dict]:
    found = {}
    for mode in ("sharded", "unsharded"):
        out = tmp_path_factory.mktemp(mode) / "held.json"
        start_ranks(_one_micro_step, (WORLD, free_port(), mode, str(out)), WORLD)
        found[mode] = json.loads(out.read_text())
    return found


def test_sharded_accumulation_holds_a_shard_of_the_gradients(held):
    fp32 = 4 * held["sharded"]["params"]
    # A shard each (FSDP2 pads a dimension that does not split evenly: within 2%).
    assert held["sharded"]["held"] == pytest.approx(fp32 / WORLD, rel=0.02)


def test_unsharded_accumulation_holds_the_whole_models_gradients(held):
    assert held["unsharded"]["held"] == pytest.approx(4 * held["unsharded"]["params"], rel=0.02)
    assert held["unsharded"]["held"] > 1.9 * held["sharded"]["held"]
