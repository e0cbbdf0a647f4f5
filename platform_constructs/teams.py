"""Teams: how one platform is shared by several ML teams whose runs IAM keeps apart.

Every name a team's resources carry starts with its *team prefix*, `<platform name_prefix>--<team>`: its
training jobs (`<team prefix>-<run>-...`), its checkpoint and output keys (`<team prefix>/<run>/...`), its SSM
parameters (`/<team prefix>/...`), its state machine, its engineers' policy, and the tag keys the renderer writes
on every job (`<team prefix>:run-id`, jobs.naming.run_id_tag_key). IAM policies name those prefixes, so they must never overlap:

- a team name is 1-12 lowercase letters or digits, no hyphen: `mltrain--a-*` then never matches team `ab`'s
  jobs (`mltrain--ab-...`), as a team named `a-b` would;
- the separator is a double hyphen, and a platform's name_prefix may not contain one (platform_config): no
  platform's own names (`mltrain-dev-...`, or a platform without teams, `mltrain-<request name>-...`, whose
  request-name slug never starts with a hyphen) can start with another platform's team prefix `mltrain--a-`;
- S3 keys and SSM paths end the prefix with `/`, so `mltrain--a/` and `mltrain--ab/` are disjoint too.

A platform that declares no teams has one default team whose prefix is the platform's name_prefix itself: its
job names, checkpoint prefixes (`<bucket>/<name_prefix>/<run id>/...`) and parameters stay where they were, so
existing runs resume. Its job-name pattern (`mltrain-*`) does overlap another platform named `mltrain-dev`;
the tag conditions on the `<prefix>:run-id` key (which only this platform's launcher writes) close that gap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from contract.schema import meta
from jobs.naming import TEAM_TAG, tag_key
from jobs.platform import image_repositories_problem

TEAM_NAME = re.compile(r"^[a-z0-9]{1,12}$")
ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")


def team_tags(platform_prefix: str, team: str | None) -> dict[str, str]:
    """The cost allocation tag every job of `team` carries (PlatformSettings.job_tags): one key for the whole
    platform, `<platform prefix>:team`, so the platform team activates it once in the Billing console and each
    team's budget filters the bill on its value. The default team carries none (its jobs are the platform's)."""
    return {} if team is None else {tag_key(platform_prefix, TEAM_TAG): team}


def _team_name(name: str) -> str | None:
    return None if TEAM_NAME.match(name) else (
        "must be 1-12 lowercase letters or digits (no hyphen: a team's names must never start with another "
        "team's prefix)")


def _role_arns(arns: tuple[str, ...]) -> str | None:
    bad = [a for a in arns if not ROLE_ARN.match(a)]
    return f"entry {bad[0]!r}: must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)" if bad else None


def _prefix(text: str | None) -> str | None:
    if text is None:
        return None
    if text.startswith("/") or not text.endswith("/") or " " in text or "*" in text:
        return "must be an S3 key prefix ending in '/' with no leading '/' and no '*', e.g. datasets/vision/"
    return None


@dataclass(frozen=True)
class Team:
    """One team of the `teams` config key: its name, who its engineers are, its data and its limits."""

    name: str = field(metadata=meta("1-12 lowercase letters or digits; its names start with "
                                    "<name_prefix>--<name>", check=_team_name))
    engineer_roles: tuple[str, ...] = field(default=(), metadata=meta(
        "IAM role ARNs of the team's engineers, in the platform's account: the team's engineers' policy is attached "
        "to them (empty: the platform team attaches the published policy itself)", check=_role_arns))
    dataset_prefix: str | None = field(default=None, metadata=meta(
        "the dataset bucket's key prefix the team's jobs may read (null: <dataset_prefix><name>/)",
        check=_prefix))
    allowed_instance_types: tuple[str, ...] = field(default=(), metadata=meta(
        "instance types the team's requests may use, a subset of the platform's (empty: the platform's)"))
    allowed_image_repositories: tuple[str, ...] = field(default=(), metadata=meta(
        "the team's own ECR repositories its requests' `image` may come from, on top of the platform's "
        "allowed_image_repositories; only the team's execution role may pull them", check=image_repositories_problem))
    monthly_budget_usd: float | None = field(default=None, metadata=meta(
        "an AWS Budgets monthly cost budget on the team's jobs (their `<name_prefix>:team` cost allocation tag): "
        "its run notifications topic hears at 80% actual and 100% forecast (null: none)", min=1))


@dataclass(frozen=True)
class TeamSpec:
    """What the stacks build one team from: the resolved values (no defaults left to derive).

    `name` None is the default team of a platform that declares none (prefix = the platform's name_prefix).
    """

    name: str | None
    name_prefix: str
    dataset_prefix: str
    allowed_instance_types: tuple[str, ...]
    # ECR repositories (`<registry>/<repo>` or `<registry>/`) the team's jobs may pull, beyond the AWS images.
    image_repositories: tuple[str, ...]
    engineer_roles: tuple[str, ...] = ()
    job_tags: dict[str, str] = field(default_factory=dict)  # team_tags: on every job of the team
    monthly_budget_usd: float | None = None
    # Its own KMS key and checkpoint and output buckets (platform config `team_keys`): only its roles may decrypt
    # what its jobs write, whatever an S3 permission says (platform_constructs.encryption.TeamKey).
    own_key: bool = False

    @property
    def construct_id(self) -> str:
        """The id of the team's constructs: the default team's keep the ids they had before teams existed."""
        return "" if self.name is None else f"Team{self.name}"
