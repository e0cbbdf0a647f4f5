"""How the launcher names a run and its jobs: run ids, attempts' job names, the tags on every job.

One home for each of these facts (docs/ARCHITECTURE.md, "Where each shared fact lives"): the renderer mints the
run id and builds each attempt's name and tags (jobs.render.training_job), the request rules check a run id a
request names (jobs.request.field_rules), Prepare finds a run's jobs by its token and numbers them by attempt
(jobs.retry.resume), the constructs' IAM conditions test the run-id tag key (platform_constructs.launcher,
launch_task, engineer_access), the platform config checks name prefixes, and trainctl renders with a stand-in id
(cli.views.plan). The training package reads the run id as an opaque string (contract.container.ENV_RUN_ID), so
the format lives here, on the jobs side.

    run id     `<request name, slugged>-<16 characters of lowercase base32>`         new_run_id, RUN_ID
    job name   `<name_prefix>-<slug>-<run token>-<8 characters>-a<attempt>`, <= 63     job_name, JOB_NAME
    tags       `<name_prefix>:run-id`, `:attempt`, `:request`, `:strategy` (+ a team's `<platform prefix>:team`)
    execution  1-80 of [A-Za-z0-9_-]                                                   EXECUTION_NAME

Neither the run id nor an attempt's name can be guessed ahead (both carry random characters): an id derived from
the execution name could be taken (the name is the caller's to choose, and 32 bits of a hash of it collided in
under a second), and each attempt's name adds random characters of its own so that nobody can create a job under
the name of an attempt still to come and make it fail.
"""

from __future__ import annotations

import base64
import re
import secrets

# SageMaker's name characters (a training job's, a training plan's): letters and digits, with inner hyphens.
_LETTER_OR_DIGIT = "[a-zA-Z0-9]"
NAME_CHARACTERS = rf"{_LETTER_OR_DIGIT}(-*{_LETTER_OR_DIGIT})*"
# A training job's name (and a training plan's, platform_config): SageMaker's pattern and length.
JOB_NAME_MAX = 63
SAGEMAKER_NAME = rf"{_LETTER_OR_DIGIT}(-*{_LETTER_OR_DIGIT}){{0,{JOB_NAME_MAX - 1}}}"
JOB_NAME = re.compile(SAGEMAKER_NAME)

# A team's prefix is `<platform prefix>--<team>` (team_prefix): a platform's own prefix may not contain the
# separator, so no team's names start with another's (platform_config).
TEAM_SEPARATOR = "--"
# The longest name prefix a launcher takes (platform_constructs.launcher), a team's included (`<platform>--<team>`,
# team_prefix): job names keep the run id's random characters and the attempt's nonce whole.
MAX_NAME_PREFIX = 20
# What may start a launcher's job names (a platform's name_prefix, or a team prefix), fullmatch. A platform's own
# name_prefix is narrower still (platform_config: lowercase, a letter first, no team separator).
NAME_PREFIX = re.compile(rf"(?=.{{1,{MAX_NAME_PREFIX}}}\Z){NAME_CHARACTERS}")

# A request's name (jobs.request.field_rules.check_name), which starts its run id: room is left for
# "<prefix>-" and "-<token>-<nonce>-a<N>" inside SageMaker's 63 characters (job_name shortens it if need be).
RUN_NAME_MAX = 40
RUN_NAME = re.compile(NAME_CHARACTERS)

# The run id's random part: 80 bits, 16 characters of lowercase base32 (a-z, 2-7: valid in job names, S3 keys
# and tags). Random bits leave nothing to choose or to find.
TOKEN_CHARACTERS = "[a-z2-7]"
RUN_TOKEN_BYTES = 10
RUN_TOKEN_CHARS = 16
RUN_ID = re.compile(rf"{NAME_CHARACTERS}-{TOKEN_CHARACTERS}{{{RUN_TOKEN_CHARS}}}")
RUN_ID_MAX = RUN_NAME_MAX + 1 + RUN_TOKEN_CHARS
# `<slug>-<8 hex digits of the execution name>`, the run ids minted before the random ones (jobs.retry.run_state.is_ours
# still knows their jobs). Remove once no execution started before then can still run (a job's 28 days plus the
# run's waits).
LEGACY_RUN_ID = re.compile(r".*-[0-9a-f]{8}")

# Each attempt's name adds 40 random bits of its own (8 characters): the name is not derivable from the run id.
NAME_NONCE_BYTES = 5
NAME_NONCE_CHARS = 8
# Every attempt's job name ends in `-a<N>`.
ATTEMPT_SUFFIX = "-a"
ATTEMPT = re.compile(rf"{ATTEMPT_SUFFIX}(\d+)$")

# A Step Functions execution's name: 1-80 characters. Step Functions allows more characters (no whitespace or
# URL-reserved ones); this subset is safe in URLs, CloudWatch and shells, and run ids are built from it. trainctl
# submit names an execution `<request name>-<UTC time>`; Decide names a run's successor `<run id>-c<random>`.
EXECUTION_NAME_MAX = 80
EXECUTION_CHARACTERS = "A-Za-z0-9_-"
EXECUTION_NAME = re.compile(rf"[{EXECUTION_CHARACTERS}]{{1,{EXECUTION_NAME_MAX}}}")

# The tags the renderer writes on every job, as `<name_prefix>:<tag>`. The run-id tag is an IAM boundary: the
# launcher's and the engineers' policies act only on jobs that carry `<name_prefix>:run-id`, which only the
# platform's launcher writes (platform_constructs.launch_task, engineer_access).
RUN_ID_TAG = "run-id"
ATTEMPT_TAG = "attempt"
REQUEST_TAG = "request"
STRATEGY_TAG = "strategy"
PLATFORM_TAGS = (RUN_ID_TAG, ATTEMPT_TAG, REQUEST_TAG, STRATEGY_TAG)
# A team's cost allocation tag, `<platform prefix>:team` (platform_constructs.teams.team_tags): one key for the
# whole platform. The platform settings may add this many tags to every job of a launcher (`job_tags`).
TEAM_TAG = "team"
MAX_JOB_TAGS = 1


def team_prefix(platform_prefix: str, team: str | None) -> str:
    """The prefix of every name of `team`; the platform's own prefix for the default team (None)."""
    return platform_prefix if team is None else f"{platform_prefix}{TEAM_SEPARATOR}{team}"


def platform_prefix(name_prefix: str) -> str:
    """The platform's own prefix of a launcher's `name_prefix` (a team's `<platform>--<team>`, or the platform's)."""
    return name_prefix.split(TEAM_SEPARATOR, 1)[0]


def random_token(nbytes: int) -> str:
    """`nbytes` random bytes as lowercase base32 without padding (8 characters per 5 bytes)."""
    return base64.b32encode(secrets.token_bytes(nbytes)).decode().rstrip("=").lower()


def run_slug(request_name: str) -> str:
    """The readable part of a run id: the request name in job-name characters, at most RUN_NAME_MAX of them."""
    return re.sub(r"[^a-zA-Z0-9-]+", "-", request_name).strip("-")[:RUN_NAME_MAX].strip("-") or "run"


def new_run_id(request_name: str) -> str:
    """`<request name, slugged>-<16 random characters>`: readable, and unique by 80 random bits.

    Minted once per execution, by Prepare, and carried in the run state from then on (jobs.retry.run_state.RunState).
    """
    return f"{run_slug(request_name)}-{random_token(RUN_TOKEN_BYTES)}"


def new_name_nonce() -> str:
    """Fresh random characters for one attempt's job name."""
    return random_token(NAME_NONCE_BYTES)


def run_token(run_id: str) -> str:
    """The run id's random part: every job name of the run carries it whole (job_name)."""
    return run_id.rpartition("-")[2]


def job_name_head(name_prefix: str) -> str:
    """How every job name of a platform (or team) begins: the launcher may create, and a job role's logs and
    trust are scoped to, names that begin so (`jobs_named`)."""
    return f"{name_prefix}-"


def jobs_named(name_prefix: str) -> str:
    """The wildcard of every job name (and log stream, `<job name>/algo-N-...`) of `name_prefix`: an IAM
    resource's last part."""
    return f"{job_name_head(name_prefix)}*"


def metrics_namespace(name_prefix: str) -> str:
    """The CloudWatch namespace a platform's (a team's) jobs send their metrics to and its alarms and dashboard
    read: its job role may write no other but SageMaker's (platform_constructs.roles), so no other team's job
    can move them. Never `AWS/...` (reserved), whatever the prefix."""
    return f"TrainingPlatform/{name_prefix}"


def job_name(name_prefix: str, run_id: str, attempt: int, nonce: str) -> str:
    """`<name_prefix>-<run_id>-<nonce>-a<N>`, shortened in the middle of the run name to fit 63 characters.

    It starts with the name prefix because the launcher role may only create jobs named `<prefix>-*`; the run
    id's random part and the nonce are kept whole, only the request name's slug gives way.
    """
    head, tail = job_name_head(name_prefix), f"-{nonce}{ATTEMPT_SUFFIX}{attempt}"
    slug, _, token = run_id.rpartition("-")
    room = JOB_NAME_MAX - len(head) - len(tail) - len(token) - 1
    slug = slug[:max(room, 0)].rstrip("-")
    name = f"{head}{slug}-{token}{tail}" if slug else f"{head}{token}{tail}"
    if not JOB_NAME.fullmatch(name) or len(name) > JOB_NAME_MAX:
        raise ValueError(f"cannot build a valid job name from prefix {name_prefix!r} and run {run_id!r}")
    return name


def attempt_of(name: str) -> int:
    """The attempt number a job name ends with (`-a<N>`); 0 for a name that does not."""
    found = ATTEMPT.search(name)
    return int(found.group(1)) if found else 0


def tag_key(name_prefix: str, tag: str) -> str:
    """`<name_prefix>:<tag>`: how the platform spells each of its tag keys."""
    return f"{name_prefix}:{tag}"


def run_id_tag_key(name_prefix: str) -> str:
    """The tag key the launcher of `name_prefix` writes on each of its jobs: IAM conditions test for it."""
    return tag_key(name_prefix, RUN_ID_TAG)


def platform_tags(name_prefix: str, *, run_id: str, attempt: int, request: str, strategy: str) -> dict[str, str]:
    """The tags the renderer writes on every job of the launcher of `name_prefix` (PLATFORM_TAGS, in that order)."""
    values = {RUN_ID_TAG: run_id, ATTEMPT_TAG: str(attempt), REQUEST_TAG: request, STRATEGY_TAG: strategy}
    return {tag_key(name_prefix, tag): values[tag] for tag in PLATFORM_TAGS}
