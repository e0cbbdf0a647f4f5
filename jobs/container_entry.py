"""How a training container starts, so that SageMaker's stop reaches the training script.

SageMaker sends SIGTERM to the container's PID 1 on StopTrainingJob and on a Spot reclaim, and SIGKILL 120 s
later. In the SageMaker PyTorch training images (aws/deep-learning-containers, docker/pytorch/Dockerfile.cuda
and .cpu) PID 1 is `bash -m start_with_right_hostname.sh` with the argument `train`: a shell that runs the
toolkit as a child without `exec` and sets no trap, so as PID 1 it drops SIGTERM; the toolkit would not
forward it either (aws/sagemaker-training-toolkit issues 125 and 173). Left alone, a stop always ends in
SIGKILL and loses everything since the last cadence checkpoint.

The renderer therefore sets AlgorithmSpecification.ContainerEntrypoint for those images to a short shell
that does what the image's entry does (the same script, the same argument) in the background, and on
SIGTERM creates contract.container.STOP_FILE, which every rank polls once per step. It then keeps waiting
for the image's entry and exits with its status: the ranks save, exit 0, torchrun and the toolkit follow.

Edge: this is the images' documented entry as their Dockerfiles declare it, run here by tests with a
stand-in for the image's script; a SageMaker run has not executed it. Images the platform did not resolve
(a request's `image`, the SMP image whose Dockerfile is not public) keep their own entry, and a stop there
reaches the script only if that image delivers SIGTERM to it.
"""

from __future__ import annotations

from contract.container import STOP_FILE

# What the PyTorch training images run: their ENTRYPOINT's script with the argument SageMaker passes.
IMAGE_START = "bash start_with_right_hostname.sh train"


def entry_script(start: str = IMAGE_START, stop_file: str = STOP_FILE) -> str:
    """The shell PID 1 runs. `wait` returns early when the trap runs, so it waits again until the child is
    gone (`kill -0` fails once it has been reaped), then exits with the child's status."""
    note = "[container] SIGTERM: ranks save at their next step"
    return (f"f={stop_file}; trap '[ -e $f ] || {{ : > $f; echo \"{note}\"; }}' TERM; {start} & p=$!; "
            "wait $p; s=$?; while kill -0 $p 2>/dev/null; do wait $p; s=$?; done; exit $s")


def container_entrypoint(start: str = IMAGE_START) -> list[str]:
    """AlgorithmSpecification.ContainerEntrypoint for a SageMaker PyTorch training image (each item at most
    256 characters: the API's limit, checked by the request tests against botocore's model)."""
    return ["bash", "-c", entry_script(start)]
