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

Secrets: a request's `secrets` ({"NAME": "<Secrets Manager ARN>"}) reach the job as one variable holding only
the ARNs (contract.container.ENV_SECRET_ARNS). Before the image's entry starts, the entry reads each secret with
the execution role (boto3, which the images carry) and exports it as NAME, so the toolkit, torchrun and every
rank inherit it; the values never pass through the execution's input, its history, the job's description or a
log (they travel from Secrets Manager to a pipe that the shell evaluates, each value quoted by shlex). A secret
that cannot be read fails the job before training starts, naming no value. The entry is three short items
(ContainerEntrypoint items are at most 256 characters): an outer shell that resolves the secrets and then
`exec`s the stop-relay shell, so that the relay stays PID 1.

Edge: this is the images' documented entry as their Dockerfiles declare it, run here by tests with a
stand-in for the image's script; a SageMaker run has not executed it. Images the platform did not resolve
(a request's `image`, the SMP image whose Dockerfile is not public) keep their own entry, and a stop there
reaches the script only if that image delivers SIGTERM to it.
"""

from __future__ import annotations

from contract.container import ENV_SECRET_ARNS, STOP_FILE

# What the PyTorch training images run: their ENTRYPOINT's script with the argument SageMaker passes.
IMAGE_START = "bash start_with_right_hostname.sh train"


def entry_script(start: str = IMAGE_START, stop_file: str = STOP_FILE) -> str:
    """The shell PID 1 runs. `wait` returns early when the trap runs, so it waits again until the child is
    gone (`kill -0` fails once it has been reaped), then exits with the child's status."""
    note = "[container] SIGTERM: ranks save at their next step"
    return (f"f={stop_file}; trap '[ -e $f ] || {{ : > $f; echo \"{note}\"; }}' TERM; {start} & p=$!; "
            "wait $p; s=$?; while kill -0 $p 2>/dev/null; do wait $p; s=$?; done; exit $s")


# Prints `export NAME=<value, shell-quoted>` for each secret named in its argument (ENV_SECRET_ARNS's JSON). A name
# is checked again here: it is evaluated by the shell, and this code cannot see what Prepare checked.
RESOLVE_SECRETS = (  # one line: the API's pattern for an entry item is `.*`
    "import json,sys,shlex,boto3;[print('export %s=%s'%(k,shlex.quote(boto3.client('secretsmanager',region_name="
    "a.split(':')[3]).get_secret_value(SecretId=a)['SecretString'])))for k,a in json.loads(sys.argv[1]).items()"
    "if k.isidentifier()or sys.exit(k)]")
# Run by the outer shell, where $3 is RESOLVE_SECRETS: nothing to do without secrets; a failure ends the job.
SECRETS_STEP = (f'[ -z "${ENV_SECRET_ARNS}" ] || {{ s=$(python -c "$3" "${ENV_SECRET_ARNS}") && eval "$s"; }} || '
                '{ echo "[container] could not read the request\'s secrets" >&2; exit 1; }')


def container_entrypoint(start: str = IMAGE_START) -> list[str]:
    """AlgorithmSpecification.ContainerEntrypoint for a SageMaker PyTorch training image (each item at most
    256 characters: the API's limit, checked by the request tests against botocore's model). The outer shell
    runs SECRETS_STEP ($1), then becomes the stop-relay shell ($2) by `exec`, keeping PID 1."""
    return ["bash", "-c", 'eval "$1" && exec bash -c "$2"', "entry", SECRETS_STEP, entry_script(start),
            RESOLVE_SECRETS]
