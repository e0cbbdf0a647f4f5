"""How the training package reports a failure it understands, so the launcher reads it right.

On an error it knows, the package writes ONE line to contract.container.FAILURE_FILE and exits non-zero;
SageMaker turns that file into the job's FailureReason (after "AlgorithmError: "). The line is
    [training:<code>] <message naming the field, the value and the fix>
and the launcher's failure rule table (jobs.retry.classify) matches the code (head_pattern: its rules' patterns are
built from the pieces failure_line writes, and parse_failure_line reads a line back).
"""

from __future__ import annotations

import enum
import re


class FailureCode(enum.StrEnum):
    CONFIG_INVALID = "config_invalid"  # a hyperparameter or the environment is wrong: fix the request
    DATA_MISSING = "data_missing"  # a channel the run needs is absent or empty
    OUT_OF_MEMORY = "out_of_memory"  # CUDA out of memory: the message names the micro-batch and what to lower
    NON_FINITE = "non_finite"  # loss or gradient norm NaN/Inf for `nonfinite_patience` steps in a row
    CHECKPOINT_UNREADABLE = "checkpoint_unreadable"  # no complete checkpoint verifies and loads into this run
    CHECKPOINT_UNWRITABLE = "checkpoint_unwritable"  # the folder is read-only, lacks room, or filled up (ENOSPC)
    # No step completed within the watchdog's allowance (training.resilience.watchdog): a rank stopped progressing, most often
    # a GPU, NCCL/EFA or host fault; the launcher retries it with the instance health check, unlike the codes above.
    HANG = "hang"
    # Peers gone without a word (training.resilience.peers): every rank of a host at once, the host lost (retried on a
    # health-checked instance, like a hang); some ranks of a live host, processes killed there (most often the
    # kernel's out-of-memory killer: host memory, the user's to fix).
    HOST_LOST = "host_lost"
    PROCESS_LOST = "process_lost"
    # A newer attempt of the run claimed the checkpoint folder (training.checkpoint.fencing): this one stopped before writing.
    # Not retried: the newer attempt carries the run on.
    SUPERSEDED = "superseded"


# What to lower when a rank ran out of GPU memory, in the request's words: the package's out_of_memory line ends
# with it, and the launcher adds it to a line that lacks it (a peer's report), never twice.
OUT_OF_MEMORY_ADVICE = ("lower hyperparameters.micro_batch_size (keep global_batch_size: grad_accum grows), turn on "
                        "hyperparameters.activation_checkpointing, or shard with strategy fsdp / more GPUs")

# A line's head, `[training:<code>]`: failure_line writes it, head_pattern (the launcher's rules) and LINE read it.
_HEAD_OPEN, _HEAD_CLOSE = "[training:", "]"
CODE_CHARACTERS = "[a-z_]+"


def head_pattern(code: FailureCode | None = None) -> str:
    """A regex of a failure line's head: `code`'s, or (None) any code's, the code in group `code`."""
    middle = re.escape(code.value) if code is not None else f"(?P<code>{CODE_CHARACTERS})"
    return f"{re.escape(_HEAD_OPEN)}{middle}{re.escape(_HEAD_CLOSE)}"


LINE = re.compile(rf"{head_pattern()} (?P<message>.*)")


def failure_line(code: FailureCode, message: str) -> str:
    """The one line the package writes; newlines in `message` are folded (FailureReason is one line)."""
    return f"{_HEAD_OPEN}{code.value}{_HEAD_CLOSE} {' '.join(message.split())}"


def parse_failure_line(text: str) -> tuple[FailureCode, str] | None:
    """The code and message of a failure line anywhere in `text` (e.g. a FailureReason), or None."""
    match = LINE.search(text)
    if not match or match.group("code") not in {c.value for c in FailureCode}:
        return None
    return FailureCode(match.group("code")), match.group("message")
