"""Who holds a run: the run registry, one DynamoDB item per run, the one record every execution of the run writes.

    {"run_id" (key), "name", "digest" (of the request that took the run last), "owner" (the execution ARN that
     holds the run), "status" ("active" while its owner runs, "ended" once it let go), "outcome", "last_epoch" (the
     last one issued), "attempts": [{"attempt", "job_name", "attempt_epoch", "execution", "launched_at"}, ...],
     "record" (the run's record as its last summary counted it: jobs.outcome.run_record), "created_at",
     "updated_at", and while a hand-over is under way: "successor" (the ARN of the execution the owner continues
     in), "successor_digest" (of that execution's input), "handoff" (the state it goes on from, as JSON)}

A run is held by one execution at a time (its lease). Prepare takes it with a conditional write: a new run's item
is created only where none exists; a resumed run's item is taken over only from an owner that let go or whose
execution has ended, and only from that owner (a compare-and-swap on `owner`: of two resumes that read the same
ended owner, one write succeeds and the other is refused naming the winner). Every launch goes through it too:
the attempt's epoch is issued by the same conditional write that records its job's name, and only the owner may
write one (an execution that lost the run learns it there, before it creates anything). Summarize lets go; when
an execution ends any other way (a console stop, a failure, a timeout), the reaper does (jobs.handler.reap,
invoked by the launcher's execution-status rule), and stops every job the item records.

An execution whose history nears Step Functions' limit hands the run over to a new execution of the same run
(continue-as-new): the owner names its successor and the state to go on from; the successor, and only the one named
with the input named, takes the run over from the owner (a compare-and-swap on both), still running, with its job.
Until it has, nobody else may take the run: a named successor that still runs holds it as the owner does.

Nothing here sleeps or retries: the state machine's retriers and the callers decide. The client is boto3's
low-level DynamoDB client (the Lambda runtime's own), passed in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.container import FENCE_KEY

KEY = "run_id"
OWNER = "owner"
ACTIVE, ENDED = "active", "ended"
# How often Prepare looks again at a run whose owner changed under it before it gives up (each look that finds a live
# owner refuses at once; only owners that keep ending between a read and a write use them up).
TAKEOVER_TRIES = 3


def table_name(name_prefix: str) -> str:
    """The launcher's registry table (one per launcher, hence per team: a team's roles reach only its own)."""
    return f"{name_prefix}-runs"


def request_digest(document: dict[str, Any]) -> str:
    """The request as sent, hashed: which request took the run last, without carrying it."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class RunHeld(Exception):
    """Another execution holds the run: `holder` (its ARN), and whether it is known to run."""

    def __init__(self, run_id: str, holder: str):
        super().__init__(f"run {run_id} is held by execution {holder}")
        self.run_id, self.holder = run_id, holder


class LeaseLost(Exception):
    """This execution no longer holds the run (another took it over): it must not launch."""


class HandOverRefused(Exception):
    """An execution named as a run's successor came with another input than its owner started it with."""


@dataclass
class RunRecord:
    run_id: str
    owner: str = ""
    status: str = ""
    outcome: str = ""
    name: str = ""
    digest: str = ""
    last_epoch: int = 0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    created_at: str = ""
    updated_at: str = ""
    record: dict[str, Any] | None = None  # the run's record when its last execution ended through Summarize
    successor: str = ""  # the execution the owner hands the run over to (continue-as-new), until it has taken it
    successor_digest: str = ""
    handoff: str = ""  # the state the successor goes on from (JSON)

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> RunRecord:
        values = {k: _value(v) for k, v in item.items()}
        known = {k: values[k] for k in cls.__dataclass_fields__ if k in values}
        known["last_epoch"] = int(known.get("last_epoch", 0))
        known["attempts"] = [{**a, "attempt": int(a.get("attempt", 0)), FENCE_KEY: int(a.get(FENCE_KEY, 0))}
                             for a in known.get("attempts", [])]
        return cls(**known)

    @property
    def job_names(self) -> list[str]:
        return [a["job_name"] for a in self.attempts]


def _value(attribute: dict[str, Any]) -> Any:
    """A DynamoDB attribute value as plain JSON (the types this table holds: S, N, M, L, BOOL, NULL)."""
    ((kind, value),) = attribute.items()
    if kind == "N":
        number = float(value)
        return int(number) if number.is_integer() else number
    if kind == "M":
        return {k: _value(v) for k, v in value.items()}
    if kind == "L":
        return [_value(v) for v in value]
    if kind == "NULL":
        return None
    return value


def _attribute(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float):
        return {"N": str(value)}
    if isinstance(value, dict):
        return {"M": {k: _attribute(v) for k, v in value.items()}}
    if isinstance(value, list):
        return {"L": [_attribute(v) for v in value]}
    if value is None:
        return {"NULL": True}
    return {"S": str(value)}


# Taking the run over ends a hand-over that did not happen (its successor ended before it took the run).
_NO_HANDOVER = "REMOVE successor, successor_digest, handoff"


def _failed_condition(exc: Exception) -> bool:
    return getattr(exc, "response", {}).get("Error", {}).get("Code") == "ConditionalCheckFailedException"


@dataclass
class Registry:
    client: Any  # boto3.client("dynamodb")
    table: str

    def read(self, run_id: str) -> RunRecord | None:
        item = self.client.get_item(TableName=self.table, Key={KEY: {"S": run_id}}, ConsistentRead=True).get("Item")
        return RunRecord.from_item(item) if item else None

    def acquire(self, run_id: str, execution: str, *, name: str, digest: str, now: str,
                has_ended: Callable[[str], bool]) -> RunRecord:
        """Take the run for `execution`, or raise RunHeld naming the execution that holds it. `has_ended(arn)`
        says whether an owner's execution has ended (it may then be taken over although it never let go)."""
        fresh = {KEY: run_id, OWNER: execution, "status": ACTIVE, "outcome": "", "name": name, "digest": digest,
                 "last_epoch": 0, "attempts": [], "created_at": now, "updated_at": now}
        item = {k: _attribute(v) for k, v in fresh.items()}
        try:
            self.client.put_item(TableName=self.table, Item=item, ConditionExpression=f"attribute_not_exists({KEY})")
            return RunRecord.from_item(item)
        except Exception as exc:
            if not _failed_condition(exc):
                raise
        for _ in range(TAKEOVER_TRIES):
            record = self.read(run_id)
            if record is None:  # deleted between the two calls: a fresh item again
                return self.acquire(run_id, execution, name=name, digest=digest, now=now, has_ended=has_ended)
            if record.owner == execution:  # this execution's Prepare, run again
                return record
            if record.status == ACTIVE and not has_ended(record.owner):
                raise RunHeld(run_id, record.owner)
            if record.successor and not has_ended(record.successor):  # the run is being handed over to it
                raise RunHeld(run_id, record.successor)
            try:
                self.client.update_item(
                    TableName=self.table, Key={KEY: {"S": run_id}},
                    UpdateExpression="SET #owner = :me, #status = :active, #outcome = :none, #name = :name, "
                                     "digest = :digest, updated_at = :now " + _NO_HANDOVER,
                    ConditionExpression="#owner = :holder",
                    ExpressionAttributeNames={"#owner": OWNER, "#status": "status", "#outcome": "outcome",
                                              "#name": "name"},
                    ExpressionAttributeValues={":me": {"S": execution}, ":active": {"S": ACTIVE}, ":none": {"S": ""},
                                               ":name": {"S": name}, ":digest": {"S": digest}, ":now": {"S": now},
                                               ":holder": {"S": record.owner}})
                return self.read(run_id) or record
            except Exception as exc:
                if not _failed_condition(exc):
                    raise
            # Another execution took it between the read and the write: look again at who holds it now.
        raise RunHeld(run_id, record.owner)

    def launch(self, run_id: str, execution: str, *, attempt: int, job_name: str, now: str) -> int:
        """Issue the next epoch and record the attempt's job name under it, as the run's owner, in one conditional
        write; the epoch. A run with no item (started before the registry) is adopted by its execution here.
        LeaseLost when another execution holds the run."""
        for _ in range(3):  # only the owner writes epochs: a second try meets at most its own earlier write
            record = self.read(run_id)
            if record is not None and record.owner != execution:
                raise LeaseLost(f"run {run_id} is held by execution {record.owner}, not {execution}")
            old = record.last_epoch if record else 0
            # Never under the attempt's number: before the registry an attempt's epoch was its number, and a run
            # from then gets its item (at 0) when it is resumed.
            epoch = max(old + 1, attempt)
            entry = {"attempt": attempt, "job_name": job_name, FENCE_KEY: epoch, "execution": execution,
                     "launched_at": now}
            try:
                self.client.update_item(
                    TableName=self.table, Key={KEY: {"S": run_id}},
                    UpdateExpression="SET last_epoch = :epoch, attempts = list_append(if_not_exists(attempts, :empty), "
                                     ":attempt), #owner = :me, #status = if_not_exists(#status, :active), "
                                     "updated_at = :now, created_at = if_not_exists(created_at, :now)",
                    ConditionExpression=f"(attribute_not_exists({KEY}) OR #owner = :me) AND "
                                        "(attribute_not_exists(last_epoch) OR last_epoch = :old)",
                    ExpressionAttributeNames={"#owner": OWNER, "#status": "status"},
                    ExpressionAttributeValues={
                        ":epoch": {"N": str(epoch)}, ":old": {"N": str(old)}, ":empty": {"L": []},
                        ":attempt": {"L": [_attribute(entry)]}, ":me": {"S": execution},
                        ":active": {"S": ACTIVE}, ":now": {"S": now}})
                return epoch
            except Exception as exc:
                if not _failed_condition(exc):
                    raise
        record = self.read(run_id)
        raise LeaseLost(f"run {run_id}: no epoch could be issued to {execution} (held by "
                        f"{record.owner if record else '(none)'})")

    def hand_over(self, run_id: str, execution: str, *, successor: str, digest: str, state: dict[str, Any],
                  now: str) -> None:
        """Name the execution the run continues in (`successor`, started next with the input whose digest is
        `digest`) and the state it goes on from, as the run's owner; LeaseLost when `execution` does not hold it."""
        try:
            self.client.update_item(
                TableName=self.table, Key={KEY: {"S": run_id}},
                UpdateExpression="SET successor = :successor, successor_digest = :digest, handoff = :state, "
                                 "updated_at = :now",
                ConditionExpression="#owner = :me AND #status = :active",
                ExpressionAttributeNames={"#owner": OWNER, "#status": "status"},
                ExpressionAttributeValues={":successor": {"S": successor}, ":digest": {"S": digest},
                                           ":state": {"S": json.dumps(state, separators=(",", ":"))},
                                           ":now": {"S": now}, ":me": {"S": execution}, ":active": {"S": ACTIVE}})
        except Exception as exc:
            if not _failed_condition(exc):
                raise
            raise LeaseLost(f"run {run_id} is not held by {execution}: it cannot hand it over") from None

    def take_over(self, record: RunRecord, execution: str, *, digest: str, now: str) -> dict[str, Any]:
        """Take the run over as the successor its owner named (`record`, read just before), with the input it
        named; the state to go on from. RunHeld when `execution` is not that successor, or the owner changed."""
        if record.successor != execution or not record.handoff:
            raise RunHeld(record.run_id, record.owner)
        if digest != record.successor_digest:
            raise HandOverRefused(f"run {record.run_id} is handed over to execution {execution} with another input "
                                  "than the one it was started with: it is not taken over")
        try:
            self.client.update_item(
                TableName=self.table, Key={KEY: {"S": record.run_id}},
                UpdateExpression="SET #owner = :me, updated_at = :now " + _NO_HANDOVER,
                ConditionExpression="#owner = :holder AND successor = :me AND #status = :active",
                ExpressionAttributeNames={"#owner": OWNER, "#status": "status"},
                ExpressionAttributeValues={":me": {"S": execution}, ":holder": {"S": record.owner},
                                           ":now": {"S": now}, ":active": {"S": ACTIVE}})
        except Exception as exc:
            if not _failed_condition(exc):
                raise
            current = self.read(record.run_id)
            raise RunHeld(record.run_id, current.owner if current else "(none)") from None
        return json.loads(record.handoff)

    def release(self, run_id: str, execution: str, *, outcome: str, now: str,
                record: dict[str, Any] | None = None) -> bool:
        """Let go of the run, recording how the execution ended (and, from Summarize, the run's record: wall time,
        goodput, step, cost); False when `execution` did not hold it (or let go already: the first end recorded is
        kept, e.g. Summarize's before the reaper's)."""
        extra = ", #record = :record" if record is not None else ""
        values = {":record": _attribute(record)} if record is not None else {}
        names = {"#record": "record"} if record is not None else {}
        try:
            self.client.update_item(
                TableName=self.table, Key={KEY: {"S": run_id}},
                UpdateExpression=f"SET #status = :ended, #outcome = :outcome, updated_at = :now{extra} " + _NO_HANDOVER,
                ConditionExpression="#owner = :me AND #status = :active",
                ExpressionAttributeNames={"#owner": OWNER, "#status": "status", "#outcome": "outcome", **names},
                ExpressionAttributeValues={":ended": {"S": ENDED}, ":outcome": {"S": outcome}, ":now": {"S": now},
                                           ":me": {"S": execution}, ":active": {"S": ACTIVE}, **values})
            return True
        except Exception as exc:
            if not _failed_condition(exc):
                raise
            return False

    def scan(self) -> list[RunRecord]:
        """Every run of the launcher (a team's table: its runs only)."""
        return [RunRecord.from_item(item) for page in self.client.get_paginator("scan").paginate(
            TableName=self.table, ConsistentRead=True) for item in page.get("Items", [])]

    @staticmethod
    def executions(record: RunRecord) -> list[str]:
        """The ARNs of the executions that launched the run's attempts, oldest first, then its owner."""
        found: list[str] = []
        for arn in [*(a.get("execution", "") for a in record.attempts), record.owner]:
            if arn and arn not in found:
                found.append(arn)
        return found
