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
    assert "training/loop.py" in names and "training/parallel/strategies/fsdp.py" in names
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


def test_same_sources_same_asset(cdk_out):
    """Unchanged code gives the same asset hash, whichever process packs it and wherever the packed file lands:
    nothing to redeploy. (What a second CLI synth showed in 20 s: another process packs the same bytes, the CDK
    hashes two bundles in two temporary folders alike, and the session's CLI synth gave that hash.)

    An edit to training/ or contract/ made while the tests run (another change in the same working tree)
    legitimately changes the bytes, and is reported as such instead of as nondeterminism.
    """
    import subprocess
    import sys

    import aws_cdk as cdk

    from bundles.sourcedir import build_archive_bytes
    from platform_constructs.source_bundle import TrainingSourceBundle
    from tests.conftest import ROOT

    first, _, first_path = source_asset(cdk_out)
    before = build_archive_bytes()
    # Another interpreter (another hash seed, set and dict orders) packs the same bytes.
    fresh = subprocess.run([sys.executable, "-c", "import sys; from bundles.sourcedir import build_archive_bytes; "
                            "sys.stdout.buffer.write(build_archive_bytes())"], cwd=ROOT, capture_output=True,
                           check=True, timeout=120).stdout
    stack = cdk.Stack(cdk.App(), "bundles")
    one, two = (TrainingSourceBundle(stack, name).asset for name in ("One", "Two"))
    if build_archive_bytes() != before:
        pytest.skip("training/ or contract/ changed during the test; rerun with an unchanged tree")
    assert fresh == before
    assert one.asset_hash == two.asset_hash  # the temporary folder is not in the hash
    if first_path.read_bytes() != before:
        pytest.skip("training/ or contract/ changed since the session's synth; rerun with an unchanged tree")
    assert first == one.asset_hash  # the CLI's synth shipped these bytes under this hash
