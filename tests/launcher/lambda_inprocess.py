"""Invoke the launcher's Lambda handlers in-process, returning what the Lambda Invoke API would.

moto's Lambda runs function code in Docker, which these machines lack. The state machine's Lambda tasks
reach `lambda_eval_utils._invoke_lambda_function(parameters, region, state_credentials)`; this module
replaces it with a call to the real `jobs.handler` function named by the deployed function's Handler
property. A handler exception becomes what Lambda returns for an unhandled error: FunctionError "Unhandled"
and the payload {errorMessage, errorType, requestId, stackTrace}, which the interpreter turns into the task
error (Error = errorType, Cause = the payload JSON), as Step Functions does.
"""

from __future__ import annotations

import importlib
import json
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class FunctionTimedOut(Exception):
    """Raised by a test's handler to stand for Lambda ending the function at its timeout: Lambda answers the
    invocation with FunctionError "Unhandled" and errorType "Sandbox.Timedout", which Step Functions reports as
    the task's error (Lambda's "Invoke" API reference and the Step Functions error-handling guide)."""


@dataclass
class FakeContext:
    function_name: str
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 256

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


@dataclass
class InProcessLambda:
    # Function ARN -> handler string ("jobs.handler.prepare").
    handlers: dict[str, str]
    calls: list[tuple[str, dict]] = field(default_factory=list)  # (handler, event)

    # The test's hook, run before each handler with (handler, event): it may start, run or stop other executions
    # while this one is held inside the function (a forced interleaving).
    before: Callable[[str, dict], None] | None = None

    def handler_for(self, function_arn: str):
        return self.handler_for_name(self.handlers[function_arn])

    @staticmethod
    def handler_for_name(handler: str):
        module_name, _, attr = handler.rpartition(".")
        return getattr(importlib.import_module(module_name), attr)

    def invoke(self, parameters: dict, region: str, state_credentials: Any) -> dict:
        arn = parameters["FunctionName"]
        payload = parameters.get("Payload") or b"{}"
        event = json.loads(payload.decode() if isinstance(payload, bytes) else payload)
        self.calls.append((self.handlers[arn], event))
        context = FakeContext(function_name=arn.rsplit(":", 1)[-1])
        if self.before is not None:
            self.before(self.handlers[arn], event)
        try:
            result = self.handler_for(arn)(event, context)
            # The result travels as JSON; a value that cannot be serialized fails the invocation, as in Lambda.
            body = json.loads(json.dumps(result))
        except Exception as exc:  # noqa: BLE001 - every handler error is reported, as Lambda does
            timed_out = isinstance(exc, FunctionTimedOut)
            body = {
                "errorMessage": f"RequestId: {context.aws_request_id} Error: Task timed out after 60.00 seconds"
                if timed_out else str(exc),
                "errorType": "Sandbox.Timedout" if timed_out else type(exc).__name__,
                "requestId": context.aws_request_id,
                "stackTrace": traceback.format_tb(exc.__traceback__),
            }
            return {
                "StatusCode": 200,
                "FunctionError": "Unhandled",
                "ExecutedVersion": "$LATEST",
                "Payload": body,
            }
        return {"StatusCode": 200, "ExecutedVersion": "$LATEST", "Payload": body}
