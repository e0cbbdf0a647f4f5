"""Every way an execution of the synthesized state machine can end has a row in jobs.outcome.ends: what the operator
gets (status, error, cause in words, the next step, the notification), and the tests that reach it in moto."""

from __future__ import annotations

import ast

import pytest

from jobs.outcome.ends import ABORTED, ENDS
from tests.conftest import ROOT
from tests.launcher.definition import launcher_definition


@pytest.fixture(scope="module")
def resolved(launcher_template):
    return launcher_definition(launcher_template)


def terminal_states(definition: dict) -> set[str]:
    return {name for name, state in definition["States"].items() if state["Type"] in ("Fail", "Succeed")}


def test_every_end_of_the_definition_has_a_row(resolved):
    # A new Fail or Succeed state without a row fails here: say what its operator gets before it ships.
    assert terminal_states(resolved.definition) | {ABORTED} == set(ENDS)


def test_every_state_reaches_an_end(resolved):
    # Each Catch and Choice leads on to a terminal state: no path leaves an execution without one of the rows.
    states = resolved.definition["States"]
    ends = terminal_states(resolved.definition)

    def nexts(state: dict) -> list[str]:
        return [n for n in (state.get("Next"), state.get("Default"), *(c["Next"] for c in state.get("Choices", [])),
                            *(c["Next"] for c in state.get("Catch", []))) if n]

    for name in states:
        seen, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            todo += nexts(states[current])
        assert seen & ends, f"{name} reaches no end"


def test_each_rows_tests_exist_and_every_row_says_the_next_step():
    for end, row in ENDS.items():
        assert row.next_step and row.notified and row.cause, end
        assert row.reached_by, f"{end}: name the test that reaches it"
        for ref in row.reached_by:
            path, _, name = ref.partition("::")
            tree = ast.parse((ROOT / path).read_text())
            assert any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body), ref
    # Every end but a stop someone chose and a hand-over tells the team's topic, or the one who started it.
    told = {end for end, row in ENDS.items() if "topic" in row.notified or "whoever started it" in row.notified}
    assert set(ENDS) - told == {ABORTED, "Continued"}


def test_the_states_before_the_run_is_taken_are_the_definitions(resolved):
    # trainctl submit says "started" once a state after Prepare's success is entered (jobs.outcome.ends.taken_by):
    # the refusal and fault paths' states are the definition's, and Prepare's success leads to one that is not.
    from jobs.outcome.ends import BEFORE_THE_RUN, BEFORE_THE_RUN_PREFIX, taken_by

    states = resolved.definition["States"]
    # NotifyRefusal exists with notify_refusals only (tests/launcher/test_construct_props.py synthesizes it).
    assert set(BEFORE_THE_RUN) - {"NotifyRefusal"} <= set(states)
    prepare_paths = {n for n in states if n.startswith(BEFORE_THE_RUN_PREFIX)}
    assert {"Prepare", "PrepareFault", "PrepareFailed"} <= prepare_paths
    assert taken_by(states["Prepare"]["Next"]) and not taken_by("Prepare") and not taken_by("RequestInvalid")
