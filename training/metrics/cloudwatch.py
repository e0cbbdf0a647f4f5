"""A job's metrics in its platform's (team's) own CloudWatch namespace, where its alarms and dashboard read them.

The `[metrics]` lines also reach CloudWatch through the job's MetricDefinitions, but SageMaker publishes those (and
its instance metrics) into its one namespace with the job's role, and IAM cannot limit which job a data point
names: there any team's job could raise or mask another team's alarms. The launcher names the namespace of the
platform or team that runs the job (contract.container.ENV_METRICS_NAMESPACE), the only other one its role may
write (platform_constructs.roles); this module sends there the line's values (dimension: the run, so every
attempt of a run draws one line) and each host's GPU utilization and memory (dimensions: the run and the host).

Sending never slows or stops training: a daemon thread sends what the loop hands over (a short queue that drops
the oldest when CloudWatch is slow), a failure is said once (network isolation, a missing endpoint) and training
goes on. Unset (a local run), nothing is sent and boto3 is never imported.
"""

from __future__ import annotations

import contextlib
import math
import queue
import socket
import threading
from collections.abc import Mapping
from typing import Any

from contract.container import ENV_CURRENT_HOST, ENV_METRICS_NAMESPACE
from contract.metrics import (
    GPU_MEMORY_UTILIZATION,
    GPU_UTILIZATION,
    HOST_DIMENSION,
    METRIC_NAMES,
    RUN_DIMENSION,
)

# PutMetricData takes at most 1,000 values a call; a line carries about 20, so one call each.
MAX_VALUES_PER_CALL = 1000
# Batches waiting for the sender: a minute of log intervals; older ones are dropped (the newest matter to an alarm).
QUEUE_BATCHES = 16
# What close() waits for the last batches, so an ending job does not hang on a slow endpoint.
CLOSE_WAIT_S = 5.0


class CloudWatchMetrics:
    """Sends to `namespace`: the run's values (`send_values`, the main rank) and this host's GPUs (`send_gpus`,
    each host's first rank). `client`: a boto3 CloudWatch client (tests pass one; None makes one on first use)."""

    def __init__(self, namespace: str, run_id: str, host: str, *, client: Any = None) -> None:
        self.namespace, self.run_id, self.host = namespace, run_id, host
        self._client = client
        self._batches: queue.Queue = queue.Queue(maxsize=QUEUE_BATCHES)
        self._failed = False
        self._sender = threading.Thread(target=self._send_all, name="cloudwatch-metrics", daemon=True)
        self._sender.start()

    @classmethod
    def from_environment(cls, env: Mapping[str, str], run_id: str | None, *, is_main: bool,
                         local_rank: int) -> CloudWatchMetrics | None:
        """The sender of this rank when the launcher named a namespace and this rank sends anything (the main rank,
        each host's first); None otherwise, or without boto3 (said once)."""
        namespace = env.get(ENV_METRICS_NAMESPACE)
        if not namespace or not (is_main or local_rank == 0):
            return None
        try:
            import boto3  # noqa: F401  (SageMaker's training images ship it; a local run never gets here)
        except ImportError:
            print(f"[metrics] {ENV_METRICS_NAMESPACE}={namespace} but boto3 is not installed in this image: the "
                  "team's alarms and dashboard get no data from this job; install boto3 in the image", flush=True)
            return None
        return cls(namespace, run_id or "unknown", env.get(ENV_CURRENT_HOST) or socket.gethostname())

    def send_values(self, record: Mapping[str, Any]) -> None:
        """The line's metrics (contract.metrics.METRIC_NAMES), finite numbers only (CloudWatch refuses the others)."""
        dims = [{"Name": RUN_DIMENSION, "Value": self.run_id}]
        self._queue([{"MetricName": name, "Dimensions": dims, "Value": float(value)}
                     for name, value in record.items() if name in METRIC_NAMES and _finite(value)])

    def send_gpus(self) -> None:
        """This host's GPUs: mean utilization and memory in use, percent (nothing without a GPU)."""
        found = gpu_utilization()
        dims = [{"Name": RUN_DIMENSION, "Value": self.run_id}, {"Name": HOST_DIMENSION, "Value": self.host}]
        self._queue([{"MetricName": name, "Dimensions": dims, "Value": value, "Unit": "Percent"}
                     for name, value in found.items()])

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Send what is queued (waiting at most `wait_s`), then stop the sender."""
        try:
            self._batches.put(None, timeout=wait_s)
        except queue.Full:
            return
        self._sender.join(wait_s)

    def _queue(self, data: list[dict]) -> None:
        for start in range(0, len(data), MAX_VALUES_PER_CALL):
            batch = data[start:start + MAX_VALUES_PER_CALL]
            while True:
                try:
                    self._batches.put_nowait(batch)
                    break
                except queue.Full:  # CloudWatch is slower than the log interval: the oldest batch goes
                    with contextlib.suppress(queue.Empty):
                        self._batches.get_nowait()

    def _send_all(self) -> None:
        while (batch := self._batches.get()) is not None:
            try:
                self._client = self._client or _client()
                self._client.put_metric_data(Namespace=self.namespace, MetricData=batch)
            except Exception as e:  # noqa: BLE001  (any failure: say it once, never stop training)
                if not self._failed:
                    self._failed = True
                    print(f"[metrics] could not send metrics to CloudWatch namespace {self.namespace} "
                          f"({type(e).__name__}: {e}): the team's alarms and dashboard get no data from this job "
                          "(a job with network isolation cannot reach CloudWatch); training goes on", flush=True)


def _client():
    import boto3

    return boto3.client("cloudwatch")


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def gpu_utilization() -> dict[str, float]:
    """This host's GPUs, averaged: compute utilization (NVML, through torch) and the share of memory in use, in
    percent; each left out where it cannot be read (no GPU, no NVML)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    count = torch.cuda.device_count()
    found: dict[str, float] = {}
    with contextlib.suppress(Exception):  # no NVML bindings in the image: no utilization
        found[GPU_UTILIZATION] = sum(torch.cuda.utilization(i) for i in range(count)) / count
    with contextlib.suppress(Exception):
        used = [1 - free / total for free, total in (torch.cuda.mem_get_info(i) for i in range(count))]
        found[GPU_MEMORY_UTILIZATION] = 100 * sum(used) / count
    return found

