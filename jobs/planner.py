"""`strategy: "auto"`: pick ddp or fsdp from the model's size and the GPUs' memory.

A rule of thumb, not a simulator: mixed-precision training with AdamW keeps about 16 bytes per parameter
(bf16 weights and grads, fp32 master weights and two Adam moments), and activations need the rest, so a
replica fits when 16 x params takes at most 60% of one GPU's memory. Otherwise fully shard (FSDP) the
16 bytes over every GPU of the job. The parameter counts are those of the training package's presets.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs import catalog

BYTES_PER_PARAM = 16
STATE_FRACTION = 0.6  # of GPU memory for parameters, gradients and optimizer state

# Approximate parameter counts of training's model presets (gpt: GPT-2-style; vit: ViT-B/L/H).
PRESET_PARAMS = {
    ("gpt", "tiny"): 40e3, ("gpt", "small"): 10e6, ("gpt", "125m"): 125e6, ("gpt", "350m"): 350e6,
    ("gpt", "1b"): 1.0e9, ("gpt", "7b"): 6.7e9,
    ("vit", "tiny"): 5.7e6, ("vit", "base"): 86e6, ("vit", "large"): 304e6, ("vit", "huge"): 632e6,
}


@dataclass(frozen=True)
class Plan:
    strategy: str
    reason: str


def plan(model: str, model_size: str, instance_type: str, instance_count: int) -> Plan:
    spec = catalog.lookup(instance_type)
    params = PRESET_PARAMS.get((model, model_size))
    if spec is None or spec.kind != "gpu":
        return Plan("ddp", f"{instance_type} has no NVIDIA GPUs: plain data parallel")
    if params is None:
        return Plan("fsdp", f"size of {model}:{model_size} unknown: FSDP shards whatever fits")
    need_gib = params * BYTES_PER_PARAM / 2**30
    if instance_count * spec.accelerators == 1 or need_gib <= STATE_FRACTION * spec.accelerator_memory_gib:
        return Plan("ddp" if instance_count * spec.accelerators > 1 else "single",
                    f"~{need_gib:.1f} GiB of training state fits one {spec.accelerator_memory_gib} GiB {spec.accelerator}")
    world = instance_count * spec.accelerators
    return Plan("fsdp", f"~{need_gib:.1f} GiB of training state sharded over {world} GPUs is "
                        f"{need_gib / world:.1f} GiB each")
