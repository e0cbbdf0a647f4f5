"""Seconds per optimizer step: compute at an achievable fraction of peak, memory traffic, and the collectives
each strategy runs, overlapped where the strategy overlaps them.

Compute per micro-batch on one GPU = matmul FLOPs / (peak x matmul_efficiency(GPU, width)) + attention FLOPs /
(peak x attention efficiency) + traffic x activation bytes / memory bandwidth, plus the fused AdamW pass (28 B per
local parameter: read p, g, m, v; write p, m, v). The efficiencies per GPU generation and software stack, and the
traffic, are fitted to published runs on A100 and H100 and to the package's runs on one H100 (the constants below
say how, and what the fit leaves).
Communication: ring collectives on NVLink/PCIe inside a node and EFA between nodes (`collective`: the slower of the
two for a ring that crosses nodes, a latency that grows with the node count and a message-size knee; fitted to
nccl-tests on AWS; a collective hidden behind compute slows it by CONTENTION of its time); a node's NIC
carries every group that crosses it. A pipeline runs at its slowest stage: the
even share of compute is scaled by ModelFacts.pipeline_bottleneck, the same cut the training package makes
(contract.pipeline_cut; gpt/125m on 8 stages: 2.66x, its last stage holding the output projection).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from jobs.catalog import GpuSpec, InstanceSpec
from jobs.planning.layout import Layout, Numerics
from jobs.planning.memory import activation_bytes, optimizer_bytes
from jobs.planning.shape import ModelFacts

# Compute efficiency depends on the GPU generation and on the software stack that runs on it: kernels improve (MPT's
# 2023 H100 runs, flash-attention 1 and torch 2.1, reach 54% of the peak in their matmuls and 30% in attention; the
# package on torch 2.11 reaches 81%, what an 8192^3 bf16 matmul does alone), and fused stacks move fewer bytes. So
# each stack has its Efficiency per generation: PACKAGE is what the planner predicts the package with;
# jobs.planning.calibration.PUBLISHED is the published runs' (llm-foundry, torchtitan, Megatron 2022) and
# calibration.MEGATRON NeMo's Megatron-Core with Transformer Engine (NVIDIA's DGX Cloud recipes), through which the
# shared constants (WIDTH_HALF, OVERLAP, CONTENTION) are fitted. All are fitted at once by `python -m tools.fit_planner`
# (scipy's least squares on log(predicted / measured) throughput) over the published
# rows kept for fitting (every second row of each table, jobs/planning/published_runs.json, and calibration.ROWS)
# and the package's own runs on one H100 (calibration.OWN_RUNS); the other published rows are held out and checked by
# tests/jobs/test_planner_calibration.py. The fit (2026-11-29): package hopper matmul 0.813 (attention taken at the
# matmul rate: six runs cannot tell them apart), ampere 0.691 / attention 0.527 (no own A100 run: the published
# stack's, borrowed), package traffic 10.40; published hopper 0.550 / 0.294, traffic 3.61; Megatron hopper 0.666
# (attention at the matmul rate), traffic 5.57; WIDTH_HALF 104, OVERLAP 0.77, CONTENTION 0.122 (refitted when a pipeline
# stage boundary was charged as every rank sending its sequence shard, and Megatron's sends as run beside its
# compute). Held out: A100 mean |error| 3.5% (69 rows, 5 beyond 15%), H100 3.8% (43 rows, none beyond 12%); the
# package's runs within 10.1% (gpt 350m predicted slower).
# Generations without a row borrow a neighbour's Efficiency (BORROWED): an assumption, and their candidates carry no
# error band (jobs.planning.calibration.calibration_of).


@dataclass(frozen=True)
class Efficiency:
    matmul: float  # share of the data-sheet peak (contract.gpus) the matmuls' FLOPs run at, at full width
    attention: float  # share attention's FLOPs (ModelFacts.attention_flops_per_sample) run at
    traffic: float  # bytes of memory traffic per activation byte saved (every elementwise pass's reads and writes)
    # How the stack synchronizes, where it differs from the package (the defaults): bytes a gradient element moves in
    # the data-parallel reduction (the package reduces fp32 gradients), the bucket it sends at once (torch DDP's
    # bucket_cap_mb default, 25 MiB, which the package keeps; or more per data-parallel rank, as Megatron grows its
    # buckets with the data-parallel size), and whether tensor parallelism's collectives run beside the matmuls
    # (Transformer Engine's userbuffers) rather than between them (the package's DTensor collectives).
    gradient_bytes: int = 4
    bucket_bytes: float = 25 * 2**20
    bucket_bytes_per_rank: float = 0.0
    tensor_overlap: bool = False
    # Pipeline sends run beside the compute (Megatron's) rather than before the stage that waits for them.
    p2p_overlap: bool = False


PACKAGE = {"ampere": Efficiency(matmul=0.69, attention=0.53, traffic=10.4),
           "hopper": Efficiency(matmul=0.81, attention=0.81, traffic=10.4)}
BORROWED = {"volta": "ampere", "turing": "ampere", "ada": "ampere", "blackwell": "hopper"}
# Per-GPU matmul width w (hidden / tensor degree) runs at w / (w + WIDTH_HALF) of the full-width share: tensor
# parallelism's narrower matmuls run slower (tensor 8 on a 4,096-wide model: 82%).
WIDTH_HALF = 104.0
# torch.compile fuses elementwise passes: gpt 1b 225.7 -> 205.5 ms on one H100, measured.
COMPILED_TRAFFIC = 0.64
# Checkpointing repeats each block's forward (not the head's): measured 269.9 / 225.7 ms on gpt 1b.
RECOMPUTE_FACTOR = 269.9 / 225.7
SELECTIVE_MATMUL_SHARE = 5 / 12  # proj (h^2) and out (4h^2) of a GPT block's 12 h^2 matmul weights
# Collectives, fitted (`python -m tools.fit_planner`) to nccl-tests all_reduce on AWS from 64 KiB to
# 16 GiB (jobs/planning/published_collectives.json: one p5, 2 to 32 p5s, two p4des; every second size held out): the
# share of the link's rate a ring reaches on large messages, inside a node (NVLink) and between nodes (EFA, the
# instance's network_gbits), the time any collective takes, and the message size at which half the rate is reached
# (NCCL's protocols and chunks). Fitted 2026-11-29: held-out sizes mean 14.6%, largest 41% (at 4 to 32 nodes 25%).
# Beyond 32 nodes the latency's growth is extrapolated.
NVLINK_EFFICIENCY = 0.915
EFA_EFFICIENCY = 0.668
NODE_LATENCY_S = 20.3e-6  # a collective inside one node
NETWORK_LATENCY_S = 133e-6  # one that crosses two nodes
# ... and its growth per doubling of the nodes beyond two: on 4 to 32 p5s the time of a mid-size all-reduce grows with
# the node count's logarithm (NCCL's tree and the ring's pipeline fill), which a fixed latency put 2.5x fast at 32.
NETWORK_LATENCY_GROWTH = 1.61
NODE_HALF_BYTES = 0.48e6
NETWORK_HALF_BYTES = 4.75e6
OVERLAP = 0.77  # share of a compute phase a bucketed/prefetched collective hides behind (fitted, see above)
# ... and what hiding costs: a collective running beside the compute takes SMs and memory bandwidth from it (NCCL's
# kernels run on the same GPU), so the compute it hides behind is slowed by this share of the hidden time (fitted with
# the rest: 0.122; without it the held-out H100 rows reached +15.1%, MPT-70B on 32 H100s whose per-micro-batch
# gathers and reduce-scatters are hidden but not free, and every H100 row is now within 12%).
CONTENTION = 0.122


@dataclass(frozen=True)
class StepTime:
    compute: float  # seconds of computation per step (all micro-batches, bubbles included)
    exposed_comm: float  # seconds of communication not hidden behind compute
    bubble: float  # pipeline idle fraction

    @property
    def total(self) -> float:
        return self.compute + self.exposed_comm


def pipeline_bubble(stages: int, per_rank: int, microbatches: int) -> float:
    """The share of a pipeline step its ranks idle, filling and draining `stages` stages (`per_rank` of them a rank)
    around `microbatches` micro-batches: (p - 1) / (v m + p - 1), as torch's schedules run them."""
    return (stages - 1) / (per_rank * microbatches + stages - 1) if stages > 1 else 0.0


def generation(gpu: GpuSpec) -> str:
    """The generation whose fitted constants this GPU uses (its own, or the one it borrows)."""
    return gpu.generation if gpu.generation in PACKAGE else BORROWED[gpu.generation]


Stack = dict  # generation -> Efficiency (PACKAGE, or calibration.PUBLISHED)


def matmul_efficiency(gpu: GpuSpec, width: float, stack: Stack | None = None) -> float:
    """Share of `gpu`'s peak the matmuls run at, for per-GPU matmuls `width` wide (0: unknown, the full share)."""
    e = (stack or PACKAGE)[generation(gpu)].matmul
    return e * width / (width + WIDTH_HALF) if width else e


@functools.lru_cache(maxsize=4096)
def _unsplit_activation_bytes(m: ModelFacts, n: Numerics) -> float:
    """What one GPU would keep of a micro-batch's forward without checkpointing, the full loss's bytes (the traffic
    proxy). Cached: micro_compute runs twice per candidate and the value depends on the model and numerics only."""
    return activation_bytes(m, replace(n, activation_checkpointing=False), Layout(1, 1), loss="full")


def micro_compute(m: ModelFacts, n: Numerics, spec: InstanceSpec, layout: Layout, stack: Stack | None = None) -> float:
    """Seconds of one micro-batch's forward and backward on one GPU of this layout (`stack`: whose efficiencies,
    the package's by default)."""
    gpu, eff = spec.gpu, (stack or PACKAGE)[generation(spec.gpu)]
    split = layout.tensor * layout.pipeline
    flops = m.flops_per_sample * n.micro_batch / split
    # The traffic proxy the constants were fitted with: the full loss's bytes, whichever form the run computes
    # (jobs.planning.memory: the chunked and the compiled loss run the same passes over the logits).
    saved = _unsplit_activation_bytes(m, n) / split
    traffic = saved * eff.traffic * (COMPILED_TRAFFIC if n.compile else 1.0)
    attention = m.attention_flops_per_sample * n.micro_batch / split
    efficiency = matmul_efficiency(gpu, m.hidden / layout.tensor, stack)
    matmul_s = (flops - attention) / (gpu.peak_tflops * 1e12 * efficiency)
    attention_s = attention / (gpu.peak_tflops * 1e12 * eff.attention)
    traffic_s = traffic / (gpu.memory_gbps * 1e9)
    total = matmul_s + attention_s + traffic_s
    # Checkpointing repeats the checkpointed blocks' forward (every one, or every k-th: checkpointed_share).
    # Selective checkpointing recomputes the elementwise passes (all of the traffic) and 5 of a block's 12 h^2 matmul
    # weights (proj and out, training.models.speedups), not attention: that share of full recomputation's measured
    # cost.
    share = (SELECTIVE_MATMUL_SHARE * matmul_s + traffic_s) / total if n.selective else 1.0
    return total * (1 + (RECOMPUTE_FACTOR - 1) * share * n.checkpointed_share(m.layers or 1))


def collective(kind: str, payload: float, spec: InstanceSpec, per_node: int, nodes: int, groups: int) -> float:
    """Seconds of a ring all-reduce ('ar') or all-gather/reduce-scatter ('ag') of `payload` bytes per GPU over a
    group with `per_node` GPUs in each of `nodes` nodes; `groups` such groups share each node's NIC."""
    f, payload = (2.0 if kind == "ar" else 1.0), max(payload, 1.0)
    inside = f * (per_node - 1) / per_node * payload / (spec.gpu.link_gbps * 1e9 * NVLINK_EFFICIENCY)
    if nodes == 1:
        return NODE_LATENCY_S + inside * (1 + NODE_HALF_BYTES / payload)
    # A ring through several nodes moves its chunks over every link at once: the slower one sets the pace.
    between = groups * f * (nodes - 1) / nodes * payload / (spec.network_gbits / 8 * 1e9 * EFA_EFFICIENCY)
    latency = NETWORK_LATENCY_S * (1 + NETWORK_LATENCY_GROWTH * math.log2(nodes / 2))
    return latency + max(inside, between) * (1 + NETWORK_HALF_BYTES / payload)


def _exposed(comm: float, window: float) -> float:
    """Seconds a collective of `comm` seconds adds to a compute phase of `window` seconds it overlaps: what does not
    fit behind OVERLAP of the phase, and CONTENTION of what does."""
    hidden = min(comm, OVERLAP * window)
    return comm - hidden + CONTENTION * hidden


def _data_parallel_comm(m: ModelFacts, n: Numerics, spec: InstanceSpec, lay: Layout, fwd: float, bwd: float,
                        accum: int, eff: Efficiency) -> float:
    """Exposed seconds per step of the data-parallel collectives (DDP, FSDP, HSDP, and the data dimension of
    tp/pp/hybrid), given one micro-batch's forward and backward seconds, as the stack of `eff` runs them."""
    a, r, g = n.compute_bytes, eff.gradient_bytes, lay.gpus_per_node
    local = m.params / (lay.tensor * lay.pipeline)  # parameters one data-parallel group moves
    if lay.shard == 1 and lay.replicate == 1:
        return 0.0
    # A node's GPUs split into tensor/pipeline ranks first; a data-parallel group takes one GPU of each tensor
    # group, so it has g // tensor GPUs in a node and all of the node's groups share its NIC.
    # A pipeline stage of part of a node (more stages than nodes) keeps its data ranks inside that node.
    dp_per_node = min(lay.data_parallel, max(1, g // lay.tensor))
    if lay.shard == 1:  # DDP: the gradients all-reduced bucket by bucket, overlapped with the last backward
        per_node = min(lay.replicate, dp_per_node)
        bucket = max(eff.bucket_bytes, eff.bucket_bytes_per_rank * lay.replicate)
        buckets = max(1, math.ceil(r * local / bucket))
        t = buckets * collective("ar", r * local / buckets, spec, per_node, lay.replicate // per_node, g // per_node)
        return _exposed(t, bwd)
    shard_per_node = min(lay.shard, dp_per_node)
    shard_nodes = lay.shard // shard_per_node
    groups = g // shard_per_node
    # FSDP gathers and reduce-scatters unit by unit (each block, and the root's embedding and head): each of those
    # collectives pays its own latency, which grows with the node count.
    units = (m.layers or 0) + 1
    gather = units * collective("ag", a * local / units, spec, shard_per_node, shard_nodes, groups)
    scatter = units * collective("ag", r * local / units, spec, shard_per_node, shard_nodes, groups)
    regather = gather if n.reshard_after_forward else 0.0
    per_micro = _exposed(gather, fwd) + _exposed(regather, bwd)
    # The reduce-scatter (and HSDP's all-reduce after it) once a step, or after every micro-batch when the shards
    # accumulate (fsdp_accumulation sharded), each overlapped with its own backward.
    syncs = 1 if n.keeps_unsharded_gradients(lay) else accum
    exposed = accum * per_micro + syncs * _exposed(scatter, bwd)
    if lay.replicate > 1:  # HSDP: the shard's gradients all-reduced across replicas, after the reduce-scatter
        exposed += syncs * units * collective("ar", r * local / lay.shard / units, spec, 1, lay.replicate,
                                              g // lay.tensor)
    return exposed


def step_time(m: ModelFacts, n: Numerics, spec: InstanceSpec, lay: Layout, stack: Stack | None = None) -> StepTime:
    """`n`: the rank's numerics (micro_batch_size per rank). Each of the rank's `accum` micro-batches is one forward
    and backward of the batch group's pooled samples; with a pipeline, one pipeline step of `chunks` forward
    passes that fills and drains the pipeline (training.parallel.pipeline_parallel.PipelineSchedule.step runs a schedule per micro-batch)."""
    accum, chunks, stages, v = n.accum(n.readers(lay)), lay.chunks(), lay.pipeline, lay.stages_per_rank
    eff = (stack or PACKAGE)[generation(spec.gpu)]
    fwd_n = n.forward(lay)
    # A pipeline runs at its slowest stage's pace: an even split of the work is the best case.
    micro = micro_compute(m, fwd_n, spec, lay, stack) * m.pipeline_bottleneck(stages)
    fwd, bwd = micro / 3, 2 * micro / 3
    # Forward-backward slots per GPU, bubbles included. Fill and drain take stages - 1 stage-times; a rank holding
    # v stages (interleaved 1F1B) runs each in 1/v of a slot, so its bubble is (p - 1) / (v m + p - 1), as torch's
    # ScheduleInterleaved1F1B (and Narayanan et al. 2021, section 2.2) have it.
    slots = accum * (chunks + (stages - 1) / v)
    bubble = pipeline_bubble(stages, v, chunks)
    compute = micro * slots
    local = m.params / (lay.tensor * lay.pipeline)
    compute += (optimizer_bytes(int(local), 0, n.optimizer) + 12 * local) / (spec.gpu.memory_gbps * 1e9)
    comm = _data_parallel_comm(m, n, spec, lay, fwd, bwd, accum * chunks, eff)
    if lay.tensor > 1:  # 4 all-reduce-sized exchanges of the block output per block per forward pass, exposed
        tokens = fwd_n.micro_batch * m.tokens
        per_block = 4 * collective("ar", n.compute_bytes * tokens * m.hidden, spec, lay.tensor, 1, 1)
        tensor_comm = per_block * -(-m.layers // stages)
        # ... unless the stack runs them beside the matmuls: then hidden behind the forward and backward they split.
        comm += slots * (_exposed(tensor_comm, micro) if eff.tensor_overlap else tensor_comm)
    if stages > 1:  # activations and their gradients across each stage boundary, per forward pass and stage held
        # What crosses a stage boundary a forward pass: each rank of the stage sends its peer in the next its
        # sequence shard, 1/tp of the activation (the package keeps the sequence split across the boundary,
        # training.parallel.strategies.pp, as Megatron does; without sequence parallelism, or where the sequence
        # does not split evenly, it sends all of it, which is not charged), every rank of the stage on a node
        # through the node's NIC at once. A send of `sent` bytes is an all-gather of twice that between two ranks; on
        # one node each pair has its own NVLink.
        sent = n.compute_bytes * fwd_n.micro_batch * m.tokens * m.hidden / lay.tensor
        senders = min(lay.gpus_per_node, lay.gpus // stages)
        hop = collective("ag", 2 * sent, spec, 2, 1, 1) if lay.nodes == 1 else \
            collective("ag", 2 * sent, spec, 1, 2, senders)
        hops = 2 * v * slots * hop
        # The package's schedule waits for each stage's input before computing it; Megatron's runs its sends beside
        # the compute (NeMo's overlap_p2p_comm; its batched sends, as fitted, alike).
        comm += _exposed(hops, compute) if eff.p2p_overlap else hops
    return StepTime(compute, comm, bubble)
