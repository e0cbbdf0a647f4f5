"""The ML training instance types people use, with what the launcher needs to know about each.

Figures come from AWS's published specifications: the "Accelerated computing" and "Compute/General
purpose" pages of Amazon EC2 instance types (https://aws.amazon.com/ec2/instance-types/), the per-family
pages (p4, p5, p6, g5, g6, g6e, trn1, trn2) and Amazon SageMaker AI pricing
(https://aws.amazon.com/sagemaker/ai/pricing/), as of 2025. `local_nvme` follows the EC2 "Instance store
volumes" list: on those types SageMaker mounts the instance store, and CreateTrainingJob rejects a
VolumeKmsKeyId (the ResourceConfig API reference says so), so the renderer leaves it out there.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def accelerated(self) -> bool:
        return self.kind != "cpu"

    @property
    def family(self) -> str:
        return self.instance_type.split(".")[1]


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
