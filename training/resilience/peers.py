"""When a rank's peers are gone: which ones, on which hosts, and the one failure line every survivor writes.

A process that ends outright (a host lost, the kernel's out-of-memory killer's SIGKILL, a crash) writes nothing; its
peers see only their transport's error in the next collective ("Connection closed by peer", "Connection reset by
peer", NCCL's remote error), and with gloo only the ranks that exchange data with it directly: the others wait for
their neighbours. So a rank that sees such an error raises an alert in the job's store, every rank's watchdog thread
answers it (the main thread may be stuck waiting in a collective), and after a short window each rank judges from the
same answers (training.resilience.watchdog.Watchdog.conclude):

- a rank that failed with a line of its own (it told its peers before it left): that line, from that rank;
- every rank of a host silent: the host is lost (`host_lost`: a fresh, health-checked instance cures it);
- some ranks of a host silent while its others answer: those processes ended on a live host (`process_lost`: most
  often the out-of-memory killer, host memory, which a retry meets again);
- the store itself gone: it lives with the job's first host (torchrun's agent there), so that host is lost.
"""

from __future__ import annotations

import re

from contract.errors import error_chain
from contract.failures import FailureCode, parse_failure_line

# How the transports say a peer went away (gloo's TCP pair, NCCL's remote error, a socket's errno words).
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|EPIPE|"
                        r"remote process exited|ncclRemoteError|NCCL communicator was aborted|Socket closed", re.I)


def peer_gone(error: BaseException) -> str | None:
    """The transport's words when `error` (or an error it carries) says a peer went away; None otherwise."""
    for e in error_chain(error):
        if match := _PEER_GONE.search(str(e)):
            return " ".join(str(e).split())[:200] if len(str(e)) < 400 else match.group(0)
    return None


def verdict(reports: dict[int, dict], world: int, hosts: list[str], store_lost: bool) -> tuple[FailureCode, str]:
    """(code, message) of the failure line from every answer that arrived. A report: {"rank", "host", "step",
    "failed": a failure line or None, "saw": what its transport said or None}."""
    host = lambda r: hosts[r] if r < len(hosts) else "?"  # noqa: E731
    saw = next((f"rank {r} on host {host(r)} saw: {rep['saw']}" for r, rep in sorted(reports.items())
                if rep.get("saw")), "")
    failed = [(r, parse_failure_line(rep["failed"])) for r, rep in sorted(reports.items()) if rep.get("failed")]
    if failed and failed[0][1] is not None:
        rank, (code, message) = failed[0]
        return code, f"rank {rank} on host {host(rank)} failed and ended the run: {message}"
    if store_lost:
        return FailureCode.HOST_LOST, (
            f"host {host(0)} was lost: the job's store, which runs there with rank 0, stopped answering "
            f"({saw or 'no report arrived'}). Retried on health-checked instances; if it recurs, look at that "
            "instance's health and network")
    silent = [r for r in range(world) if r not in reports]
    if not silent:
        return FailureCode.HOST_LOST, (
            f"a connection between ranks broke while every rank still answers ({saw}): a network fault between "
            "instances. Retried on health-checked instances")
    ranks_of = {h: [r for r in range(world) if host(r) == h] for h in dict.fromkeys(host(r) for r in silent)}
    gone = [h for h, ranks in ranks_of.items() if all(r in silent for r in ranks)]
    if gone:
        shown = ", ".join(f"{h} (rank{'s' if len(ranks_of[h]) > 1 else ''} {_ranks(ranks_of[h])})" for h in gone[:4])
        return FailureCode.HOST_LOST, (
            f"host{'s' if len(gone) > 1 else ''} {shown} {'were' if len(gone) > 1 else 'was'} lost: every rank on "
            f"{'them' if len(gone) > 1 else 'it'} stopped answering at once, without a failure line ({saw}): an "
            "instance that failed, was reclaimed, or lost its network. Retried on health-checked instances")
    who = ", ".join(f"rank {r} on host {host(r)}" for r in silent[:4])
    return FailureCode.PROCESS_LOST, (
        f"{who} ended without a failure line while the other ranks of {'its host' if len(silent) == 1 else 'their hosts'} "
        f"still run ({saw}): a process killed on a live host, most often by the kernel's out-of-memory killer "
        "(SIGKILL: the host's memory, not the GPU's), or a crash: that host's log holds the process's last lines. "
        "Lower hyperparameters.data_workers or micro_batch_size, or choose an instance type with more memory")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
