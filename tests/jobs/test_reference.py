"""README's request reference is the one the schema generates, so the two never drift."""

from __future__ import annotations

from contract.schema import reference_rows
from jobs.reference import markdown
from jobs.request.parse import JobRequest
from tests.conftest import ROOT

START = "<!-- JOB-REFERENCE:START"
END = "<!-- JOB-REFERENCE:END -->"


def test_readme_carries_the_current_reference():
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index(START):readme.index(END)]
    block = block[block.index("\n") + 1:]
    assert block.strip() == markdown().strip(), "README is stale: paste `python -m jobs.reference` between the markers"


def test_every_request_field_is_in_the_reference():
    paths = [row[0] for row in reference_rows(JobRequest)]
    text = markdown()
    assert {"name", "dataset", "instance.type", "spot", "retry.max_attempts", "training_plan"} <= set(paths)
    assert all(f"| `{p}` |" in text for p in paths)


def test_the_strategy_field_says_when_to_use_every_strategy_a_request_accepts():
    from contract.hyperparameters import REQUEST_STRATEGIES
    from jobs.request.schema import STRATEGY_USES

    assert tuple(STRATEGY_USES) == REQUEST_STRATEGIES  # each accepted strategy has its line, in the same order
    [doc] = [doc for path, _, _, doc in reference_rows(JobRequest) if path == "strategy"]
    for name, use in STRATEGY_USES.items():
        assert f"{name}: {use}" in doc and use.strip()
    assert f"| `strategy` | string | `\"ddp\"` | {doc} |" in markdown()
