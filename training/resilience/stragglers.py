"""Stragglers: a rank persistently slower than the others is named, in the log, in a metric and at the end.

In a synchronous job every rank's step takes as long as the slowest rank's: the others wait for it in the
step's collectives, so comparing the ranks' step times shows nothing. What differs is where each rank spends
them. Each rank measures, per step, rank-local times that need no GPU synchronization:
  - its step time (training.resilience.heartbeat's beats; steps that held a checkpoint save or an evaluation are
    left out);
  - the time it waited at the step boundary (the loop's one control all-reduce, `Dist.agree`, and this module's
    own exchange): the slow rank arrives last and waits least, so step time minus that wait is its own time;
  - the time it waited for its batch (`training.data.loader.BatchSource`): a slow data pipeline is named even where
    the step's gradient collectives hide it from the boundary (DDP and FSDP wait for it inside backward).
A slow GPU shows up as far as its work lies outside the step's own collectives (the optimizer step, and the
compute after the last gradient bucket); a slow data pipeline or host shows up fully.

At each log interval the ranks exchange those sums in one small all_gather of floats (collective: every rank
calls it at the same step, right after the loop's beat: `StepTiming.stepped`). A rank's delay is how much more its own time and its batch
wait exceed the median rank's, as a fraction of the median step; above `straggler_margin` for
`straggler_patience` intervals in a row, it is named.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from contract.hyperparameters import TrainConfig
from contract.metrics import RANK_STEP_TIME_MS, SLOWEST_RANK_RATIO, STEP, STRAGGLER_RANK


@dataclass
class Window:
    """This rank's timed steps since the last exchange."""

    steps: int = 0
    step_s: float = 0.0
    boundary_wait_s: float = 0.0
    data_wait_s: float = 0.0

    def add(self, step_s: float, boundary_wait_s: float, data_wait_s: float) -> None:
        self.steps += 1
        self.step_s += step_s
        self.boundary_wait_s += boundary_wait_s
        self.data_wait_s += data_wait_s

    def values(self) -> list[float]:
        return [float(self.steps), self.step_s, self.boundary_wait_s, self.data_wait_s]


@dataclass(frozen=True)
class Interval:
    """One exchange, judged: every rank's ratio (its own time per step over the median rank's; 1.0 is even)."""

    ratios: tuple[float, ...]
    own_s: tuple[float, ...]  # per step: step time minus the boundary wait
    data_s: tuple[float, ...]  # per step: waiting for the batch
    named: tuple[int, ...]  # ranks slow for `patience` intervals in a row


def ratios(rows: list[list[float]]) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]] | None:
    """(ratio, own seconds, data seconds) per rank from each rank's Window.values(); None when a rank timed no
    step in the interval (a save or an evaluation filled it): nothing to compare."""
    if not rows or any(row[0] < 1 for row in rows):
        return None
    step = [row[1] / row[0] for row in rows]
    own = [(row[1] - row[2]) / row[0] for row in rows]
    data = [row[3] / row[0] for row in rows]
    median_step, median_own, median_data = (statistics.median(v) for v in (step, own, data))
    if median_step <= 0:
        return None
    # Only the excess over the median counts: a rank faster than the median is not "negatively late".
    delay = [max(0.0, o - median_own) + max(0.0, d - median_data) for o, d in zip(own, data, strict=True)]
    return tuple(1.0 + x / median_step for x in delay), tuple(own), tuple(data)


REPEAT_EVERY = 20  # log intervals between two lines about the same straggler


class Stragglers:
    """The streak of slow intervals of every rank, and what the run reports of them."""

    def __init__(self, margin: float, patience: int, hosts: list[str]) -> None:
        self.margin, self.patience, self.hosts = margin, patience, list(hosts)
        self.streak = [0] * len(hosts)
        self.named_intervals = [0] * len(hosts)  # intervals each rank was named in (the end's summary)
        self.intervals = 0  # intervals judged

    def judge(self, rows: list[list[float]]) -> Interval | None:
        found = ratios(rows)
        if found is None:
            return None
        ratio, own, data = found
        self.intervals += 1
        for rank, r in enumerate(ratio):
            self.streak[rank] = self.streak[rank] + 1 if r > 1.0 + self.margin else 0
        named = tuple(rank for rank, n in enumerate(self.streak) if n >= self.patience)
        for rank in named:
            self.named_intervals[rank] += 1
        return Interval(ratio, own, data, named)

    @staticmethod
    def metrics(interval: Interval) -> dict:
        """straggler_rank (the slowest named rank, -1 when none) and slowest_rank_ratio (contract.metrics)."""
        slowest = max(interval.named, key=lambda r: interval.ratios[r], default=-1)
        return {STRAGGLER_RANK: slowest, SLOWEST_RANK_RATIO: max(interval.ratios)}

    def lines(self, interval: Interval) -> list[str]:
        """A log line per named rank, when it is first named and every REPEAT_EVERY intervals after (the metric
        carries it every interval): who, by how much, for how long, and what to do."""
        median_own, median_data = statistics.median(interval.own_s), statistics.median(interval.data_s)
        told = [rank for rank in interval.named if (self.streak[rank] - self.patience) % REPEAT_EVERY == 0]
        return [
            f"[stragglers] rank {rank} on host {self.hosts[rank]} has been slow for {self.streak[rank]} log intervals "
            f"in a row: its own time per step is {interval.ratios[rank]:.2f} x the median rank's step "
            f"(before the step boundary {interval.own_s[rank]:.3f} s vs a median {median_own:.3f} s; waiting for "
            f"its batch {interval.data_s[rank]:.3f} s vs {median_data:.3f} s), and every rank waits for it. Check "
            f"that host's GPU (nvidia-smi: clocks, temperature, ECC) and its data loading; stopping and resuming "
            "the run (`trainctl stop`, `trainctl resume`) moves it to fresh instances"
            for rank in told]

    def report(self) -> list[dict]:
        """The ranks named during the run (the status file's `stragglers`)."""
        return [{"rank": rank, "host": self.hosts[rank], "intervals": n}
                for rank, n in enumerate(self.named_intervals) if n]

    def summary(self) -> str:
        named = self.report()
        if not named:
            return f"[stragglers] end of the run: no rank was persistently slow in {self.intervals} log intervals"
        who = "; ".join(f"rank {s['rank']} on host {s['host']} named in {s['intervals']}" for s in named)
        return f"[stragglers] end of the run: {who} of {self.intervals} log intervals"


class StepTiming:
    """This rank's side of the straggler check: the loop hands it each timed step's seconds (`stepped`), the time
    it waited at the step boundary (`Dist.agree`'s `waited`) and for its batch (training.data.loader.BatchSource);
    every `log_interval` steps the ranks exchange them and rank 0 prints what `Stragglers` judged. Collective in
    `stepped` on those steps (every rank calls it at the same steps)."""

    def __init__(self, cfg: TrainConfig, *, rank: int, world: int, hosts: list[str], gather=None) -> None:
        self.rank, self.world, self.gather = rank, world, gather
        self.log_interval = cfg.effective_log_interval
        self.window = Window()
        self.stragglers = Stragglers(cfg.straggler_margin, cfg.straggler_patience, hosts)
        self._boundary_s = self._data_s = 0.0
        # Rank 0's metrics logger once the loop has one (training.metrics.logger.MetricsLogger): the judged
        # interval's metrics then reach the metrics file, TensorBoard and MLflow too, not the log line alone.
        self.logger = None

    def waited_at_boundary(self, seconds: float) -> None:
        self._boundary_s += seconds

    def waited_for_data(self, seconds: float) -> None:
        self._data_s += seconds

    def stepped(self, step: int, seconds: float | None) -> None:
        """`step` completed, in `seconds` when it was a timed step (training.resilience.heartbeat.Heartbeat.beat)."""
        if seconds is not None:
            self.window.add(seconds, self._boundary_s, self._data_s)
        self._boundary_s = self._data_s = 0.0
        if self.world > 1 and self.gather is not None and step % self.log_interval == 0:
            self._exchange(step)

    def _exchange(self, step: int) -> None:
        began = time.perf_counter()
        rows = self.gather(self.window.values())
        # Waiting here for a late rank is waiting at the step boundary, like the loop's own all-reduce.
        self._boundary_s += time.perf_counter() - began
        self.window = Window()
        interval = self.stragglers.judge(rows)
        if interval is None or self.rank != 0:
            return
        for line in self.stragglers.lines(interval):
            print(line, flush=True)
        if self.logger is not None:  # the loop's, set before its first step
            self.logger.log({STEP: step, **self.stragglers.metrics(interval)})
            self.logger.log_ranks(step, RANK_STEP_TIME_MS, [seconds * 1000 for seconds in interval.own_s])

    def report(self) -> list[dict]:
        """The ranks named during the run (the status file's `stragglers`)."""
        return self.stragglers.report()

    def close(self) -> None:
        """The run is over: let go of the control group (teardown reports a group still referenced); rank 0
        prints the run's summary."""
        self.gather = None
        if self.rank == 0 and self.stragglers.intervals:
            print(self.stragglers.summary(), flush=True)
