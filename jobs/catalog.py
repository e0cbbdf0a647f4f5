"""The ML training instance types people use, with what the launcher and the planner need to know about each.

Sources (every figure below cites one of these by its tag):
  [ec2]    Amazon EC2 instance types, "Accelerated computing" and "Compute/General purpose" pages and the
           per-family pages (https://aws.amazon.com/ec2/instance-types/p4/, /p5/, /g5/, /g6/, /g6e/, /p3/,
           /trn1/): GPUs, vCPUs, memory, EFA, network bandwidth (Gbit/s per instance), instance store.
  [smp]    SageMaker AI on-demand *training* prices are not kept here: they change, differ by region, and no public
           source for them could be read and cited when this catalog was checked (2026; the pricing page draws its
           table with JavaScript). The figures kept here before were a 2024 list written from memory, without a
           source, so they were removed. The planner takes its prices as an input instead (jobs.planning.
           plan_request(prices=...): instance type -> USD per hour); `trainctl plan --prices` reads them from the
           AWS Price List API (cli/price_source.py, which cites the API's documentation) or from a file the user
           writes. Without a table a type's cost is "price unknown" and sizing.budget_usd cannot be checked.
  [spot]   ASSUMPTIONS, not published figures for these instance types. AWS states only an upper bound for the
           saving: managed Spot training optimizes cost "up to 90%" over on demand (SageMaker developer guide,
           model-managed-spot-training.html). The Spot Instance Advisor (https://aws.amazon.com/ec2/spot/
           instance-advisor/) publishes per-type savings and an interruption band (its highest: ">20%" of
           instances a month) for EC2, not for SageMaker; we did not read its current values for these types.
           We take a 60% saving and 20% of instances interrupted a month: change them here if you know better.
  [v100] [a100] [h100] [h200] [b200] [a10] [l4] [l40s] [t4]: NVIDIA data sheets (nvidia.com/en-us/data-center/
           <gpu>/): memory bandwidth GB/s, NVLink GB/s per GPU (both directions; a ring uses one, half of it);
           the peak TFLOPS are kept in contract.gpus (one table with the MFU metric's, its sources there).
  [pcie]   PCI Express 4.0 x16: 32 GB/s each way (PCI-SIG); g5/g6/g6e GPUs talk over PCIe, without NVLink.
`local_nvme` follows the EC2 "Instance store volumes" list: on those types SageMaker mounts the instance store,
and CreateTrainingJob rejects a VolumeKmsKeyId (the ResourceConfig API reference says so), so the renderer
leaves it out there. trn1/trn2 are listed (requests may name them) but marked not runnable: the training
package runs on CUDA or CPU only.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.gpus import PEAK_TFLOPS


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator's speeds: what the planner's time model divides by."""

    peak_tflops: float  # dense tensor-core bf16 (fp16 where there is no bf16), per GPU: contract.gpus
    memory_gbps: float  # HBM/GDDR bandwidth, GB/s
    link_gbps: float  # GPU-to-GPU inside the instance, GB/s one way (NVLink, or PCIe)
    generation: str  # the architecture, which the planner's matmul efficiency is fitted per (jobs.planning.timing)
    bf16: bool = True  # native bf16 (V100 and T4 have none: `precision: auto` then runs emulated)


def _gpu(name: str, memory_gbps: float, link_gbps: float, generation: str, bf16: bool = True) -> GpuSpec:
    return GpuSpec(PEAK_TFLOPS[name], memory_gbps, link_gbps, generation, bf16)


# Peaks: contract.gpus (the one table, shared with the MFU metric). Bandwidths:
GPUS: dict[str, GpuSpec] = {
    "V100": _gpu("V100", 900, 150, "volta", bf16=False),  # [v100] SXM2: 900 GB/s, NVLink 300 GB/s
    "A100": _gpu("A100", 1555, 300, "ampere"),  # [a100] SXM4 40GB: 1,555 GB/s, NVLink 600 GB/s
    "A100-80": _gpu("A100", 2039, 300, "ampere"),  # [a100] SXM4 80GB: 2,039 GB/s
    "H100": _gpu("H100", 3350, 450, "hopper"),  # [h100] SXM5: 3.35 TB/s, NVLink 900 GB/s
    "H200": _gpu("H200", 4800, 450, "hopper"),  # [h200] SXM: 4.8 TB/s, NVLink 900 GB/s
    "B200": _gpu("B200", 8000, 900, "blackwell"),  # [b200] HGX B200: 8 TB/s, NVLink 1.8 TB/s
    "A10G": _gpu("A10G", 600, 32, "ampere"),  # [a10] A10 (A10G is AWS's build): 600 GB/s; [pcie]
    "L4": _gpu("L4", 300, 32, "ada"),  # [l4] 300 GB/s; [pcie]
    "L40S": _gpu("L40S", 864, 32, "ada"),  # [l40s] 864 GB/s; [pcie]
    "T4": _gpu("T4", 320, 32, "turing", bf16=False),  # [t4] 320 GB/s; [pcie]
}

# [ec2] network bandwidth per instance, Gbit/s ("up to N" sizes get N: burst, not sustained, so the planner
# treats them as the slow types they are). EFA bandwidth is the same figure on EFA sizes.
NETWORK_GBITS: dict[str, float] = {
    "p3.2xlarge": 10, "p3.8xlarge": 10, "p3.16xlarge": 25, "p3dn.24xlarge": 100,
    "p4d.24xlarge": 400, "p4de.24xlarge": 400, "p5.48xlarge": 3200, "p5e.48xlarge": 3200, "p5en.48xlarge": 3200,
    "p6-b200.48xlarge": 3200,
    "g4dn.xlarge": 25, "g4dn.2xlarge": 25, "g4dn.4xlarge": 25, "g4dn.8xlarge": 50, "g4dn.12xlarge": 50,
    "g4dn.16xlarge": 50,
    "g5.xlarge": 10, "g5.2xlarge": 10, "g5.4xlarge": 25, "g5.8xlarge": 25, "g5.12xlarge": 40, "g5.16xlarge": 25,
    "g5.24xlarge": 50, "g5.48xlarge": 100,
    "g6.xlarge": 10, "g6.2xlarge": 10, "g6.4xlarge": 25, "g6.8xlarge": 25, "g6.12xlarge": 40, "g6.16xlarge": 25,
    "g6.24xlarge": 50, "g6.48xlarge": 100,
    "g6e.xlarge": 20, "g6e.2xlarge": 20, "g6e.4xlarge": 20, "g6e.8xlarge": 25, "g6e.12xlarge": 100,
    "g6e.16xlarge": 35, "g6e.24xlarge": 200, "g6e.48xlarge": 400,
    "trn1.2xlarge": 12.5, "trn1.32xlarge": 800, "trn1n.32xlarge": 1600, "trn2.48xlarge": 3200,
}

SPOT_SAVINGS = 0.60  # [spot] ASSUMPTION: Spot's saving over on demand (AWS states "up to 90%")
SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH = 0.20  # [spot] ASSUMPTION: the Spot Instance Advisor's highest band, ">20%"


@dataclass(frozen=True)
class InstanceSpec:
    instance_type: str
    kind: str  # "gpu", "neuron" (AWS Trainium) or "cpu"
    accelerators: int  # GPUs, or Trainium chips; 0 for CPU
    accelerator: str  # "A100", "H100", ...; "" for CPU
    accelerator_memory_gib: int  # per accelerator
    vcpus: int
    memory_gib: int
    efa: bool  # Elastic Fabric Adapter available
    local_nvme: bool  # instance store volumes: no VolumeKmsKeyId
    network_gbits: float = 0.0  # per instance, Gbit/s [ec2]

    @property
    def accelerated(self) -> bool:
        return self.kind != "cpu"

    @property
    def family(self) -> str:
        return self.instance_type.split(".")[1]

    @property
    def runnable(self) -> bool:
        """Can the training package run here? It is CUDA or CPU PyTorch: not on Trainium (Neuron)."""
        return self.kind != "neuron"

    @property
    def gpu(self) -> GpuSpec | None:
        if self.kind != "gpu":
            return None
        key = f"{self.accelerator}-80" if self.accelerator == "A100" and self.accelerator_memory_gib == 80 else \
            self.accelerator
        return GPUS[key]


def _family(kind, accelerator, memory_gib, efa_sizes, local_nvme, sizes):
    """One EC2 family: sizes maps size -> (accelerators, vcpus, memory_gib)."""
    return [
        InstanceSpec(
            instance_type=f"ml.{name}",
            kind=kind,
            accelerators=acc,
            accelerator=accelerator,
            accelerator_memory_gib=memory_gib,
            vcpus=vcpus,
            memory_gib=mem,
            efa=name.split(".")[1] in efa_sizes,
            local_nvme=local_nvme,
            network_gbits=NETWORK_GBITS.get(name, 0.0),
        )
        for name, (acc, vcpus, mem) in sizes.items()
    ]


_SPECS: list[InstanceSpec] = [
    # NVIDIA data-centre GPUs (8 per instance, NVLink/NVSwitch inside, EFA between instances).
    *_family("gpu", "V100", 16, (), False, {
        "p3.2xlarge": (1, 8, 61), "p3.8xlarge": (4, 32, 244), "p3.16xlarge": (8, 64, 488)}),
    *_family("gpu", "V100", 32, ("24xlarge",), True, {"p3dn.24xlarge": (8, 96, 768)}),
    *_family("gpu", "A100", 40, ("24xlarge",), True, {"p4d.24xlarge": (8, 96, 1152)}),
    *_family("gpu", "A100", 80, ("24xlarge",), True, {"p4de.24xlarge": (8, 96, 1152)}),
    *_family("gpu", "H100", 80, ("48xlarge",), True, {"p5.48xlarge": (8, 192, 2048)}),
    *_family("gpu", "H200", 141, ("48xlarge",), True, {
        "p5e.48xlarge": (8, 192, 2048), "p5en.48xlarge": (8, 192, 2048)}),
    *_family("gpu", "B200", 180, ("48xlarge",), True, {"p6-b200.48xlarge": (8, 192, 2048)}),
    # NVIDIA GPUs for smaller models and fine-tuning.
    *_family("gpu", "T4", 16, ("8xlarge", "12xlarge", "16xlarge"), True, {
        "g4dn.xlarge": (1, 4, 16), "g4dn.2xlarge": (1, 8, 32), "g4dn.4xlarge": (1, 16, 64),
        "g4dn.8xlarge": (1, 32, 128), "g4dn.12xlarge": (4, 48, 192), "g4dn.16xlarge": (1, 64, 256)}),
    *_family("gpu", "A10G", 24, ("8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge"), True, {
        "g5.xlarge": (1, 4, 16), "g5.2xlarge": (1, 8, 32), "g5.4xlarge": (1, 16, 64),
        "g5.8xlarge": (1, 32, 128), "g5.12xlarge": (4, 48, 192), "g5.16xlarge": (1, 64, 256),
        "g5.24xlarge": (4, 96, 384), "g5.48xlarge": (8, 192, 768)}),
    *_family("gpu", "L4", 24, ("8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge"), True, {
        "g6.xlarge": (1, 4, 16), "g6.2xlarge": (1, 8, 32), "g6.4xlarge": (1, 16, 64),
        "g6.8xlarge": (1, 32, 128), "g6.12xlarge": (4, 48, 192), "g6.16xlarge": (1, 64, 256),
        "g6.24xlarge": (4, 96, 384), "g6.48xlarge": (8, 192, 768)}),
    *_family("gpu", "L40S", 48, ("8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge"), True, {
        "g6e.xlarge": (1, 4, 32), "g6e.2xlarge": (1, 8, 64), "g6e.4xlarge": (1, 16, 128),
        "g6e.8xlarge": (1, 32, 256), "g6e.12xlarge": (4, 48, 384), "g6e.16xlarge": (1, 64, 512),
        "g6e.24xlarge": (4, 96, 768), "g6e.48xlarge": (8, 192, 1536)}),
    # AWS Trainium: accelerators counts chips (2 NeuronCores each on trn1, 8 on trn2).
    *_family("neuron", "Trainium", 32, ("32xlarge",), True, {
        "trn1.2xlarge": (1, 8, 32), "trn1.32xlarge": (16, 128, 512), "trn1n.32xlarge": (16, 128, 512)}),
    *_family("neuron", "Trainium2", 96, ("48xlarge",), True, {"trn2.48xlarge": (16, 192, 2048)}),
    # CPU: data preparation, heterogeneous-cluster data groups, smoke tests.
    *_family("cpu", "", 0, (), False, {
        "c5.xlarge": (0, 4, 8), "c5.2xlarge": (0, 8, 16), "c5.4xlarge": (0, 16, 32),
        "c5.9xlarge": (0, 36, 72), "c5.18xlarge": (0, 72, 144)}),
    *_family("cpu", "", 0, ("9xlarge", "18xlarge"), False, {
        "c5n.xlarge": (0, 4, 10), "c5n.2xlarge": (0, 8, 21), "c5n.4xlarge": (0, 16, 42),
        "c5n.9xlarge": (0, 36, 96), "c5n.18xlarge": (0, 72, 192)}),
    *_family("cpu", "", 0, (), False, {
        "m5.large": (0, 2, 8), "m5.xlarge": (0, 4, 16), "m5.2xlarge": (0, 8, 32), "m5.4xlarge": (0, 16, 64),
        "m5.12xlarge": (0, 48, 192), "m5.24xlarge": (0, 96, 384)}),
    *_family("cpu", "", 0, (), False, {
        "m6i.large": (0, 2, 8), "m6i.xlarge": (0, 4, 16), "m6i.2xlarge": (0, 8, 32),
        "m6i.4xlarge": (0, 16, 64), "m6i.8xlarge": (0, 32, 128), "m6i.12xlarge": (0, 48, 192),
        "m6i.16xlarge": (0, 64, 256), "m6i.24xlarge": (0, 96, 384), "m6i.32xlarge": (0, 128, 512)}),
    *_family("cpu", "", 0, (), False, {
        "c6i.xlarge": (0, 4, 8), "c6i.2xlarge": (0, 8, 16), "c6i.4xlarge": (0, 16, 32),
        "c6i.8xlarge": (0, 32, 64), "c6i.12xlarge": (0, 48, 96), "c6i.16xlarge": (0, 64, 128),
        "c6i.24xlarge": (0, 96, 192), "c6i.32xlarge": (0, 128, 256)}),
]

CATALOG: dict[str, InstanceSpec] = {spec.instance_type: spec for spec in _SPECS}


def lookup(instance_type: str) -> InstanceSpec | None:
    return CATALOG.get(instance_type)


def instance_types() -> list[str]:
    return sorted(CATALOG)
