"""Reading the platform config from a CDK context: every problem collected, one per bad key.

Defaults live in cdk.json ("context"); `npx cdk synth -c key=value` overrides one. Values given with -c
arrive as text, which contract.schema.coerce_text turns into JSON values (booleans, numbers, JSON lists
and maps) before the schema engine checks them against PlatformConfig's fields.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import typing
from collections.abc import Mapping
from typing import Any

from contract.errors import Problem
from contract.schema import coerce_text, parse_value
from jobs.naming import MAX_NAME_PREFIX
from jobs.request.image_rules import source_covers
from platform_config.model import AZ_NAME, PlatformConfig
from platform_constructs.network import IPS_PER_EFA_INSTANCE, addresses_needed

_FIELDS = {f.name: f for f in dataclasses.fields(PlatformConfig)}
_HINTS = typing.get_type_hints(PlatformConfig)
# The keys of one training_plans entry (jobs.platform.TrainingPlan's fields): those without a default are required.
_PLAN_FIELDS = dataclasses.fields(_HINTS["training_plans"].__args__[0])
_PLAN_KEYS = sorted(f.name for f in _PLAN_FIELDS)
_PLAN_REQUIRED = {f.name for f in _PLAN_FIELDS if f.default is dataclasses.MISSING}


class PlatformConfigError(ValueError):
    """One or more bad configuration values; `problems` holds one line per bad key, naming it and the fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"Invalid platform configuration (cdk.json context or -c overrides):\n{lines}")

    def __reduce__(self):  # picklable despite the custom __init__ (pytest-xdist)
        return (type(self), (self.problems,))


def is_platform_key(key: str) -> bool:
    """Context keys the CDK itself owns (feature flags, CLI settings) are not ours to check."""
    return not (key.startswith("@") or key.startswith("aws:") or key.startswith("cdk") or ":" in key)


def load_config(context: Mapping[str, Any]) -> PlatformConfig:
    """Parse and validate the platform keys of a CDK context; raise PlatformConfigError listing every problem."""
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, raw in context.items():
        if not is_platform_key(key):
            continue
        if key not in _FIELDS:
            problems.append(_unknown(key))
            continue
        ok, value, message = _read(key, raw)
        if ok:
            values[key] = value
        else:
            problems.append(f"'{key}' = {value!r}: {message}")
    if problems:
        raise PlatformConfigError(problems)
    config = PlatformConfig(**values)
    problems = relation_problems(config)
    if problems:
        raise PlatformConfigError(problems)
    return config


def _unknown(key: str) -> str:
    close = difflib.get_close_matches(key, list(_FIELDS), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(sorted(_FIELDS))}"
    return f"'{key}': unknown key{hint}"


def _read(key: str, raw: Any) -> tuple[bool, Any, str]:
    """(True, value, "") or (False, the value as shown, the first problem's message)."""
    rules = dict(_FIELDS[key].metadata)
    found: list[Problem] = []
    value = coerce_text(_HINTS[key], raw, key, found, rules)
    if found:
        return False, raw, _wording(key, found[0])
    if key == "training_plans" and (message := _plan_shape(value)):
        return False, raw, message
    parsed = parse_value(_HINTS[key], value, key, found, rules)
    if found:
        return False, value, _wording(key, found[0])
    return True, parsed, ""


def _wording(key: str, problem: Problem) -> str:
    """The engine's type messages ("expected an integer, got ...") as what the key must be."""
    message = problem.message
    if message.startswith(("expected ", "is not valid JSON", "must not be null")):
        return f"must be {_FIELDS[key].metadata['expects']}"
    where = problem.path.removeprefix(key)
    return f"{where.lstrip('.')}: {message}" if where else message


def _plan_shape(plans: Any) -> str | None:
    if not isinstance(plans, list):
        return None  # the engine says what it must be
    for i, item in enumerate(plans):
        if not isinstance(item, dict) or not _PLAN_REQUIRED <= set(item) <= set(_PLAN_KEYS):
            return f"entry {i} must have exactly the keys {sorted(_PLAN_REQUIRED)}, and may have " \
                   f"{sorted(set(_PLAN_KEYS) - _PLAN_REQUIRED)}"
    return None


def relation_problems(c: PlatformConfig) -> list[str]:
    """Rules between keys, checked once every key is valid on its own."""
    p: list[str] = []

    def bad(key: str, why: str) -> None:
        p.append(f"'{key}' = {getattr(c, key)!r}: {why}")

    if c.availability_zones:
        if c.region is None:
            bad("availability_zones", "needs 'region' too (synth makes no look-ups)")
        elif not all(AZ_NAME.match(z) and z.startswith(c.region) for z in c.availability_zones):
            bad("availability_zones", f"must be AZ names in {c.region}, e.g. {c.region}a")
        if len(c.availability_zones) != c.az_count:
            bad("availability_zones", f"must list exactly az_count={c.az_count} zones")
    elif c.az_count > 2:
        bad("az_count", "more than 2 AZs needs 'region' and 'availability_zones' listed (synth makes no "
                        "look-ups, and an environment-agnostic stack sees only 2 AZs)")
    needed = addresses_needed(c.az_count, c.private_subnet_mask)
    if needed > ipaddress.ip_network(c.vpc_cidr).num_addresses:
        bad("vpc_cidr", f"is too small: {c.az_count} AZs x a /{c.private_subnet_mask} training subnet "
                        f"(largest_cluster_instances={c.largest_cluster_instances} x {IPS_PER_EFA_INSTANCE} "
                        f"EFA IPs) need {needed} addresses; use a larger block such as /16 or lower "
                        "largest_cluster_instances")
    if c.nat_gateways > c.az_count:
        bad("nat_gateways", f"must be 0 (VPC endpoints only) to az_count={c.az_count}")
    if c.egress == "endpoints" and c.nat_gateways:
        bad("egress", f"'endpoints' leaves the training subnets no route to a NAT gateway: set nat_gateways 0 "
                      f"(now {c.nat_gateways}), or egress 'internet'")
    for plan in c.training_plans:
        where = f"'training_plans' entry {plan.name!r}"
        if c.region and plan.arn.split(":")[3] != c.region:
            p.append(f"{where}: arn is in {plan.arn.split(':')[3]} but the platform is in {c.region}")
        if plan.instance_type not in c.allowed_instance_types:
            p.append(f"{where}: instance_type {plan.instance_type!r} is not in allowed_instance_types "
                     f"{list(c.allowed_instance_types)}")
    p += team_problems(c)
    return p


def team_problems(c: PlatformConfig) -> list[str]:
    """Teams against each other and the platform: names, prefix lengths, instance types, disjoint datasets."""
    p: list[str] = []
    if not c.teams:
        return p  # the default team is the platform itself
    names = [t.name for t in c.teams]
    if c.fsx_enabled:
        p.append(f"'teams' = {names}: FSx for Lustre has no per-team access control (every job that mounts it "
                 "reads every dataset on it), so teams need 'fsx_enabled' false; jobs read their team's datasets "
                 "from S3 (input_mode File or FastFile)")
    for team, spec in zip(c.teams, c.team_specs, strict=True):
        where = f"'teams' entry {team.name!r}"
        if names.count(team.name) > 1:
            p.append(f"{where}: name is declared {names.count(team.name)} times; team names must be unique")
        if len(spec.name_prefix) > MAX_NAME_PREFIX:
            p.append(f"{where}: its prefix {spec.name_prefix!r} has {len(spec.name_prefix)} characters; the "
                     f"most is {MAX_NAME_PREFIX} (it starts job names, capped at 63): shorten the team name or "
                     "name_prefix")
        extra = [t for t in team.allowed_instance_types if t not in c.allowed_instance_types]
        if extra:
            p.append(f"{where}: allowed_instance_types {extra} are not in the platform's allowed_instance_types "
                     f"{list(c.allowed_instance_types)}")
        for other in c.team_specs:
            if other.name != spec.name and spec.dataset_prefix.startswith(other.dataset_prefix):
                p.append(f"{where}: dataset_prefix {spec.dataset_prefix!r} lies inside team {other.name!r}'s "
                         f"{other.dataset_prefix!r}, so each could read the other's data; give every team a "
                         "prefix of its own, e.g. teams/<name>/")
        p += _repository_overlaps(where, team, c.teams)
    return p


def _repository_overlaps(where: str, team, teams) -> list[str]:
    """A team's own repositories that cover another team's (the same one, a repository path or a whole registry over
    it, as jobs.request.image_rules.source_covers reads a request's image): the other team's images would then run
    as this team's role, with its data. Shared repositories belong in the platform's allowed_image_repositories,
    which every team may use."""
    return [f"{where}: allowed_image_repositories entry {mine!r} covers team {other.name!r}'s {theirs!r}, so either "
            "team's image could run as the other's role; give each team repositories of its own, or move a shared "
            "one to the platform's allowed_image_repositories"
            for other in teams if other.name != team.name
            for mine in team.allowed_image_repositories for theirs in other.allowed_image_repositories
            if source_covers(mine, theirs)]
