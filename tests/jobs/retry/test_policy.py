"""The retry policy over sequences of failures: fallbacks, on-demand switch, bounded waits, exhaustion."""

from __future__ import annotations

import pytest

from jobs.render.training_job import render_create_training_job
from jobs.request.parse import parse_request
from jobs.retry import run_state as runs
from jobs.retry.classify import Category, Failure
from jobs.retry.policy import backoff, decide_next

T0 = 1_800_000_000.0


def make(platform, **overrides):
    doc = {"name": "gpt", "dataset": "s3://b-1/x/", "instance": {"type": "ml.p4d.24xlarge",
                                                               "fallbacks": ["ml.p4de.24xlarge", "ml.p5.48xlarge"]}}
    doc.update(overrides)
    req = parse_request(doc)
    run = runs.new_run(req, run_id="gpt-1234abcd", execution={"name": "e"}, now=T0)
    runs.start_attempt(run, render_create_training_job(req, platform, run_id="gpt-1234abcd", attempt=1),
                       attempt=1, now=T0)
    return req, run


def step(req, run, platform, category, now=T0, job_started=True):
    """Record a failure of the current attempt, decide, and start the next attempt as the handler does."""
    failure = Failure(category, f"{category} happened", job_started)
    runs.finish_attempt(run, now=now, job=None, failure=failure)
    d = decide_next(req, run, failure, now)
    run.waited_seconds += d.wait_seconds  # as the handler counts the waits it decides
    if d.action == "retry":
        create = render_create_training_job(req, platform, run_id=run.run_id, attempt=run.attempt + 1,
                                            instance_type=d.instance_type, spot=d.spot)
        runs.start_attempt(run, create, attempt=run.attempt + 1, now=now + d.wait_seconds)
    return d


def test_backoff_doubles_and_caps():
    assert [backoff(60, 900, n) for n in range(1, 7)] == [60, 120, 240, 480, 900, 900]


def test_capacity_walks_the_fallbacks_with_backoff(platform):
    req, run = make(platform, retry={"capacity_wait_seconds": 10, "capacity_wait_max_seconds": 30})
    decisions = [step(req, run, platform, Category.CAPACITY) for _ in range(4)]
    assert [d.action for d in decisions] == ["retry"] * 4
    assert [d.wait_seconds for d in decisions] == [10, 20, 30, 30]
    assert [d.instance_type for d in decisions] == ["ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p4d.24xlarge",
                                                    "ml.p4de.24xlarge"]
    assert [a.instance_type for a in run.attempts] == [
        "ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.p4de.24xlarge"]
    assert "then ml.p4de.24xlarge" in decisions[0].reason


def test_capacity_without_fallbacks_retries_the_same_type(platform):
    req, run = make(platform, instance={"type": "ml.p5.48xlarge"})
    d = step(req, run, platform, Category.CAPACITY)
    assert (d.action, d.instance_type, d.wait_seconds) == ("retry", "ml.p5.48xlarge", 300)


def test_interruptions_then_on_demand(platform):
    req, run = make(platform, spot=True, retry={"interruptions_before_on_demand": 2, "interruption_wait_seconds": 0})
    d1, d2, d3 = (step(req, run, platform, Category.SPOT_INTERRUPTION) for _ in range(3))
    assert (d1.spot, d2.spot, d3.spot) == (True, False, False)
    assert [a.spot for a in run.attempts] == [True, True, False, False]
    assert d1.instance_type == "ml.p4d.24xlarge", "an interruption keeps the instance type"
    assert "on demand after 2 interruptions" in d2.reason
    never = make(platform, spot=True, retry={"interruptions_before_on_demand": None})
    assert all(step(*never, platform, Category.SPOT_INTERRUPTION).spot for _ in range(5))


def test_quota_and_throttling_are_bounded(platform):
    req, run = make(platform, retry={"api_error_wait_seconds": 1, "api_error_wait_max_seconds": 3,
                                     "api_error_max_retries": 3, "max_attempts": 30})
    ds = [step(req, run, platform, cat, job_started=False) for cat in (Category.QUOTA, Category.THROTTLING, Category.QUOTA, Category.QUOTA)]
    assert [d.action for d in ds] == ["retry", "retry", "retry", "fail"]
    assert [d.wait_seconds for d in ds[:3]] == [1, 2, 3]
    assert "persisted (4 times in a row; retry.api_error_max_retries 3)" in ds[3].reason
    # a job that actually started resets the streak
    req, run = make(platform, retry={"api_error_max_retries": 1, "api_error_wait_seconds": 1})
    assert step(req, run, platform, Category.QUOTA, job_started=False).action == "retry"
    assert step(req, run, platform, Category.INTERNAL).action == "retry"
    assert step(req, run, platform, Category.QUOTA, job_started=False).action == "retry"
    assert run.attempts[0].status == "NotCreated" and run.attempts[0].lost_seconds == 0


# Every retry budget: (the request's retry settings, the failure repeated until it ends, what the end names).
BUDGETS = {
    "internal": ({"internal_error_max_retries": 0, "internal_error_wait_seconds": 5}, Category.INTERNAL,
                 "SageMaker internal errors persisted (once; retry.internal_error_max_retries 0)"),
    "hardware": ({"hardware_max_retries": 1}, Category.HARDWARE,
                 "hardware faults persisted (twice; retry.hardware_max_retries 1)"),
    "throttling": ({"api_error_max_retries": 2, "api_error_wait_seconds": 60}, Category.THROTTLING,
                   "throttling persisted (3 times in a row; retry.api_error_max_retries 2)"),
    "attempts": ({"max_attempts": 2, "capacity_wait_seconds": 0}, Category.CAPACITY, "attempts exhausted (2 of 2)"),
}


@pytest.mark.parametrize("budget", sorted(BUDGETS))
def test_every_retry_budgets_end_names_what_was_tried_and_the_way_back(platform, budget):
    settings, category, what = BUDGETS[budget]
    req, run = make(platform, retry=settings)
    while (d := step(req, run, platform, category, job_started=category is not Category.THROTTLING)).action == "retry":
        pass
    # One wording (jobs.retry.policy.budget_spent): counts in words, the attempts and their types, the waits, the
    # last failure and `trainctl resume RUN`.
    assert d.reason.startswith(f"{what}: {len(run.attempts)} attempt")
    assert "ml.p4d.24xlarge" in d.reason and f"last failure: {category} happened" in d.reason
    assert d.reason.endswith("`trainctl resume gpt-1234abcd` continues the run from its checkpoints with a new "
                             "retry budget")
    assert "(1 times)" not in d.reason and "(0 times)" not in d.reason
    if budget == "throttling":  # 60 s, then 120 s of backoff
        assert "3m waiting between them" in d.reason


def test_counts_read_as_words():
    from jobs.timestamps import times

    assert [times(n) for n in (1, 2, 3, 10)] == ["once", "twice", "3 times", "10 times"]


def test_internal_errors_retry_a_few_times(platform):
    req, run = make(platform, retry={"internal_error_max_retries": 2, "internal_error_wait_seconds": 5})
    ds = [step(req, run, platform, Category.INTERNAL) for _ in range(3)]
    assert [(d.action, d.wait_seconds) for d in ds] == [("retry", 5), ("retry", 5), ("fail", 0)]


@pytest.mark.parametrize("category", [Category.USER_ERROR, Category.MAX_RUNTIME, Category.UNKNOWN])
def test_no_retry_for_the_users_own_failures(platform, category):
    req, run = make(platform)
    d = step(req, run, platform, category)
    assert (d.action, d.category, d.wait_seconds) == ("fail", category, 0)
    assert len(run.attempts) == 1


def test_attempts_exhausted(platform):
    req, run = make(platform, retry={"max_attempts": 3, "capacity_wait_seconds": 0})
    ds = [step(req, run, platform, Category.CAPACITY) for _ in range(3)]
    assert [d.action for d in ds] == ["retry", "retry", "fail"]
    assert ds[-1].reason.startswith("attempts exhausted (3 of 3)")
    assert len(run.attempts) == 3


def test_total_time_exhausted(platform):
    req, run = make(platform, max_runtime_hours=1, retry={"max_total_hours": 2, "capacity_wait_seconds": 600})
    assert step(req, run, platform, Category.CAPACITY, now=T0 + 3600).action == "retry"
    d = step(req, run, platform, Category.CAPACITY, now=T0 + 2 * 3600 - 60)
    assert d.action == "fail" and d.reason.startswith("time budget exhausted")


@pytest.mark.parametrize("spot", [False, True])
def test_an_unreadable_job_is_watched_as_long_as_it_can_run(platform, spot):
    """Throttled look-ups back off (capped so 28 days of looks fit the execution's history) and never end the
    run while the job may still run: its stopping condition (MaxWaitTime on Spot) plus the margin."""
    from jobs.retry.policy import WATCH_MARGIN_SECONDS, WATCH_MAX_SECONDS, watch_again

    req, run = make(platform, spot=spot)
    limit = 12 * 3600 if not spot else 20 * 3600
    throttled = Failure(Category.THROTTLING, "throttled", False)
    waits = []
    for _ in range(40):
        runs.note_lookup(run, "ThrottlingException: Rate exceeded")
        d = watch_again(req, run, throttled, "ThrottlingException: Rate exceeded", now=T0 + limit + WATCH_MARGIN_SECONDS,
                  job_limit_seconds=limit)
        waits.append(d.wait_seconds)
        assert d.action == "watch", d.reason
    assert waits[:3] == [60, 120, 240] and max(waits) == WATCH_MAX_SECONDS
    d = watch_again(req, run, throttled, "ThrottlingException: Rate exceeded", now=T0 + limit + WATCH_MARGIN_SECONDS + 1,
              job_limit_seconds=limit)
    assert d.action == "fail" and "longer than it can run (40 times in a row" in d.reason
    assert "trainctl resume gpt-1234abcd" in d.reason
