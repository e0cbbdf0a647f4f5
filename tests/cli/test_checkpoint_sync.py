"""The emulated checkpoint sync (cli.checkpoint_sync) where the training process and the sync race."""

from __future__ import annotations

from pathlib import Path

from cli import checkpoint_sync
from cli.checkpoint_sync import CheckpointSync


def test_a_step_pruned_between_the_look_and_the_copy_leaves_no_folder_in_the_prefix(tmp_path, monkeypatch):
    # The interleaving forced: the sync looks (the step's file is there and steady), then the training process prunes
    # the step, then the sync copies. The copy finds no source; the folder it had made for the step in the prefix
    # stayed behind, an empty step-18 beside the kept steps (seen once in tests/cli/test_local_hosts.py).
    local, prefix = tmp_path / "algo-2" / "checkpoints", tmp_path / "s3" / "checkpoints"
    (local / "step-18").mkdir(parents=True)
    (local / "step-18" / "__1_0.distcp").write_bytes(b"shard")
    (prefix / "step-40").mkdir(parents=True)
    sync = CheckpointSync(local, prefix, "algo-2")
    look = checkpoint_sync._files

    def look_then_prune(root: Path):
        seen = look(root)
        if root == local:
            (local / "step-18" / "__1_0.distcp").unlink()  # the prune lands after the look
        return seen

    monkeypatch.setattr(checkpoint_sync, "_files", look_then_prune)
    assert sync.sync_once(settled=True) == 0
    assert sorted(p.name for p in prefix.iterdir()) == ["step-40"]
