"""The launcher's paths through its states, as the tests expect them (platform_constructs.launcher_definition)."""

# A run's first execution, or a resumed one (one that takes a run over goes on from its predecessor's decision instead).
START = ["Prepare", "TakenOver", "Launch"]
SUCCESS_TAIL = ["Summarize", "Notify", "Outcome", "Summary", "Succeeded"]
FAILURE_TAIL = ["Summarize", "Notify", "Outcome", "Failed"]
# A job that ended Failed or Stopped: the Catch's Cause is its description, which is left out before Decide (it
# is as large as the request). An API error's Cause is a message, and a 5xx's too: it goes on to Decide.
ENDED_JOB = ["FailureCause", "DescribedFailure", "DropDescription"]
API_ERROR = ["FailureCause", "DescribedFailure"]
RETRY = [*ENDED_JOB, "Decide", "RetryOrFail", "Backoff", "NextAttempt", "Launching", "Launch"]
RETRY_API = [*API_ERROR, "Decide", "RetryOrFail", "Backoff", "NextAttempt", "Launching", "Launch"]
GIVE_UP = [*ENDED_JOB, "Decide", "RetryOrFail"]
# The attempt's job still runs (or cannot be looked up): wait and look again.
WATCH = ["Decide", "RetryOrFail", "WaitForJob"]
