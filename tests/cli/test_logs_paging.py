"""GetLogEvents may answer a page with no events and a new nextForwardToken; the lines after it must still be
printed, and the stream ends where the token comes back unchanged. moto never answers such a page, so
botocore's own Stubber plays CloudWatch Logs here: the real client and its parameter validation, canned pages."""

from __future__ import annotations

import pytest
from botocore.stub import Stubber

from cli.aws import Aws
from cli.commands.logs import follow_job_logs, print_job_logs
from contract.container import LOG_GROUP

JOB = "mltrain-run-a1"
STREAM = f"{JOB}/algo-1-1700000000"


def _event(n: int, message: str) -> dict:
    return {"timestamp": 1_700_000_000_000 + n, "message": message, "ingestionTime": 1_700_000_000_000 + n}


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    aws = Aws(region="us-east-1")
    with Stubber(aws.client("logs")) as stubber:
        stubber.add_response("describe_log_streams", {"logStreams": [{"logStreamName": STREAM}]},
                             {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{JOB}/"})
        wanted = {"logGroupName": LOG_GROUP, "logStreamName": STREAM, "startFromHead": True}
        stubber.add_response("get_log_events", {"events": [_event(1, "before the gap")], "nextForwardToken": "f/1"},
                             wanted)
        stubber.add_response("get_log_events", {"events": [], "nextForwardToken": "f/2"}, wanted | {"nextToken": "f/1"})
        stubber.add_response("get_log_events", {"events": [], "nextForwardToken": "f/3"}, wanted | {"nextToken": "f/2"})
        stubber.add_response("get_log_events", {"events": [_event(2, "after the gap"), _event(3, "the end")],
                                                "nextForwardToken": "f/4"}, wanted | {"nextToken": "f/3"})
        stubber.add_response("get_log_events", {"events": [], "nextForwardToken": "f/4"}, wanted | {"nextToken": "f/4"})
        yield aws, stubber


def test_lines_after_an_empty_page_are_printed(stubbed):
    aws, stubber = stubbed
    lines: list[str] = []
    assert print_job_logs(aws, JOB, lines.append) == 3
    assert [line.split(" ", 2)[2] for line in lines] == ["before the gap", "after the gap", "the end"]
    stubber.assert_no_pending_responses()  # every page was asked for


def test_follow_mode_pages_past_an_empty_page_too(stubbed):
    aws, stubber = stubbed
    lines: list[str] = []
    assert follow_job_logs(aws, JOB, lines.append, is_running=lambda: False, interval=0) == 3
    assert lines[-1].endswith("algo-1-1700000000 the end")
    stubber.assert_no_pending_responses()
