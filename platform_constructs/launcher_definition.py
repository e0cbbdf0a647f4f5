"""The job launcher's state machine definition: moving the state object between the Lambda functions.

    Prepare (Lambda jobs.handler.prepare) --RequestInvalid--> ParseRequestError [-> NotifyRefusal] -> RequestInvalid
      |   (its own fault: PrepareFault? -> PrepareFailed* -> Notify -> Failed: no run was taken, nothing launched)
      |   TakenOver? (a successor that took the run over goes on from its predecessor's decision: RetryOrFail)
    Launch (sagemaker:createTrainingJob.sync) --any error--> FailureCause? -(an ended job's description)-+
      |                                                        |                                    DropDescription
      |                                                        v                                          |
      |                                                      Decide (Lambda jobs.handler.decide) <-------+--+
      |                                                        |   (its fault, NextAttempt's: *Failed)    |
      |                        watch: WaitForJob (Wait) ------------------------------------------------+
      |                        retry: Backoff (Wait) -> NextAttempt (Lambda jobs.handler.relaunch: the next
      |                               attempt's name minted now) -> Launching? -> Launch (superseded: Summarize)
      |                        continue: StartSuccessor (states:startExecution, this machine) -> ContinuedIn
      |                                  -> Continued (its fault: GoOnHere -> Backoff or WaitForJob)
      |                        fail, succeed, *Failed: |
    Summarize (Lambda jobs.handler.summarize: stops the run's jobs still running) <--+
      |   (its own fault: StopCurrentJob (sagemaker:StopTrainingJob) -> SummarizeFailed)
    Notify (SNS) -> Outcome? -> Summary -> Succeeded (output: the summary)
                             -> Failed (error: the category, cause: the reason)

Prepare takes the run's lease in the run registry (jobs.registry) and every launch issues its epoch there;
Summarize lets the run go. An execution whose history nears Step Functions' limit (25,000 events) hands the run over
when Decide next decides to watch or retry: the registry names a new execution of the run, which the state machine
starts and which takes the run over in Prepare (TakenOver: it goes on from the decision, its job still running).
An execution that ends any other way (a console stop, a failure no Catch takes, a timeout) is answered outside this
definition: the launcher's execution-status rule invokes the reaper (jobs.handler.reap), which stops the run's jobs
and lets the run go.

A launch error does not prove that no job runs (a 5xx after the job was created, a throttled poll, the
attempt's own name in use): Decide looks the job up and, while it runs, the execution waits on it in the
WaitForJob -> Decide loop instead of starting a second job on the same checkpoints. Whatever ends the run,
Summarize (or, when Summarize itself fails, StopCurrentJob) stops the job the run left running.
The Wait states and the Choices are not Tasks and can carry no Catch: they only move paths that Decide always writes.

The state does not grow with the request (jobs.request.state_size): it is {"run": the run state, "launch": ...,
"decision"?, "result"?}, where `launch` is what the Launch state takes or gave: {"create": the attempt's
CreateTrainingJob request}, then {"job": the job's description} or the Catch's {"Error", "Cause"}, each in the
place of the one before. The request itself is the execution's input: Prepare and Decide read it from the
context object (`$$.Execution.Input`), so it is never carried. A failed job's Cause is its whole description
(as large as the request): DropDescription leaves it out before Decide, which looks the job up by name instead.

Every decision (classify the failure, pick the next instance type, wait, give up) is made by the `jobs`
package inside the Lambda functions, so the same code is unit-tested, used by `trainctl`, and executed
here. The definition only moves the state object between them, invoking each function's version of the same
deploy (`functions` are versions), so that an execution runs the code it started with. State names are the
construct ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from jobs.handler import STATE_SHAPE, JobsStillRunning
from jobs.retry.policy import (
    FUNCTION_RETRIES,
    FUNCTION_RETRY_SECONDS,
    STOP_RETRIES,
    STOP_RETRY_MAX_SECONDS,
    STOP_RETRY_SECONDS,
)
from jobs.retry.run_state import CONTINUED_IN
from jobs.timestamps import times
from platform_constructs.launch_task import LaunchTrainingJob

# The category of a run whose launcher failed it (its own function's fault past the retries), not a job's.
LAUNCHER_ERROR = "launcher_error"
# The request: the execution's input, read where it is needed rather than carried in the state.
EXECUTION_INPUT = "$$.Execution.Input"


@dataclass(frozen=True, kw_only=True)
class LauncherDefinitionProps:
    functions: Mapping[str, lambda_.IFunction]
    """The state machine's functions by handler name (launcher_functions.STATE_MACHINE_HANDLERS): each one's
    version of the deploy (LauncherFunctions.versions), so that an execution runs the code it started with."""
    launch: LaunchTrainingJob
    """The Launch state."""
    topic: sns.ITopic
    """Where Notify publishes each run's outcome."""
    state_machine_arn: str
    """The state machine's own ARN, written from its name (its attribute would make a cycle): a run nearing the
    history limit starts the state machine again (StartSuccessor)."""
    notify_refusals: bool = False
    """Whether a refused request is published to `topic` before the execution fails (NotifyRefusal). @default False"""


class LauncherDefinition(Construct):
    """The states; `start` is the chain to hand to DefinitionBody.from_chainable, `launch` the Launch state."""

    def __init__(self, scope: Construct, id: str, props: LauncherDefinitionProps) -> None:
        super().__init__(scope, id)
        self.functions = props.functions
        self.launch = launch = props.launch
        self.state_machine_arn = props.state_machine_arn
        prepare = self._prepare(props.topic if props.notify_refusals else None)
        summarize = self._invoke("Summarize", "summarize", result_path="$.result", retry_first={
            "errors": [JobsStillRunning.__name__], "interval": Duration.seconds(STOP_RETRY_SECONDS),
            "backoff_rate": 2, "max_delay": Duration.seconds(STOP_RETRY_MAX_SECONDS), "max_attempts": STOP_RETRIES})
        decide, retry_or_fail = self._decide(summarize)
        launch.add_catch(self._without_description(decide), errors=["States.ALL"], result_path="$.launch")
        notify = self._notify_and_end(props.topic)
        summarize.add_catch(summarize_failed(self, launch, notify), errors=["States.ALL"],
                            result_path="$.summarize_error")
        prepare.add_catch(prepare_failed(self, notify), errors=["States.ALL"], result_path="$.prepare_error")
        # A successor (continue_in_new_execution) takes the run over in Prepare and goes on from its predecessor's
        # decision; a run's first execution, or a resumed one, launches.
        taken_over = sfn.Choice(self, "TakenOver").when(sfn.Condition.is_present("$.decision"), retry_or_fail)
        self.start: sfn.IChainable = prepare.next(taken_over.otherwise(launch))
        launch.next(summarize).next(notify)

    def _invoke(self, id: str, name: str, payload: dict[str, Any] | None = None, result_path: str | None = None,
                retry_first: dict[str, Any] | None = None) -> tasks.LambdaInvoke:
        task = tasks.LambdaInvoke(
            self, id,
            lambda_function=self.functions[name],
            payload=sfn.TaskInput.from_object(payload) if payload else None,
            # The handler's return value is the state (no Lambda response envelope around it).
            payload_response_only=True,
            retry_on_service_exceptions=True,
            result_path=result_path,
        )
        # The service retrier above covers Lambda's own faults, not the function's: an error it raises or a
        # timeout (Sandbox.Timedout, Lambda.Unknown) ends the task. Every handler is safe to run again (it reads
        # and decides; a stop or a look-up repeats harmlessly; a fresh random name replaces one that was never
        # used), so a transient fault is retried; a refused request (RequestInvalid) is final, and retriers
        # match in order.
        task.add_retry(errors=["RequestInvalid"], max_attempts=0)
        if retry_first is not None:  # a retrier of its own for an error of its own, before the general one
            task.add_retry(**retry_first)
        task.add_retry(errors=["States.ALL"], interval=Duration.seconds(FUNCTION_RETRY_SECONDS), backoff_rate=2,
                       max_attempts=FUNCTION_RETRIES)
        return task

    def _prepare(self, refusals_to: sns.ITopic | None) -> tasks.LambdaInvoke:
        prepare = self._invoke("Prepare", "prepare", {
            "state_shape": STATE_SHAPE,
            "request": sfn.JsonPath.object_at(EXECUTION_INPUT),
            "execution": {"name": sfn.JsonPath.execution_name,
                          "start_time": sfn.JsonPath.string_at("$$.Execution.StartTime"),
                          "id": sfn.JsonPath.execution_id},
        })
        # The Lambda error's Cause is the JSON {errorMessage, errorType, ...}; the Fail state shows the
        # message, one "field.path: problem" line per problem.
        parse_error = sfn.Pass(self, "ParseRequestError", parameters={"error.$": "States.StringToJson($.error.Cause)"})
        request_invalid = sfn.Fail(self, "RequestInvalid", error="RequestInvalid", cause_path="$.error.errorMessage")
        if refusals_to is not None:  # the platform asked for refusals on the topic too (notify_refusals)
            told = tasks.SnsPublish(
                self, "NotifyRefusal", topic=refusals_to,
                subject=sfn.JsonPath.format("Training request {} refused", sfn.JsonPath.execution_name),
                message=sfn.TaskInput.from_json_path_at("$.error.errorMessage"), result_path=sfn.JsonPath.DISCARD)
            told.add_catch(request_invalid, errors=["States.ALL"], result_path="$.notify_error")
            parse_error.next(told).next(request_invalid)
        else:
            parse_error.next(request_invalid)
        prepare.add_catch(parse_error, errors=["RequestInvalid"], result_path="$.error")
        return prepare

    def _without_description(self, decide: sfn.IChainable) -> sfn.IChainable:
        """The Catch's {"Error", "Cause"} on to Decide, less a Cause that is an ended job's description (JSON)."""
        drop = sfn.Pass(self, "DropDescription", parameters={
            "run.$": "$.run", "launch": {"Error.$": "$.launch.Error"}})
        drop.next(decide)
        # Two Choices, not an And: a rule on a path that is not there fails the execution, and nothing promises
        # that an And stops at its first false rule. A Catch's Cause, when there is one, is a string.
        described = sfn.Choice(self, "DescribedFailure").when(
            sfn.Condition.string_matches("$.launch.Cause", "{*"), drop).otherwise(decide)
        return sfn.Choice(self, "FailureCause").when(
            sfn.Condition.is_present("$.launch.Cause"), described).otherwise(decide)

    def _decide(self, summarize: sfn.IChainable) -> tuple[tasks.LambdaInvoke, sfn.Choice]:
        decide = self._invoke("Decide", "decide", {
            "request": sfn.JsonPath.object_at(EXECUTION_INPUT),
            "run": sfn.JsonPath.object_at("$.run"),
            "failure": sfn.JsonPath.object_at("$.launch"),
        })
        backoff = sfn.Wait(self, "Backoff", time=sfn.WaitTime.seconds_path("$.decision.wait_seconds"))
        # The next attempt's name is minted after the wait, as its job is created (never public before the wait);
        # its answer drops the decision, so that Summarize sees either `launch.job` (success) or `decision` (failure:
        # an execution that lost its run launches nothing).
        next_attempt = self._invoke("NextAttempt", "relaunch", {
            "request": sfn.JsonPath.object_at(EXECUTION_INPUT),
            "run": sfn.JsonPath.object_at("$.run"),
            "decision": sfn.JsonPath.object_at("$.decision"),
        })
        launching = sfn.Choice(self, "Launching").when(
            sfn.Condition.is_present("$.launch.create"), self.launch).otherwise(summarize)
        # The attempt's job still runs (or could not be looked up): look again after the wait, never relaunch.
        wait_for_job = sfn.Wait(self, "WaitForJob", time=sfn.WaitTime.seconds_path("$.decision.wait_seconds"))
        backoff.next(next_attempt).next(launching)
        wait_for_job.next(decide)
        retry_or_fail = (
            sfn.Choice(self, "RetryOrFail")
            .when(sfn.Condition.string_equals("$.decision.action", "retry"), backoff)
            .when(sfn.Condition.string_equals("$.decision.action", "watch"), wait_for_job)
            .when(sfn.Condition.string_equals("$.decision.action", "continue"),
                  self._continue_in_new_execution(backoff, wait_for_job))
            .otherwise(summarize)
        )
        decide.next(retry_or_fail)
        # A fault in the decide or relaunch function itself must still end in a summary and a notification.
        self._when_it_fails(decide, "DecideFailed", "decide", summarize)
        self._when_it_fails(next_attempt, "NextAttemptFailed", "relaunch", summarize)
        return decide, retry_or_fail

    def _when_it_fails(self, task: tasks.LambdaInvoke, id: str, name: str, summarize: sfn.IChainable) -> None:
        """Past its retries, a function's fault ends the run as `launcher_error` through Summarize, which puts it in
        words (jobs.retry.policy.launcher_fault: the step, what it was doing, the tries, the way back)."""
        error = f"$.{name}_error"
        failed = sfn.Pass(self, id, parameters={
            "run.$": "$.run",
            "decision": launcher_error(f"States.Format('the {name} step failed ({{}})', {error}.Error)",
                                       fault={"function": name, "error.$": f"{error}.Error", "cause.$": f"{error}.Cause"}),
        })
        task.add_catch(failed.next(summarize), errors=["States.ALL"], result_path=error)

    def _continue_in_new_execution(self, backoff: sfn.IChainable, wait_for_job: sfn.IChainable) -> sfn.IChainable:
        """Decide handed the run over (its history nears the limit: jobs.handler.continue_near_limit): start the
        execution it named, with this one's input changed as it says (resume the run), and end here. Started by name,
        so a start answered with an error after it took is harmless to repeat (the same name and input answer as the
        first). A start that keeps failing goes on here with what Decide decided (`then`): it hands over again at
        its next decision."""
        start = tasks.StepFunctionsStartExecution(
            self, "StartSuccessor",
            state_machine=sfn.StateMachine.from_state_machine_arn(self, "Itself", self.state_machine_arn),
            integration_pattern=sfn.IntegrationPattern.REQUEST_RESPONSE,
            name=sfn.JsonPath.string_at("$.handoff.name"),
            input=sfn.TaskInput.from_json_path_at(sfn.JsonPath.json_merge(
                sfn.JsonPath.object_at(EXECUTION_INPUT), sfn.JsonPath.object_at("$.handoff.changes"))),
            result_selector={"arn.$": "$.ExecutionArn"},
            result_path="$.continued",
        )
        start.add_retry(errors=["States.ALL"], interval=Duration.seconds(FUNCTION_RETRY_SECONDS), backoff_rate=2,
                        max_attempts=FUNCTION_RETRIES)
        go_on_here = sfn.Choice(self, "GoOnHere").when(
            sfn.Condition.string_equals("$.decision.then", "retry"), backoff).otherwise(wait_for_job)
        start.add_catch(go_on_here, errors=["States.ALL"], result_path="$.handoff_error")
        # The execution's output says where the run went on (trainctl follows it; the run's record is the last one's).
        continued = sfn.Pass(self, "ContinuedIn", parameters={
            "run_id.$": "$.run.run_id", f"{CONTINUED_IN}.$": "$.continued.arn"})
        return start.next(continued).next(sfn.Succeed(self, "Continued"))

    def _notify_and_end(self, topic: sns.ITopic) -> sfn.IChainable:
        notify = tasks.SnsPublish(
            self, "Notify", topic=topic,
            subject=sfn.JsonPath.string_at("$.result.subject"),
            message=sfn.TaskInput.from_json_path_at("$.result.message"),
            result_path=sfn.JsonPath.DISCARD,
        )
        outcome = sfn.Choice(self, "Outcome")
        # The execution's output is the summary: a Pass selects it (cfn-lint's schema gives Succeed no paths).
        succeeded = sfn.Pass(self, "Summary", input_path="$.result.summary").next(sfn.Succeed(self, "Succeeded"))
        # The error and cause the console shows: Summarize's (a launcher fault in words), or the Pass that stood in
        # for it (SummarizeFailed, PrepareFailed).
        failed = sfn.Fail(self, "Failed", error_path="$.result.category", cause_path="$.result.reason")
        # A notification that cannot be sent must not hide the job's outcome.
        notify.add_catch(outcome, errors=["States.ALL"], result_path="$.notify_error")
        return notify.next(
            outcome.when(sfn.Condition.boolean_equals("$.result.succeeded", True), succeeded).otherwise(failed))


def summarize_failed(scope: Construct, launch: LaunchTrainingJob, notify: sfn.IChainable) -> sfn.IChainable:
    """Summarize's own fault: stop the current attempt's job here (Summarize would have), then notify."""
    stop = tasks.CallAwsService(
        scope, "StopCurrentJob", service="sagemaker", action="stopTrainingJob",
        parameters={"TrainingJobName": sfn.JsonPath.string_at("$.run.job_name")},
        iam_resources=[launch.training_job_arn_pattern],
        result_path=sfn.JsonPath.DISCARD,
    )

    failed = fault_in_words(
        scope, "Summarize", "$.summarize_error",
        "the summarize step kept failing (past its retries) while ending the run",
        "; the launcher asked SageMaker to stop {} in case it still ran; `trainctl resume {}` continues the run "
        "from its checkpoints", ("$.run.job_name", "$.run.run_id"), "$.run.name", notify, keep={"run.$": "$.run"})
    # A job that already ended (or was never created) answers ValidationException: nothing to stop.
    stop.add_catch(failed, errors=["States.ALL"], result_path="$.stop_error")
    return stop.next(failed)


def fault_in_words(scope: Construct, id: str, error: str, words: str, after: str, after_args: tuple[str, ...],
                   name_path: str, then: sfn.IChainable, keep: dict[str, str] | None = None) -> sfn.IChainable:
    """The states that put a caught fault in words where no function can (Prepare's, Summarize's own): the Lambda
    error's errorMessage out of its cause when the cause is JSON, the cause itself when it is text, the error name
    alone when there is none; never the payload. `words` and `after` frame it (no apostrophe: they sit inside an
    intrinsic's single-quoted literal), `after_args` fill `after`'s {}. Each end is a `launcher_error` decision and
    its notification (`name_path`: the run's name in the subject), with the `keep` paths of the state."""
    ends = []
    for suffix, message in (("", f"{error}.Cause.errorMessage"), ("Plainly", f"{error}.Cause"), ("Bare", None)):
        said = "" if message is None else ": {}"
        args = ", ".join((f"{error}.Error", *(() if message is None else (message,)), *after_args))
        reason = f"States.Format('{words} ({{}}){said}{after}', {args})"
        ends.append(sfn.Pass(scope, f"{id}Failed{suffix}", parameters={
            **(keep or {}),
            "decision": launcher_error(reason),
            "result": {"succeeded": False, "message.$": reason, "category": LAUNCHER_ERROR, "reason.$": reason,
                       "subject.$": f"States.Format('Training run {{}} failed: {LAUNCHER_ERROR}', {name_path})"},
        }).next(then))
    # Into the same path: the rest of the state (the run) goes on.
    parsed = sfn.Pass(scope, f"{id}FaultParsed", result_path=error, parameters={
        "Error.$": f"{error}.Error", "Cause.$": f"States.StringToJson({error}.Cause)"})
    parsed.next(sfn.Choice(scope, f"{id}FaultMessage").when(
        sfn.Condition.is_present(f"{error}.Cause.errorMessage"), ends[0]).otherwise(ends[1]))
    json_cause = sfn.Choice(scope, f"{id}FaultCause").when(sfn.Condition.string_matches(f"{error}.Cause", "{*"), parsed)
    return sfn.Choice(scope, f"{id}Fault").when(
        sfn.Condition.is_present(f"{error}.Cause"), json_cause.otherwise(ends[1])).otherwise(ends[2])


def prepare_failed(scope: Construct, notify: sfn.IChainable) -> sfn.IChainable:
    """Prepare's own fault past its retries (a refused request is RequestInvalid's): no run was taken and nothing
    launched, so there is nothing to summarize; the operator is told in words and notified."""
    return fault_in_words(
        scope, "Prepare", "$.prepare_error",
        f"the prepare step failed {times(FUNCTION_RETRIES + 1)} while reading the request and taking the run",
        "; nothing was launched: start the execution again (the same input) once the launcher works, or ask the "
        "platform team (the logs of the Prepare function hold the trace)", (), "$$.Execution.Name", notify)


def launcher_error(reason: str, **more: Any) -> dict[str, Any]:
    """The `fail` decision of a launcher fault, its reason an intrinsic (States.Format) of the state."""
    return {"action": "fail", "wait_seconds": 0, "category": LAUNCHER_ERROR, "reason.$": reason, **more}
