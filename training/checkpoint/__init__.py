"""Checkpoints: when a run saves (`cadence.py`), how a `step-N` folder is written and marked complete
(`storage.py`, `markers.py`: sizes and CRC-32 checksums), how a run resumes the newest complete step that is its
own (`restore.py`, `ownership.py`) or starts from other weights (`init_from.py`), whether the folder can take the
next save (`disk.py`), which attempt may write it (`fencing.py`), async saves' pinned staging (`staging.py`), and
what a checkpoint holds (`state.py`: the loop's parts as `Stateful`s); `manager.py`'s `CheckpointManager` puts
them together for the loop.
"""
