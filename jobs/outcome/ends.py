"""Every way a launcher execution ends, and what the operator gets from each: the execution's status, what the
console shows as its error and cause, the next step, and the notification.

The ends are the state machine's terminal states (each Fail and Succeed of platform_constructs.launcher_definition;
every Catch leads to one of them) and an abort (StopExecution, the console's Stop) in any state, which the
execution-status rule answers outside the definition (jobs.handler.reap). tests/launcher/test_ends.py reads the
synthesized definition and fails on a terminal state without a row here, and on a row whose test does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass

ABORTED = "(aborted in any state)"
# The states an execution passes through before its run is taken (a refusal, Prepare's own fault and its notification):
# any other state entered means Prepare took the request (`trainctl submit` waits for that before saying "started").
# tests/launcher/test_ends.py checks these are the definition's, and that every state after Prepare's success is not.
BEFORE_THE_RUN = ("ParseRequestError", "NotifyRefusal", "RequestInvalid", "Notify", "Outcome", "Failed")
BEFORE_THE_RUN_PREFIX = "Prepare"  # Prepare itself, PrepareFault..., PrepareFailed...


def taken_by(state: str) -> bool:
    """Does entering `state` show that the execution's request was taken (Prepare succeeded)?"""
    return bool(state) and state not in BEFORE_THE_RUN and not state.startswith(BEFORE_THE_RUN_PREFIX)


@dataclass(frozen=True)
class End:
    status: str  # the execution's status (Step Functions')
    error: str  # what the console shows as the execution's error
    cause: str  # what it shows as the cause: a reason in words, never a raw payload
    next_step: str
    notified: str  # where the notification goes, or why none
    reached_by: tuple[str, ...]  # tests that reach this end in moto and check what the operator gets (path::name)


ENDS: dict[str, End] = {
    "Succeeded": End(
        "SUCCEEDED", "none", "none; the output is the run's summary (attempts, metrics, cost, where the model is)",
        "none: the model is in the output bucket (`trainctl show RUN`)",
        "the team's topic: 'Training run NAME succeeded'",
        ("tests/launcher/test_scenarios.py::test_success_first_time",)),
    "Failed": End(
        "FAILED", "the run's category (user_error, capacity, attempts and budgets, platform_config, launcher_error...)",
        "the reason in words: the failure, what was tried, the way back (jobs.retry.policy: budget_spent, "
        "launcher_fault; Prepare's own fault in the definition's words)",
        "`trainctl resume RUN` (after fixing the field or the platform setting the reason names)",
        "the team's topic: 'Training run NAME failed: CATEGORY'",
        ("tests/launcher/test_scenarios.py::test_user_code_error_fails_after_one_attempt",
         "tests/launcher/test_scenarios.py::test_attempts_exhausted",
         "tests/launcher/test_scenarios.py::test_a_fault_in_the_decide_function_still_ends_with_a_summary",
         "tests/launcher/test_function_faults.py::"
         "test_a_prepare_that_keeps_failing_ends_the_execution_told_in_words_with_a_notification")),
    "RequestInvalid": End(
        "FAILED", "RequestInvalid", "one 'field.path: problem' line per problem Prepare found",
        "fix the named field and start again (`trainctl submit` and `resume` refuse the same before starting, and "
        "print Prepare's refusal instead of 'started')",
        "whoever started it is told (trainctl waits for the verdict; the console shows the cause); the team's topic "
        "too with the platform setting notify_refusals",
        ("tests/launcher/test_scenarios.py::test_bad_input_fails_in_prepare_naming_the_field",
         "tests/cli/test_launcher_end_to_end.py::test_what_prepare_would_refuse_is_refused_where_it_was_asked",
         "tests/launcher/test_construct_props.py::test_a_refusal_reaches_the_topic_only_when_the_platform_asks")),
    "Continued": End(
        "SUCCEEDED", "none", "none; the output is {run_id, continued_in}: the run goes on in that execution",
        "none: `trainctl status` and `submit --wait` follow the run into its successor",
        "none here: the successor notifies when the run ends",
        ("tests/launcher/test_continue_as_new.py::test_a_long_watch_goes_on_in_new_executions_with_its_one_job",)),
    ABORTED: End(
        "ABORTED", "none", "none: someone stopped it (the console, StopExecution)",
        "`trainctl resume RUN` continues the run from its checkpoints",
        "none: whoever stopped it knows; the reaper stops the run's jobs and lets the run go",
        ("tests/launcher/test_one_writer.py::test_a_console_stop_in_any_state_leaves_no_job_running",)),
}
