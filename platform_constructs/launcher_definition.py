"""The job launcher's state machine definition: moving the state object between the Lambda functions.

    Prepare (Lambda jobs.handler.prepare) --RequestInvalid--> ParseRequestError -> RequestInvalid (Fail)
      |
    Launch (sagemaker:createTrainingJob.sync) --any error--> Decide (Lambda jobs.handler.decide)
      |                                                        |   (its own fault: DecideFailed -> Summarize)
      |                        retry: Backoff (Wait) -> NextAttempt (Pass) -> Launch
      |                        fail:  |
    Summarize (Lambda jobs.handler.summarize) <----------------+
      |
    Notify (SNS) -> Outcome? -> Summary -> Succeeded (output: the summary)
                             -> Failed (error: the category, cause: the reason)

Every decision (classify the failure, pick the next instance type, wait, give up) is made by the `jobs`
package inside the Lambda functions, so the same code is unit-tested, used by `trainctl`, and executed
here. The definition only moves the state object between them. State names are the construct ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from platform_constructs.launch_task import LaunchTrainingJob


class LauncherDefinition(Construct):
    """The states; `start` is the chain to hand to DefinitionBody.from_chainable, `launch` the Launch state."""

    def __init__(self, scope: Construct, id: str, *, functions: Mapping[str, lambda_.IFunction],
                 launch: LaunchTrainingJob, topic: sns.ITopic) -> None:
        super().__init__(scope, id)
        self.functions = functions
        self.launch = launch
        prepare = self._prepare()
        summarize = self._invoke("Summarize", "summarize", result_path="$.result")
        decide = self._decide(summarize)
        launch.add_catch(decide, errors=["States.ALL"], result_path="$.failure")
        self.start: sfn.IChainable = (
            prepare.next(launch).next(summarize).next(self._notify_and_end(topic)))

    def _invoke(self, id: str, name: str, payload: dict[str, Any] | None = None,
                result_path: str | None = None) -> tasks.LambdaInvoke:
        return tasks.LambdaInvoke(
            self, id,
            lambda_function=self.functions[name],
            payload=sfn.TaskInput.from_object(payload) if payload else None,
            # The handler's return value is the state (no Lambda response envelope around it).
            payload_response_only=True,
            retry_on_service_exceptions=True,
            result_path=result_path,
        )

    def _prepare(self) -> tasks.LambdaInvoke:
        prepare = self._invoke("Prepare", "prepare", {
            "request": sfn.JsonPath.entire_payload,
            "execution": {"name": sfn.JsonPath.execution_name,
                          "start_time": sfn.JsonPath.string_at("$$.Execution.StartTime")},
        })
        # The Lambda error's Cause is the JSON {errorMessage, errorType, ...}; the Fail state shows the
        # message, one "field.path: problem" line per problem.
        parse_error = sfn.Pass(self, "ParseRequestError", parameters={"error.$": "States.StringToJson($.error.Cause)"})
        request_invalid = sfn.Fail(self, "RequestInvalid", error="RequestInvalid", cause_path="$.error.errorMessage")
        prepare.add_catch(parse_error.next(request_invalid), errors=["RequestInvalid"], result_path="$.error")
        return prepare

    def _decide(self, summarize: sfn.IChainable) -> tasks.LambdaInvoke:
        decide = self._invoke("Decide", "decide", {
            "run": sfn.JsonPath.object_at("$.run"),
            "create": sfn.JsonPath.object_at("$.create"),
            "failure": sfn.JsonPath.object_at("$.failure"),
        })
        backoff = sfn.Wait(self, "Backoff", time=sfn.WaitTime.seconds_path("$.decision.wait_seconds"))
        # Drop the last decision so that Summarize sees either `job` (success) or `decision` (failure).
        next_attempt = sfn.Pass(self, "NextAttempt", parameters={"run.$": "$.run", "create.$": "$.create"})
        retry_or_fail = (
            sfn.Choice(self, "RetryOrFail")
            .when(sfn.Condition.string_equals("$.decision.action", "retry"),
                  backoff.next(next_attempt).next(self.launch))
            .otherwise(summarize)
        )
        decide.next(retry_or_fail)
        # A fault in the decide function itself must still end in a summary and a notification.
        decide_failed = sfn.Pass(self, "DecideFailed", parameters={
            "run.$": "$.run",
            "create.$": "$.create",
            "decision": {
                "action": "fail",
                "wait_seconds": 0,
                "category": "launcher_error",
                "reason.$": "States.Format('the decide function failed ({}): {}', $.decide_error.Error, "
                "$.decide_error.Cause)",
            },
        })
        decide.add_catch(decide_failed.next(summarize), errors=["States.ALL"], result_path="$.decide_error")
        return decide

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
        failed = sfn.Fail(self, "Failed", error_path="$.decision.category", cause_path="$.decision.reason")
        # A notification that cannot be sent must not hide the job's outcome.
        notify.add_catch(outcome, errors=["States.ALL"], result_path="$.notify_error")
        return notify.next(
            outcome.when(sfn.Condition.boolean_equals("$.result.succeeded", True), succeeded).otherwise(failed))
