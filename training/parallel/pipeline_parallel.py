"""Pipeline parallelism: the model cut into stages at block boundaries, run by a torch.distributed.pipelining
schedule (1F1B, interleaved 1F1B with pp_stages_per_rank stages a rank, two by default, or GPipe).

Names stay the original model's. A stage is a shallow copy of the model that keeps only its blocks (under
their original indices, `blocks.5.attn...`), and the model's `pipeline_edges`: what comes before the blocks
on the first stage, what comes after on the last. A rank's `model` (what the optimizer, the checkpoint and
the export see) is the same kind of copy holding the union of its stages; the stages share its modules.
So a checkpoint's keys are the whole model's, whatever the stage count: it resumes on 1 stage or on 4.

Stages are balanced by work (contiguous blocks, each stage at least one block, the heaviest stage as light
as possible): training FLOPs per token (training.metrics.flops), so a decoder's token table, a lookup, weighs nothing
and its output projection the matmul it is; by parameter count for a model that does not say its shape. Stage s lives on pipeline rank s mod p (torch's looped placement for interleaving).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as torch_dist
from torch import nn

from contract.errors import ConfigError
from contract.hyperparameters import INTERLEAVED
from contract.pipeline_cut import balance
from training.metrics.flops import parameters_of, part_flops_per_token

SCHEDULES = {"1f1b": "Schedule1F1B", INTERLEAVED: "ScheduleInterleaved1F1B", "gpipe": "ScheduleGPipe"}


class KeptBlocks(nn.Module):
    """Some of a model's blocks under their original indices, iterated in order like the ModuleList."""

    def __init__(self, blocks: dict[int, nn.Module]) -> None:
        super().__init__()
        for i in sorted(blocks):
            self.add_module(str(i), blocks[i])

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)


def part(model: nn.Module, block_ids, first: bool, last: bool) -> nn.Module:
    """A shallow copy of `model` with only these blocks and, per `first`/`last`, its edges; shares modules."""
    before, after = getattr(model, "pipeline_edges", (None, None))
    if before is None:
        raise ConfigError(f"pipeline parallelism needs a model with `blocks` and `pipeline_edges` "
                          f"({type(model).__name__} has none): use the gpt or vit reference models")
    piece = model.__class__.__new__(model.__class__)
    # Own copies of the registries (_modules, _parameters, hooks...): removing a part from one copy, or
    # FSDP registering hooks on it, must not touch the others.
    piece.__dict__ = {k: copy.copy(v) if isinstance(v, dict) else v for k, v in model.__dict__.items()}
    piece.blocks = KeptBlocks({i: model.blocks[i] for i in block_ids})
    for name in (() if first else before) + (() if last else after):
        setattr(piece, name, None)
    return piece


def stage_weights(model: nn.Module) -> tuple[list[float], float, float]:
    """(each block's, the first edge's, the last edge's) work: training FLOPs per token (training.metrics.flops), so an
    embedding table, a lookup, weighs nothing and the output projection its matmul; parameters where the model
    does not say its shape."""
    before, after = model.pipeline_edges
    blocks = list(model.blocks)
    edges = [[getattr(model, n, None) for n in names] for names in (before, after)]
    if part_flops_per_token(model, []) is not None:
        return ([part_flops_per_token(model, [b], blocks=1) for b in blocks],
                *(part_flops_per_token(model, parts) for parts in edges))
    size = lambda parts: sum(p.numel() for p in parameters_of(parts))  # noqa: E731
    return [size([b]) for b in blocks], size(edges[0]), size(edges[1])


def split(model: nn.Module, n_stages: int, pp_rank: int, pp: int) -> tuple[nn.Module, dict[int, nn.Module]]:
    """(this rank's model, {stage index: stage module}) for the stages s with s mod pp == pp_rank."""
    blocks, first, last = stage_weights(model)
    ranges = balance(blocks, n_stages, first, last)
    mine = [s for s in range(n_stages) if s % pp == pp_rank]
    stages = {s: part(model, ranges[s], s == 0, s == n_stages - 1) for s in mine}
    owned = [i for s in mine for i in ranges[s]]
    return part(model, owned, 0 in mine, n_stages - 1 in mine), stages


def adopt_root_parameters(model: nn.Module, stages: dict[int, nn.Module]) -> None:
    """FSDP2 registers sharded parameters on the module that owns them: a stage's own (root-level) ones,
    such as a ViT's class token, then live in the stage's registry only. The rank's model takes them."""
    for stage in stages.values():
        for name, p in stage._parameters.items():
            if p is not None:
                model._parameters[name] = p


def isolate_shape_inference(stage: nn.Module, device: torch.device) -> None:
    """torch's schedules infer each stage's output shape on their first step by running the stage on zeros under
    no_grad, inside whatever autocast the step runs in. Two things leaked out of that run: autocast's weight
    cache kept the low-precision weight copies it made there, without a gradient path, and the real forward of
    the same step reused them (pp and hybrid in bf16 lost the first step's Linear-weight gradients on torch
    2.8); and its dropout drew random numbers, so a resumed run (which infers again) drew other masks than an
    uninterrupted one. A forward without gradients therefore runs with the random state forked and the cache
    off (same dtype, so the inferred shapes and dtypes are the real ones). Evaluation, the other gradient-free
    forward, has no dropout and loses nothing by it."""
    forks: list = []

    def enter(module, args) -> None:
        if torch.is_grad_enabled():
            return
        contexts = [torch.random.fork_rng(devices=[device] if device.type == "cuda" else [],
                                          device_type=device.type)]
        if torch.is_autocast_enabled(device.type):
            contexts.append(torch.autocast(device.type, dtype=torch.get_autocast_dtype(device.type),
                                           cache_enabled=False))
        for c in contexts:
            c.__enter__()
        forks.append(contexts)

    def leave(module, args, output) -> None:
        if not torch.is_grad_enabled() and forks:
            for c in reversed(forks.pop()):
                c.__exit__(None, None, None)

    stage.register_forward_pre_hook(enter)
    stage.register_forward_hook(leave)


class PipelineSchedule:
    """A schedule over this rank's stages; `step` trains on the loop's micro-batches, `forward_loss` evaluates."""

    def __init__(self, stages: dict[int, nn.Module], n_stages: int, schedule: str, n_microbatches: int,
                 pp_group, device: torch.device) -> None:
        from torch.distributed import pipelining

        self.stages, self.n_stages, self.group, self.device = stages, n_stages, pp_group, device
        self.pp = torch_dist.get_world_size(pp_group)
        self.pp_rank = torch_dist.get_rank(pp_group)
        self.last_rank = torch_dist.get_global_rank(pp_group, (n_stages - 1) % self.pp)
        self.m = n_microbatches
        self._losses: list[torch.Tensor] = []
        self._factor, self._loss_fn, self._scaler = 1.0, None, None
        for mod in stages.values():
            isolate_shape_inference(mod, device)
        runtime = [pipelining.PipelineStage(mod, s, n_stages, device, group=pp_group) for s, mod in stages.items()]
        cls = getattr(pipelining, SCHEDULES[schedule])
        # scale_grads=False: the loss is divided by micro-batches x accumulation here, so gradients
        # accumulated over several schedule steps are not rescaled by each.
        self.schedule = cls(runtime if len(runtime) > 1 or schedule == INTERLEAVED else runtime[0],
                            n_microbatches, loss_fn=self._loss, scale_grads=False)

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = self._loss_fn(output, target) * self._factor
        self._losses.append(loss.detach())
        return self._scaler.scale(loss) if self._scaler is not None else loss

    def step(self, micro_batches: list, loss_fn, scaler) -> torch.Tensor:
        """Forward and backward of every micro-batch; the mean loss, on every rank of the pipeline."""
        self._loss_fn, self._scaler, self._factor = loss_fn, scaler, 1.0 / (self.m * len(micro_batches))
        losses = []
        for x, y in micro_batches:
            args = (x,) if 0 in self.stages else ()
            target = y if self.n_stages - 1 in self.stages else None
            self._losses = []
            self.schedule.step(*args, target=target)
            # The micro-batches' own losses are the last m: the first step's shape inference may call the
            # loss function on its placeholder output too.
            losses += self._losses[-self.m:]
        total = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
        return self._from_last(total)

    def _from_last(self, value: torch.Tensor) -> torch.Tensor:
        value = value.float().contiguous()
        torch_dist.broadcast(value, src=self.last_rank, group=self.group)
        return value

    @torch.no_grad()
    def forward_loss(self, x: torch.Tensor, y: torch.Tensor, loss_fn) -> torch.Tensor:
        """Forward only, stage after stage (evaluation; torch 2.8's schedules have no eval step)."""
        act = x
        for s in range(self.n_stages):
            if s not in self.stages:
                continue
            prev = (s - 1) % self.pp
            if s > 0 and prev != self.pp_rank:
                act = self._recv(prev)
            act = self.stages[s](act)
            nxt = (s + 1) % self.pp
            if s < self.n_stages - 1 and nxt != self.pp_rank:
                self._send(act, nxt)
        loss = loss_fn(act, y) if self.n_stages - 1 in self.stages else torch.zeros((), device=self.device)
        return self._from_last(loss)

    _DTYPES = (torch.float32, torch.bfloat16, torch.float16)

    def _send(self, t: torch.Tensor, peer: int) -> None:
        dst = torch_dist.get_global_rank(self.group, peer)
        header = torch.tensor([self._DTYPES.index(t.dtype), t.dim(), *t.shape, *[0] * (6 - t.dim())],
                              dtype=torch.int64, device=self.device)
        torch_dist.send(header, dst, group=self.group)
        torch_dist.send(t.contiguous(), dst, group=self.group)

    def _recv(self, peer: int) -> torch.Tensor:
        src = torch_dist.get_global_rank(self.group, peer)
        header = torch.empty(8, dtype=torch.int64, device=self.device)
        torch_dist.recv(header, src, group=self.group)
        dtype, ndim = self._DTYPES[int(header[0])], int(header[1])
        out = torch.empty(header[2 : 2 + ndim].tolist(), dtype=dtype, device=self.device)
        torch_dist.recv(out, src, group=self.group)
        return out


def gather_full_state_dict(model: nn.Module, is_main: bool) -> dict[str, torch.Tensor]:
    """The whole model's tensors on global rank 0 (empty elsewhere): each pipeline rank's parts, gathered
    whole over their data/tensor groups, then over the pipeline group that holds rank 0. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    group = model.pipeline_group
    ranks = torch_dist.get_process_group_ranks(group)
    if 0 not in ranks:
        return {}
    parts = [None] * len(ranks) if is_main else None
    torch_dist.gather_object(state, parts, dst=0, group=group)
    return {k: v for p in parts for k, v in p.items()} if is_main else {}
