"""Fixtures for the launcher tests: the synthesized launcher template and a moto world running it."""

from __future__ import annotations

import json

import pytest

from tests.launcher.definition import launcher_definition
from tests.launcher.harness import LauncherHarness
from tests.launcher.inputs import SETTINGS_FILE


def launcher_stack_template(templates: dict[str, dict]) -> dict:
    found = [
        t
        for t in templates.values()
        if any(r["Type"] == "AWS::StepFunctions::StateMachine" for r in t.get("Resources", {}).values())
    ]
    assert len(found) == 1, f"expected one stack with the launcher state machine, found {len(found)}"
    return found[0]


@pytest.fixture(scope="session")
def launcher_template(templates: dict[str, dict]) -> dict:
    """The launcher stack's template from the real app (`npx cdk synth`, cdk-nag on)."""
    return launcher_stack_template(templates)


@pytest.fixture(scope="session")
def platform_settings() -> dict:
    """The platform settings document the Lambda handlers get in PLATFORM_SETTINGS (a deployed stack's shape)."""
    return json.loads(SETTINGS_FILE.read_text())


@pytest.fixture(scope="module")
def harness(launcher_template: dict, platform_settings: dict):
    """Module-scoped: its moto mock and patches must not outlive the scenarios (other rooms share the worker).

    The SDK's retries keep their number (4 tries for Prepare's and a stop's calls, jobs.handler) but not their
    sleeps: standard mode backs off up to 1, 2 and 4 s a throttled call, real seconds no scenario checks (the
    throttled-stop scenario alone slept ~25 s of its 27)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("botocore.retries.standard.ExponentialBackoff.delay_amount", lambda self, context: 0)
        with LauncherHarness(launcher_definition(launcher_template), platform_settings) as world:
            yield world


# Where the simulated clock starts: Wait states move it on by the seconds they ask for.
T0 = 1_800_000_000.0


@pytest.fixture
def simulated_clock(harness, monkeypatch):
    """A clock that only the Wait states move (harness.waited): the launcher's functions (jobs.handler.clock) read it,
    and so do the emulated jobs a test hands it to (ScriptedSageMaker.clock). Nothing sleeps."""
    harness.waited = 0.0
    monkeypatch.setattr("jobs.handler.clock", lambda: T0 + harness.waited)
    return lambda: T0 + harness.waited


@pytest.fixture
def no_hooks(harness):
    """Clears the hooks a test sets on the module's harness, which would otherwise hold later tests' executions."""
    yield
    harness.on_wait = None
    harness.lambdas.before = None
    if harness.world is not None:
        harness.world.on_look = None
