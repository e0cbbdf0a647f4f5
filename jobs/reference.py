"""The request format and the retry policy as Markdown, generated from the schema: `python -m jobs.reference`.

README.md carries this text; regenerate it here when a field changes so the two never drift.
"""

from __future__ import annotations

from contract.schema import reference_rows
from jobs.request.schema import JobRequest
from jobs.retry.policy import (
    CONTINUE_AT_EVENTS,
    FUNCTION_RETRIES,
    FUNCTION_RETRY_SECONDS,
    HISTORY_LIMIT,
    SETTLE_LOOKS,
    STOP_RETRIES,
    STOP_RETRY_MAX_SECONDS,
    STOP_RETRY_SECONDS,
    WATCH_MIN_SECONDS,
    retry_waits,
)

_FUNCTION_WAITS = [f"{w:g}" for w in retry_waits(FUNCTION_RETRIES, FUNCTION_RETRY_SECONDS)]
_FUNCTION_WAITS_TEXT = f"{', '.join(_FUNCTION_WAITS[:-1])} and {_FUNCTION_WAITS[-1]}"
_STOP_MINUTES = sum(retry_waits(STOP_RETRIES, STOP_RETRY_SECONDS, STOP_RETRY_MAX_SECONDS)) / 60
RETRY_POLICY = f"""\
| Failure (how it is recognised) | What the state machine does |
|---|---|
| Capacity shortage (`FailureReason` starts `CapacityError: Unable to provision requested ML compute capacity`, an insufficient-capacity message, `MaxPendingTimeInSeconds` reached, or 30+ minutes in `Pending`) | wait `retry.capacity_wait_seconds`, doubling each time up to `retry.capacity_wait_max_seconds`, then the next type of `[instance.type, *instance.fallbacks]` (cycling; the same type when there are none) |
| Spot interruption (`SecondaryStatus` `Interrupted`) or `MaxWaitTimeExceeded` | wait `retry.interruption_wait_seconds`, new attempt; after `retry.interruptions_before_on_demand` interruptions, on demand |
| SageMaker internal error (`InternalServerError`, `InternalFailure`, HTTP 5xx in any spelling) | wait `retry.internal_error_wait_seconds`, retry, at most `retry.internal_error_max_retries` times |
| A Launch error while the attempt's job exists and runs (a 5xx after the job was created, a throttled poll, the attempt's own name `ResourceInUse`) | no second job: wait on that job (looks every `retry.api_error_wait_seconds`, at least {WATCH_MIN_SECONDS} s, doubling up to 20 minutes) and decide when it ends; a job that cannot be looked up (throttled, denied) is waited on as long as it can run (its max runtime, or max wait on Spot, plus an hour), never stopped for it; a create that answered a 5xx whose job is not found is looked up {SETTLE_LOOKS} times before the attempt counts as never created (SageMaker's reads lag its writes) |
| The platform's own permissions refuse the launch (`AccessDenied`, "not authorized to perform", `iam:PassRole`) | no retry: the run fails with `platform_config`, saying the platform team must give the launcher what it lacks; then `trainctl resume <run id>` continues it |
| Another execution holds the run (a second resume), or a newer attempt claimed its checkpoints (`[training:superseded]`) | a second resume is refused in Prepare naming the execution that holds the run; an execution that lost its run ends with `superseded` and launches nothing more |
| The execution's history nears Step Functions' {HISTORY_LIMIT:,} events ({CONTINUE_AT_EVENTS:,} when Decide next watches or retries) | the run goes on in a new execution of the same run (continue-as-new), with its job still running or its next attempt due: the registry names the successor and the input it starts with, and only that execution takes the run over; this one ends `SUCCEEDED` with `continued_in` naming it (`trainctl submit --wait` and `status` follow it). A successor that cannot be started leaves the run going on here, handed over at the next decision |
| A fault of a launcher function (an error it raises, a timeout) | retried {FUNCTION_RETRIES} times, {_FUNCTION_WAITS_TEXT} s apart (a refused request excepted); one that persists ends the run with `launcher_error`, a summary and a notification, in words: the step, what it was doing, the tries, the error (never its JSON) and `trainctl resume <run id>`; Prepare's own fault ends the execution the same way, nothing launched |
| Hardware or infrastructure fault (an instance replaced as unhealthy, uncorrectable ECC, NCCL/EFA transport errors) | new attempt with `infra_check` on, on the next fallback type when there is one; at most `retry.hardware_max_retries` times |
| Quota (`ResourceLimitExceeded` at CreateTrainingJob) or throttling (`ThrottlingException`, "Rate exceeded") | wait `retry.api_error_wait_seconds`, doubling up to `retry.api_error_wait_max_seconds`, retry; give up after `retry.api_error_max_retries` in a row |
| Impossible quota (an account limit of 0, a request above the limit, a type not offered in the region) | no retry: the run fails saying which quota to raise |
| The user's code or data (`AlgorithmError`, `ClientError`, a rejected request, the training package's own `[training:<code>]` failure line) | no retry: the run fails with the reason (for out of memory, what to lower); once fixed, `trainctl resume <run id> REQUEST` continues it from its checkpoints |
| Stopped while its execution runs (`TrainingJobStatus` `Stopped`, no reason): SageMaker, a training plan's end, the console | resumed like an interruption; a training plan an attempt was stopped on, failed for capacity naming, or whose create was refused naming it, is not targeted again (the next attempt runs on demand on its type). `trainctl stop` (or stopping the execution) is how a run is stopped: it ends the execution before the job |
| `MaxRuntimeExceeded` | no retry; checkpoints are kept: `trainctl resume <run id>` continues the run (raise `max_runtime_hours` to give each attempt longer) |
| Anything unrecognised | no retry (fail safe) |
| A retry budget spent: `retry.max_attempts` attempts, `retry.max_total_hours` (waits included), or the internal-error, hardware, quota or throttling retries | the run fails in one wording: what ran out ("attempts exhausted (3 of 3)", "SageMaker internal errors persisted (twice; ...)"), what was tried (the attempts, their instance types, the waits), the last failure, and `trainctl resume <run id>`, which continues it from its checkpoints with a new budget |
| The run ends, however it ends (a fault in Decide or Summarize included, a console stop, a timeout) | any job of the run still running is stopped, recorded or not (every job carrying the run's marker; after an execution ends any other way, the execution-status rule's reaper does it) (a stop refused for a passing reason, such as throttling, makes Summarize run again, {STOP_RETRY_SECONDS} s to {STOP_RETRY_MAX_SECONDS // 60} min apart for about {_STOP_MINUTES:.0f} minutes); the summary lists it |

Every attempt is a new training job named `<name_prefix>-<run id>-<8 random characters>-a<N>` that resumes
from the run's one checkpoint prefix, `s3://<checkpoint bucket>/<name_prefix>/<run id>/checkpoints/`. The run
id is the request's name and 16 random characters (80 bits), drawn once per execution; every attempt's job
carries it in its environment as `TRAINING_RUN_ID`, and a job found under an attempt's name without it is
another's: never waited on or stopped, and the run retries under a new name. The execution's output
is a summary: every attempt (job name, instance type, Spot, status, category, reason, times, billable
seconds, work lost), final metrics, whether the run was input bound (its steps' wait for data over
input_bound_share), the model artifact URI and the run's record, which the notification
carries too: wall time, step reached, goodput (productive training time over the instance time held) with
the losses split into startup, checkpoint stalls, evaluation and work redone after an interruption (the age
of the newest checkpoint when the attempt ended), and the cost, on demand and Spot apart, from the AWS Price
List API ("unknown" without a price). `trainctl runs` lists runs with the same figures across every
execution of a run; `trainctl show RUN [--chart FILE.png]` prints one in full (`--prices` as for `plan`).

A run that ended without completing (max runtime, attempts or time spent, stopped, a failure since fixed) is
continued by `trainctl resume <run id> [REQUEST]`: a new execution whose request (REQUEST, or the one its last
execution was sent) carries `resume_run`, under the same run id and checkpoint prefix, its attempts numbered on
from the run's last, with a new retry budget. The request may change `hyperparameters.max_steps`, the instances
and `retry`, not `model` or `model_size`. trainctl refuses a run with an execution still running (training, or
waiting between attempts, found through the run registry however old); Prepare refuses, naming `resume_run`, a run
another live execution holds (its lease in the registry), a run it finds no job of, a run whose job is
active (`InProgress` or `Stopping`), and a run that completed (start a new run with `hyperparameters.init_from`
instead).
"""


def fields_table() -> str:
    lines = ["| Field | Type | Default | Meaning |", "|---|---|---|---|"]
    for path, type_, default, doc in reference_rows(JobRequest):
        shown = default if default in ("required", "see below") else f"`{default}`"
        lines.append(f"| `{path}` | {type_} | {shown} | {doc.replace('|', '/')} |")
    return "\n".join(lines)


def markdown() -> str:
    return f"### Job request reference\n\n{fields_table()}\n\n### Retry policy\n\n{RETRY_POLICY}"


if __name__ == "__main__":
    print(markdown())
