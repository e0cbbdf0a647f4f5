"""Each GPU's peak dense tensor-core FLOP/s, defined once: the planner divides by it (jobs.catalog.GPUS) and the
MFU metric divides by it (training.metrics.logger.PEAK_FLOPS). Two copies once disagreed (A10G 125 against 70).

Dense (not 2:1 sparse) tensor-core bf16 with fp32 accumulation (fp16 on V100 and T4, which have no bf16), per
GPU, TFLOP/s, from NVIDIA's data sheets (nvidia.com/en-us/data-center/<gpu>/, SXM parts).

A10G: NVIDIA publishes no data sheet for it (it is AWS's build of GA102 for G5). The A10's data sheet says 125
dense bf16 (250 with sparsity): that is the A10 at 72 SMs x 1,024 dense FP16/BF16 FLOP per SM per clock (the GA102
whitepaper's 512 FMA, table 6) x 1.695 GHz. The A10G's published comparisons (Baseten, "NVIDIA A10 vs A10G for ML
model inference") give it 70 TFLOP/s of bf16 tensor compute: half the rate its 80 SMs would give at full rate, the
GeForce GA102's halved rate with fp32 accumulation. We keep 70 (what a bf16 training matmul can reach); we could
not read an NVIDIA document that states it, so it is the less certain figure of this table.
"""

from __future__ import annotations

PEAK_TFLOPS: dict[str, float] = {
    "V100": 125,  # [v100] SXM2: 125 fp16
    "T4": 65,  # [t4] 65 fp16
    "A100": 312,  # [a100] SXM4: 312 bf16 (40 GB and 80 GB alike)
    "A10G": 70,  # see the module docstring (the A10 data sheet's 125 is another part)
    "L4": 121,  # [l4] 121 bf16 dense (242 sparse)
    "L40S": 362,  # [l40s] 362 bf16 dense (733 sparse)
    "H100": 989,  # [h100] SXM5: 989 bf16 dense
    "H200": 989,  # [h200] SXM: 989 bf16 dense
    "B200": 2250,  # [b200] HGX B200: 2.25 PFLOPS bf16 dense per GPU
}


def peak_tflops(device_name: str) -> float | None:
    """The peak for a device name such as 'NVIDIA H100 80GB HBM3' or a catalog key ('A100'); None when unknown.
    Longer keys first, so 'A100' is never read as another part's name inside it."""
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if key in device_name:
            return PEAK_TFLOPS[key]
    return None
