"""Every torch version the platform offers is one CI tests the package on, or the config refuses to offer it.

The tested set is platform_config/tested_torch.json: tools/image_torch.py (`make test`) runs the training tests
on each version in it, and the config loader refuses a `pytorch_versions` entry outside it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from platform_config import TESTED_TORCH_VERSIONS, PlatformConfig, load_config, tested_torch
from platform_config import model as config_model
from tests.infra.helpers import cdk_json_context, problems
from tools import image_torch

UNTESTED = "1.13.1"  # a SageMaker PyTorch image version that is not in the tested set


def test_the_default_platform_offers_only_tested_torch():
    config = load_config(cdk_json_context())
    assert config.pytorch_versions[0] == "2.8.0"  # the default image's torch
    assert set(config.pytorch_versions) <= set(TESTED_TORCH_VERSIONS)
    assert set(PlatformConfig().pytorch_versions) <= set(TESTED_TORCH_VERSIONS)
    # Every tested version may be offered, in any order (the first is the default).
    assert load_config({**cdk_json_context(), "pytorch_versions": list(reversed(TESTED_TORCH_VERSIONS))})


def test_an_untested_version_is_refused_naming_the_field_the_value_and_the_fix():
    assert UNTESTED not in TESTED_TORCH_VERSIONS
    (problem,) = problems(pytorch_versions=["2.8.0", UNTESTED])
    assert problem.startswith(f"'pytorch_versions' = ['2.8.0', '{UNTESTED}']: entry '{UNTESTED}': ")
    assert "not a torch version CI tests the training package on" in problem
    assert f"(tested: {', '.join(TESTED_TORCH_VERSIONS)})" in problem
    assert "add it to platform_config/tested_torch.json so that `make test` runs the training tests on it" in problem
    assert problem.endswith("or drop it from pytorch_versions")


def test_several_untested_versions_are_named_together_and_command_line_text_is_checked_too():
    (problem,) = problems(pytorch_versions=f'["{UNTESTED}", "2.0.1"]')  # as `cdk synth -c` delivers it
    assert f"entries '{UNTESTED}', '2.0.1': not a torch version" in problem
    assert "add them to platform_config/tested_torch.json" in problem and "drop them from" in problem


def test_a_malformed_version_keeps_its_own_message():
    (problem,) = problems(pytorch_versions=["latest"])
    assert "must list one or more versions such as" in problem


def test_smp_images_are_the_documented_edge_and_not_checked_against_the_set():
    # The SMP library exists only in its image, so CI cannot run the package on its torch: allowed, documented.
    config = load_config({**cdk_json_context(), "smp_versions": ["2.5.1", "2.8.0"]})
    assert config.smp_versions == ("2.5.1", "2.8.0")
    assert "2.5.1" not in TESTED_TORCH_VERSIONS
    assert "not checked against this set" in tested_torch.__doc__


def test_image_torch_runs_the_very_set_the_loader_checks():
    assert image_torch.TESTED_TORCH_FILE.resolve() == tested_torch.TESTED_TORCH_FILE.resolve()
    assert image_torch.tested_versions() == TESTED_TORCH_VERSIONS
    assert config_model.TESTED_TORCH_VERSIONS is tested_torch.TESTED_TORCH_VERSIONS  # what the check reads
    assert tuple(json.loads(tested_torch.TESTED_TORCH_FILE.read_text())["versions"]) == TESTED_TORCH_VERSIONS


def test_image_torch_runs_the_tests_on_every_version_of_the_set(tmp_path, monkeypatch, capsys):
    listed = tmp_path / "tested_torch.json"
    listed.write_text(json.dumps({"versions": ["2.8.0", "2.7.1"]}))
    monkeypatch.setattr(image_torch, "TESTED_TORCH_FILE", listed)
    assert image_torch.tested_versions() == tested_torch.read_tested_torch(listed) == ("2.8.0", "2.7.1")
    monkeypatch.setattr(image_torch, "image_venv", lambda version: Path("/venvs") / version / "python")
    ran = []

    def run(cmd, **kwargs):
        version = Path(cmd[0]).parent.name
        if cmd[1] == "-c":  # the venv's torch.__version__
            return subprocess.CompletedProcess(cmd, 0, stdout=f"{version}+cu128\n")
        ran.append((version, cmd[2:]))
        return subprocess.CompletedProcess(cmd, 1 if version == "2.8.0" else 0)

    monkeypatch.setattr(image_torch.subprocess, "run", run)
    assert image_torch.main(["--", "-n", "2"]) == 1  # one version failing fails the run...
    assert [v for v, _ in ran] == ["2.8.0", "2.7.1"]  # ...after every version ran
    assert all(cmd == ["pytest", *image_torch.TESTS, *image_torch.SELECTION, "-n", "2"] for _, cmd in ran)
    # Its -m replaces pyproject's (which keeps the soak loops out): it must keep them out too.
    assert image_torch.SELECTION[0] == "-m" and "not soak" in image_torch.SELECTION[1]
    assert "tests failed on torch 2.8.0" in capsys.readouterr().err
    assert image_torch.main(["--list"]) == 0
    assert capsys.readouterr().out.strip() == "2.8.0 2.7.1"
