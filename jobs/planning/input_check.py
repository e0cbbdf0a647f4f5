"""Can the loader keep up with the GPUs? The instance's vCPUs x the measured load rate per process, against the
samples/s the time model says the GPUs consume: the plan's input check (`trainctl plan` prints it, `--json` has
it, jobs.planning.warnings turns a shortfall into `io_bound`).

Which format the dataset is in, in this order:
  1. `sizing.data_format` in the request: the planner's view, like `model_shape`, and the one that always works
     (on FSx, or offline with `--platform FILE`, the plan reads nothing: it then needs no credentials and no
     network, and is the same for everyone who plans the request);
  2. the dataset's meta.json, which the prepare tools write: `trainctl plan` reads an S3 dataset's when it talks
     to AWS anyway (cli.dataset_meta) and passes it in; one that contradicts sizing.data_format is an error
     naming both;
  3. a decoder reads token shards (the training package's only format for one);
  4. otherwise unknown: the check says it cannot be made, and why (never a guess that would raise a false alarm).

The rates (contract.data_formats) were measured on a 2-vCPU development machine and scaled to a GPU instance's vCPU
by an assumption written there. With workers, the loader runs beside the step: the GPUs wait only for what the
workers cannot supply (share = 1 - supply / need). With `data_workers=0` each rank loads on its training thread
between steps: the wait is the whole load time (share = load / (load + compute)), an upper bound (on CUDA the
thread's load can overlap kernels already queued, where the step does not wait for the GPU). `data_workers:
auto` is the loader's own rule (contract.data_formats.auto_workers). `python -m bench.data` prints the
workers' formula beside the real loader's wait (37.7 ms waited a step, 37.5 predicted, on a quiet 2-vCPU machine).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from contract.data_formats import (
    DECODED,
    FORMATS,
    GPU_HOST_VCPU_RATIO,
    IMAGES,
    JPEG_BYTES_PER_PIXEL,
    JPEG_SOURCE_SCALE,
    TOKENS,
    WEBDATASET,
    auto_workers,
    load_rate,
)
from contract.hyperparameters import INPUT_BOUND_SHARE, canonical_hyperparameters
from jobs.planning.shape import ModelFacts, PlanInputError

_RATES = "contract/data_formats.py"


@dataclass(frozen=True)
class InputCheck:
    """The loader's supply against the GPUs' need, per instance, in samples/s; `data_format` None: not checked."""

    data_format: str | None
    format_source: str  # where the format came from, or why it is unknown
    need: float = 0.0  # samples/s the GPUs of one instance consume (the time model's)
    supply: float = 0.0  # samples/s its loader processes deliver
    rate_per_process: float = 0.0  # one process on the GPU instance (measured rate x GPU_HOST_VCPU_RATIO)
    processes: int = 0  # loader processes per instance: ranks x workers, or the ranks' training threads
    workers_per_rank: int = 0
    workers_source: str = ""  # "data_workers" or "data_workers auto"
    ranks: int = 0  # GPUs (training processes) per instance
    vcpus: int = 0
    wait_share: float = 0.0  # of each step, waiting for data
    limit: float = INPUT_BOUND_SHARE  # the request's input_bound_share
    workers_that_feed: int | None = None  # data_workers that would feed the GPUs (None: the vCPUs cannot)
    bytes_per_sample: float | None = None  # read from storage, in this format

    @property
    def checked(self) -> bool:
        return self.data_format is not None

    @property
    def bound(self) -> bool:
        return self.checked and self.wait_share > self.limit

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"checked": self.checked, "bound": self.bound, "rates": _RATES}

    def text(self) -> str:
        """One line for `trainctl plan`."""
        if not self.checked:
            return f"not checked: {self.format_source}"
        workers = (f"{self.workers_per_rank} {self.workers_source} per rank x {self.ranks} ranks"
                   if self.workers_per_rank else f"the {self.ranks} ranks' training threads (data_workers=0)")
        return (f"{self.data_format} ({self.format_source}): the GPUs consume {self.need:,.0f} samples/s per "
                f"instance; {self.processes} loader processes ({workers}, of {self.vcpus} vCPUs) at "
                f"~{self.rate_per_process:,.0f} samples/s each supply {self.supply:,.0f}: "
                f"{self.wait_share:.0%} of each step waits for data (input_bound_share {self.limit:g}; rates: "
                f"{_RATES})")


def data_format(request: Any, m: ModelFacts, dataset_meta: Mapping[str, Any] | str | None) -> tuple[str | None, str]:
    """(format, where it came from) or (None, why it is unknown); PlanInputError when two sources disagree.
    `dataset_meta`: the dataset's meta.json, or why the caller could not read it, or None (not tried)."""
    hint = getattr(request.sizing, "data_format", None) if request.sizing else None
    meta = dataset_meta if isinstance(dataset_meta, Mapping) else {}
    said = meta.get("format") if meta.get("format") in FORMATS else None
    if hint and said and hint != said:
        raise PlanInputError("sizing.data_format", hint, f"the dataset's meta.json ({request.dataset}) says "
                             f"{said!r}: set sizing.data_format to {said!r}, or remove it")
    fmt, source = (hint, "sizing.data_format") if hint else (said, "the dataset's meta.json") if said else \
        (None, "")
    if m.kind == "decoder":
        if fmt not in (None, TOKENS):
            raise PlanInputError("sizing.data_format", fmt, "a decoder reads token shards: set it to 'tokens' "
                                 "(python -m prepare.text writes them)")
        return TOKENS, source or "a decoder reads token shards"
    if m.kind == "vit" and fmt == TOKENS:
        raise PlanInputError("sizing.data_format", fmt, "a ViT reads images: set it to 'images' (.npy arrays) or "
                             "'webdataset' (encoded images in tar shards)")
    if fmt is None:
        why = dataset_meta if isinstance(dataset_meta, str) else \
            f"its meta.json says format {meta['format']!r}" if "format" in meta else \
            "its meta.json has no format" if meta else "the plan reads no meta.json from FSx, or from S3 offline"
        return None, (f"the dataset's format is unknown ({why}): set sizing.data_format to images (.npy arrays) "
                      "or webdataset (encoded images in tar shards)")
    return fmt, source


def _work(fmt: str, m: ModelFacts) -> float:
    """What a sample's load time grows with (contract.data_formats.LoadRate.work)."""
    if fmt == TOKENS:
        return m.tokens
    side_sq = m.image_bytes / 3 if m.image_bytes else 224 * 224  # `other` models: ImageNet's training side
    return side_sq * (JPEG_SOURCE_SCALE ** 2 if fmt == WEBDATASET else 1)


def bytes_per_sample(fmt: str | None, m: ModelFacts) -> float | None:
    """Bytes read from storage per sample in this format (unknown format: the model's raw sample)."""
    if fmt == WEBDATASET:
        return _work(fmt, m) * JPEG_BYTES_PER_PIXEL
    if fmt == IMAGES:
        return m.image_bytes or None
    return m.sample_bytes


def check(rec: Any, m: ModelFacts, spec: Any, request: Any,
          dataset_meta: Mapping[str, Any] | str | None) -> InputCheck:
    """The input check for the recommended candidate on its instance type (`spec`: jobs.catalog.InstanceSpec)."""
    fmt, source = data_format(request, m, dataset_meta)
    hps = canonical_hyperparameters(request.hyperparameters)
    limit = hps.get("input_bound_share")
    limit = INPUT_BOUND_SHARE if limit is None else float(limit)
    if fmt is None:
        return InputCheck(None, source, limit=limit)
    ranks = max(1, rec.layout.gpus // rec.layout.nodes)
    need = rec.throughput / (m.tokens if rec.throughput_unit == "tokens/s" else 1) / rec.layout.nodes
    given = hps.get("data_workers")
    workers = int(given) if given is not None else auto_workers(fmt, spec.vcpus // ranks)
    work = _work(fmt, m)
    free = max(1, spec.vcpus - ranks)  # one vCPU per rank runs its training thread
    if workers:
        rate = load_rate(fmt, work, worker=True) * GPU_HOST_VCPU_RATIO
        processes = min(ranks * workers, free)
        supply = processes * rate
        share = max(0.0, 1 - supply / need)
    else:
        rate = load_rate(fmt, work, worker=False) * GPU_HOST_VCPU_RATIO
        processes, supply = ranks, ranks * rate
        load = need / supply  # seconds of loading per second of compute, on each rank's own thread
        share = load / (1 + load)
    per_rank = math.ceil(need / ranks / (load_rate(fmt, work, worker=True) * GPU_HOST_VCPU_RATIO))
    feeds = per_rank if ranks * per_rank <= free else None
    return InputCheck(fmt, source, need, supply, rate, processes, workers,
                      "data_workers" if given is not None else "data_workers auto", ranks, spec.vcpus, share,
                      limit, feeds, bytes_per_sample(fmt, m))


def fixes(c: InputCheck, instance_type: str) -> str:
    """What would feed the GPUs, for the io_bound warning."""
    out = []
    if c.workers_that_feed is not None and c.workers_that_feed > c.workers_per_rank:
        out.append(f"set hyperparameters.data_workers={c.workers_that_feed} ({c.ranks * c.workers_that_feed} "
                   f"processes of the {c.vcpus} vCPUs)")
    elif c.workers_that_feed is None:
        out.append(f"an instance type with more vCPUs per GPU ({instance_type} has {c.vcpus // max(1, c.ranks)}; "
                   f"{math.ceil(c.need / c.rate_per_process) + c.ranks} vCPUs would feed {c.ranks} GPUs)")
    if c.data_format == WEBDATASET:
        out.append("store the images at the training side (decoding grows with the source's pixels), or "
                   "pre-decode them to .npy arrays (format images: no decode, more bytes to read)")
    if c.data_format in DECODED or c.workers_that_feed is None:
        out.append("or fewer GPUs per instance")
    return "; ".join(out)
