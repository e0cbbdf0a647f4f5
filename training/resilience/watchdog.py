"""The hang watchdog of every rank: a thread that watches the loop's progress marks (training.resilience.heartbeat).

A rank that stops progressing (a GPU fault, a dead NCCL/EFA link, a rank that calls a different collective)
otherwise holds the whole cluster until the process group's timeout, and then fails as the user's error. Here
each rank's loop beats once per completed step (`Heartbeat.beat`); a daemon thread checks the time of the last beat, so
it needs nothing of the main thread, which is stuck inside a collective when a peer hangs (such waits, like
CUDA synchronizations and sleeps, release the GIL). When no step completed within

    max(hang_timeout_factor x the mean step time, hang_timeout_min_seconds)

(hang_timeout_startup_seconds for what is not a timed step: the startup through the first two steps, which
build, restore and compile, and the `phase`s: checkpoint saves, evaluations, the final export), the thread:
  1. prints every thread's Python stack of this rank to stderr (faulthandler);
  2. dumps the NCCL flight recorder to the output data dir where the torch has one and the backend is NCCL
     (torch's `torchfrtrace` names the rank whose collectives fell behind);
  3. publishes where this rank is to the process group's store and reads the others' reports for a few
     seconds: the rank that is not waiting inside a collective (or whose watchdog does not answer) is the one
     that stopped; every rank reaches the same verdict from the same reports;
  4. writes ONE failure line (contract.failures, code `hang`) naming that rank and its host, which the launcher
     reads as a hardware/network fault and retries on a health-checked instance;
  5. ends the process with os._exit(1): the main thread cannot be interrupted inside a collective.

One watchdog per run, every rank's and a single process's too (its loader or I/O can hang as well), started and
stopped by training.loop.train, which hands the heartbeat it watches to what does long work between steps (the
checkpoint manager, the evaluator, the export). No module global: whoever reports is given the instance. The
straggler timing is training.resilience.stragglers.StepTiming.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import threading
import time
from pathlib import Path

from contract.failures import FailureCode, failure_line
from contract.hyperparameters import TrainConfig
from training.environment import write_failure
from training.metrics.logger import strict_json
from training.resilience import peers, stragglers
from training.resilience.heartbeat import Heartbeat

# The process group's collective timeout sits above the watchdog's largest allowance, so that the watchdog (stacks,
# the rank named) fires first; never below this floor: one collective that waits 10 minutes is a hang by any
# measure, and a lower value would cut legitimate lone work a collective waits on (rank 0 writing a large export).
PROCESS_GROUP_TIMEOUT_FLOOR_S = 600.0
PROCESS_GROUP_TIMEOUT_MARGIN_S = 120.0

_STORE_PREFIX = "trainctl-watchdog"
_PEERS_PREFIX = "trainctl-peers"  # the peers' alert and answers (training.resilience.peers)


def process_group_timeout(cfg: TrainConfig) -> float:
    """Seconds: the process group's collective timeout (torch's default is 30 minutes).

    It is fixed when the group is made, before any step is timed, and bounds every collective, the startup's and
    the saves' too; so it is set above the watchdog's longest allowance, which the step-time-based allowance never
    exceeds (hang_timeout_startup_seconds, plus a margin for the watchdog's report), with a 10-minute floor."""
    longest = max(cfg.hang_timeout_startup_seconds, cfg.hang_timeout_min_seconds)
    return max(PROCESS_GROUP_TIMEOUT_FLOOR_S, longest + PROCESS_GROUP_TIMEOUT_MARGIN_S)


class Watchdog:
    """This rank's hang watchdog: a daemon thread that reads `heartbeat` (the main thread's progress marks) and,
    past the allowance, reports the hang and ends the process; it also answers and judges a peers-gone alert."""

    def __init__(self, cfg: TrainConfig, heartbeat: Heartbeat, *, rank: int, world: int, hosts: list[str],
                 backend: str = "gloo", store=None, exit=os._exit) -> None:
        self.heartbeat = heartbeat
        self.rank, self.world, self.hosts, self.backend = rank, world, hosts, backend
        self.host = hosts[rank] if rank < len(hosts) else "?"
        self.factor, self.floor = cfg.hang_timeout_factor, cfg.hang_timeout_min_seconds
        self.long = cfg.hang_timeout_startup_seconds
        self.output_dir = cfg.output_data_dir
        self.store, self._exit = store, exit
        self.enabled = self.floor > 0
        self._stop = threading.Event()
        self._ending = threading.Lock()  # one of this rank's threads reports the end (a hang, or peers gone)
        self._store_lost = False
        # Often enough to fire within a few percent of the allowance, rarely enough to cost nothing.
        self.poll_s = min(5.0, max(0.2, self.floor / 10))
        self._thread = threading.Thread(target=self._watch, name="training-watchdog", daemon=True)

    def start(self) -> Watchdog:
        if self.enabled:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_s + 1.0)
        # Let go of the process group's store: teardown ends every group's threads, and reports any group still
        # referenced (training.parallel.process_group.teardown).
        self.store = None

    # ---- the watchdog thread ----

    def allowance(self) -> tuple[float, str]:
        """(seconds, why) a rank may go without progress now."""
        beats = self.heartbeat
        if beats.phases:
            return self.long, f"hang_timeout_startup_seconds, during {beats.phases[-1]}"
        if beats.timed_steps == 0:
            return self.long, "hang_timeout_startup_seconds, until the first steps are timed"
        mean = beats.timed_s / beats.timed_steps
        if self.factor * mean > self.floor:
            return self.factor * mean, f"hang_timeout_factor {self.factor:g} x the mean step {mean:.2f} s"
        return self.floor, "hang_timeout_min_seconds"

    def overdue(self) -> float | None:
        """Seconds without progress, when past the allowance; else None."""
        waited = self.heartbeat.clock() - self.heartbeat.last
        return waited if waited > self.allowance()[0] else None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self._alerted():  # a peer saw ranks go, or failed: answer, judge, end (the main thread may be stuck)
                verdict = self.conclude()
                if verdict is None:  # this rank's main thread raised the alert and ends the process itself
                    return
                line = failure_line(*verdict)
                _say(line)
                write_failure(line)
                self._exit(1)
                return
            waited = self.overdue()
            if waited is not None and not self._stop.is_set():
                self.fire(waited)
                return

    # ---- peers gone (training.resilience.peers) ----

    def _peers_key(self, name: str) -> str:
        return f"{_PEERS_PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{name}"

    def _alerted(self) -> bool:
        if self.store is None or self.world == 1:
            return False
        try:
            return bool(self.store.check([self._peers_key("alert")]))
        except Exception:  # the store's host is gone: this rank's next collective says so, and it concludes then
            return False

    def conclude(self, failed: str | None = None, saw: str | None = None) -> tuple[FailureCode, str] | None:
        """This rank's part in the end of a run whose ranks cannot all go on: raise the alert when this rank saw a
        peer go (`saw`, its transport's words) or failed itself (`failed`, its failure line), answer it, and judge
        from every answer that arrives in a short window (training.resilience.peers.verdict: every rank reaches the same one).
        Returns the failure line's code and message. Once per process: when its other thread is already at it, the
        main thread waits for the watchdog's to end the process, and the watchdog's returns None (the main thread
        ends it)."""
        if not self._ending.acquire(blocking=False):
            if threading.current_thread() is not threading.main_thread():
                return None
            while True:
                time.sleep(3600)
        mine = {"rank": self.rank, "host": self.host, "step": self.heartbeat.step, "failed": failed, "saw": saw}
        store_lost = False
        if failed or saw:
            try:
                self.store.set(self._peers_key("alert"), str(self.rank))
            except Exception:
                store_lost = True
        reports = self._reports(mine, _PEERS_PREFIX) if not store_lost else {self.rank: mine}
        store_lost = store_lost or self._store_lost
        return peers.verdict(reports, self.world, self.hosts, store_lost)

    def fire(self, waited: float) -> str:
        """Report the hang (stacks, flight recorder, the rank named) and end the process. Returns the line
        (tests call it with an `exit` that returns)."""
        allowance, why = self.allowance()
        step = self.heartbeat.step
        after = "before the first step" if step is None else f"after step {step}"
        _say(f"[watchdog] rank {self.rank} on host {self.host}: no progress for {waited:.0f} s {after} "
             f"(allowed {allowance:.0f} s: {why}); this rank's threads follow")
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback(file=_stderr(), all_threads=True)
        trace = self._dump_flight_recorder()
        if not self._ending.acquire(blocking=False):  # this rank is already reporting its peers gone
            return ""
        reports = self._reports({"rank": self.rank, "host": self.host, "step": step,
                                 "waiting": _main_thread_in_collective(), "where": _main_thread_where()},
                                _STORE_PREFIX)
        line = failure_line(FailureCode.HANG, hang_message(reports, self.world, self.hosts, waited, allowance, why,
                                                           trace))
        _say(line)
        write_failure(line)
        self._exit(1)
        return line

    def _dump_flight_recorder(self) -> str:
        """Where this rank's NCCL flight recorder went, or "" (gloo, or a torch without one)."""
        if self.backend != "nccl":
            return ""
        try:
            import torch

            c10d = torch._C._distributed_c10d
            dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
            if dump is None:
                return ""
            path = Path(self.output_dir or ".") / "flight_recorder" / f"rank-{self.rank}.pkl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(dump())
        except Exception as e:  # a report must never stop the exit
            _say(f"[watchdog] rank {self.rank}: no NCCL flight recorder dump ({type(e).__name__}: {e})")
            return ""
        _say(f"[watchdog] rank {self.rank}: NCCL flight recorder in {path} (read with torch's `torchfrtrace`)")
        return str(path.parent)

    def _reports(self, mine: dict, topic: str) -> dict[int, dict]:
        """Every rank's report on `topic` that arrives within a few seconds, through the process group's store (its
        own connection: usable while the main thread waits in a collective). Ranks fire within a poll of each
        other: their last steps ended together, or the alert reached their watchdogs. `_store_lost` says whether
        the store stopped answering."""
        reports = {self.rank: mine}
        self._store_lost = False
        if self.store is None or self.world == 1:
            return reports
        prefix = f"{topic}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        keys = {rank: f"{prefix}/rank-{rank}" for rank in range(self.world)}
        deadline = time.monotonic() + min(15.0, 3 * self.poll_s + 2.0)
        try:
            self.store.set(keys[self.rank], strict_json(mine))
            while len(reports) < self.world and time.monotonic() < deadline:
                for rank, key in keys.items():
                    if rank not in reports and self.store.check([key]):
                        reports[rank] = json.loads(self.store.get(key))
                time.sleep(0.1)
        except Exception as e:  # the store's host may be gone: judge from what arrived
            _say(f"[watchdog] rank {self.rank}: the other ranks' reports are incomplete ({type(e).__name__}: {e})")
            self._store_lost = True
            return reports
        # The store lives in one of the processes (rank 0's, without torchrun's agent): every rank stays until all
        # have read, or a short grace, before any exits. Once the host has left, its store errors: nothing is lost.
        with contextlib.suppress(Exception):
            self.store.add(f"{prefix}/done", 1)
            done_by = time.monotonic() + 2 * self.poll_s + 1.0
            while self.store.add(f"{prefix}/done", 0) < len(reports) and time.monotonic() < done_by:
                time.sleep(0.1)
        return reports


def hang_message(reports: dict[int, dict], world: int, hosts: list[str], waited: float, allowance: float, why: str,
                 trace: str = "") -> str:
    """The failure line's message: the rank(s) that stopped and their host(s), how it was seen, what to do.
    Every rank writes the same words from the same reports (the first on a host writes the failure file)."""
    suspects, how = stopped_ranks(reports, world)
    # The step the stopped ranks completed last (a silent rank's: the others', which waited for it).
    steps = [rep["step"] for r, rep in reports.items() if r in suspects and rep.get("step") is not None] or \
        [rep["step"] for rep in reports.values() if rep.get("step") is not None]
    after = f"after step {min(steps)}" if steps else "before the first step"
    host = lambda r: reports.get(r, {}).get("host") or (hosts[r] if r < len(hosts) else "?")  # noqa: E731
    if suspects:
        shown = suspects[:4]  # the failure line must stay one short line (FailureReason)
        more = f" and {len(suspects) - len(shown)} more" if len(suspects) > len(shown) else ""
        who = ", ".join(f"rank {r} on host {host(r)}" for r in shown) + more
        where = "; ".join(f"rank {r} at {reports[r]['where']}" for r in shown if reports.get(r, {}).get("where"))
        head = f"{who} stopped progressing {after} ({how}{'; ' + where if where else ''})"
    else:
        head = f"no rank completed a step {after} ({how})"
    recorder = f"; NCCL flight recorder dumps in {trace}" if trace else ""
    return (f"{head}: no step completed in {waited:.0f} s (allowed {allowance:.0f} s: {why}). Every rank's Python "
            f"stacks are in its log above this line{recorder}. Retried on a health-checked instance (a GPU, NCCL/EFA "
            "or host fault is the usual cause); if it recurs at the same step, look in the stacks for ranks calling "
            "different collectives, or raise hang_timeout_min_seconds if a step legitimately takes that long")


def stopped_ranks(reports: dict[int, dict], world: int) -> tuple[list[int], str]:
    """The ranks that stopped, and how they were told apart: a rank whose watchdog did not answer; else the
    ranks not waiting inside a collective while the others are; else the ranks behind on steps."""
    silent = [r for r in range(world) if r not in reports]
    if silent:
        return silent, "its watchdog did not answer: the process is stuck holding the interpreter, or gone"
    running = sorted(r for r, rep in reports.items() if not rep.get("waiting"))
    if 0 < len(running) < len(reports):
        return running, "the other ranks wait for it inside a collective"
    steps = {r: -1 if rep.get("step") is None else rep["step"] for r, rep in reports.items()}
    behind = sorted(r for r, s in steps.items() if s == min(steps.values()))
    if len(behind) < len(steps):
        return behind, "it completed fewer steps than the others"
    if not running:
        return [], ("every rank waits inside a collective: ranks calling different collectives, or a GPU or "
                    "NCCL fault; the flight recorder, where there is one, names the rank")
    return running, "no rank waits inside a collective: each is stuck in its own work (data loading, I/O, the GPU)"


# ---- helpers ----

def _main_frame():
    return sys._current_frames().get(threading.main_thread().ident)


# Where a main thread waits for its peers: torch.distributed (a collective, a barrier, a work's wait), DDP, the
# package's own collectives (training.parallel.process_group's, the straggler exchange: StepTiming._exchange), and
# backward: DDP and FSDP reduce gradients from C++ hooks inside it, so a rank whose backward outlasts the whole
# allowance waits there for a peer (a rank stuck in its own backward, on a hung GPU, reads as waiting too: the flight
# recorder names it).
_COLLECTIVE_PATHS = (os.sep + os.path.join("torch", "distributed") + os.sep,
                     os.sep + os.path.join("torch", "nn", "parallel") + os.sep,
                     os.sep + os.path.join("torch", "autograd") + os.sep,
                     os.sep + os.path.join("training", "parallel", "process_group.py"))


def _main_thread_in_collective() -> bool:
    frame = _main_frame()
    while frame is not None:
        code = frame.f_code
        if any(p in code.co_filename for p in _COLLECTIVE_PATHS) or (
                code.co_filename == stragglers.__file__ and code.co_name == "_exchange"):
            return True
        frame = frame.f_back
    return False


def _main_thread_where() -> str:
    """The innermost frame of the package's own code on the main thread (file:line function), else the
    innermost frame."""
    frame = innermost = _main_frame()
    while frame is not None:
        if f"{os.sep}training{os.sep}" in frame.f_code.co_filename:
            break
        frame = frame.f_back
    frame = frame or innermost
    if frame is None:
        return ""
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"


def _stderr():
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
