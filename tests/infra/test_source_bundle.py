"""The training package ships as a deterministic sourcedir.tar.gz asset that the execution role can read and the
launcher's settings point at."""

from __future__ import annotations

import json
import tarfile

import pytest


def source_asset(cdk_out):
    manifest = json.loads((cdk_out / "mltrain-platform.assets.json").read_text())
    [(asset_hash, entry)] = [(h, f) for h, f in manifest["files"].items()
                             if f["source"]["path"].endswith(".tar.gz")]
    return asset_hash, entry, cdk_out / entry["source"]["path"]


def test_asset_holds_the_entry_script_and_the_package(cdk_out):
    _, entry, path = source_asset(cdk_out)
    assert entry["source"].get("packaging", "file") == "file"  # shipped as is, not zipped again
    with tarfile.open(path) as archive:
        names = archive.getnames()
    assert "train.py" in names
    assert "training/loop.py" in names and "training/strategies/fsdp.py" in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_settings_point_at_the_asset_and_the_role_can_read_it(cdk_out, templates):
    asset_hash, entry, _ = source_asset(cdk_out)
    [destination] = entry["destinations"].values()
    platform = templates["mltrain-platform"]
    uri = json.dumps(platform["Outputs"]["TrainingSourceUri"]["Value"])
    assert destination["objectKey"] in uri
    settings = json.dumps(platform["Outputs"]["PlatformSettings"]["Value"])
    assert destination["objectKey"] in settings
    [role_policy] = [r for k, r in platform["Resources"].items()
                     if r["Type"] == "AWS::IAM::Policy" and k.startswith("ExecutionRole")]
    reads_assets = [s for s in role_policy["Properties"]["PolicyDocument"]["Statement"]
                    if "cdk-hnb659fds-assets" in json.dumps(s["Resource"])]
    # The bundle's object only (GetObject), and a listing of its key alone; no other asset of the account.
    [read] = [s for s in reads_assets if s["Action"] == "s3:GetObject"]
    assert json.dumps(read["Resource"]).endswith(f'/{destination["objectKey"]}"]]}}')
    [listing] = [s for s in reads_assets if s["Action"] == "s3:ListBucket"]
    assert listing["Condition"] == {"StringEquals": {"s3:prefix": destination["objectKey"]}}
    assert len(reads_assets) == 2


def test_same_sources_same_asset(cdk_out, tmp_path):
    """A second synth of unchanged code gives the same asset hash: nothing to redeploy.

    The sources are packed again around the second synth: an edit to training/ or contract/ made while the
    tests run (another change in the same working tree) legitimately changes the hash, and is reported as
    such instead of as nondeterminism.
    """
    from bundles.sourcedir import build_archive_bytes
    from tests.conftest import cdk_synth

    first, _, first_path = source_asset(cdk_out)
    before = build_archive_bytes()
    result = cdk_synth(tmp_path)
    assert result.returncode == 0, result.stderr
    second, _, second_path = source_asset(tmp_path)
    if build_archive_bytes() != before:
        pytest.skip("training/ or contract/ changed during the synth; rerun with an unchanged tree")
    assert second_path.read_bytes() == before  # the CLI's synth ships exactly the packer's bytes
    if first_path.read_bytes() != before:
        pytest.skip("training/ or contract/ changed since the session's synth; rerun with an unchanged tree")
    assert first == second
